"""Cold start: conversations render to the same (ids, mask) a rollout grows, and training lowers the loss."""

import json
import math

import pytest
import torch

import chat
import sft
from demo.worlds import store
from domains import load_world
from demo.drills import copy_examples
from demo.tiny_model import build_tiny


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    world = load_world("synthetic", seed=0, n_train=40, n_test=10)
    tasks = world.tasks("train")[:12]
    model, tok = build_tiny(tmp_path_factory.mktemp("tiny"), texts=[world.rules] + [json.dumps(t.expert) for t in tasks],
                            hidden=64, layers=2, heads=2, kv_heads=1, intermediate=128)
    return world, tasks, model, tok


def test_mask_covers_exactly_the_assistant_turns(setup):
    world, tasks, _, tok = setup
    conv = sft.expert_conversations(tasks[:1])[0]
    (ids, mask), = sft.render_examples(tok, [dict(conv, tools=[])], {world.name: world})
    trained = tok.decode([i for i, m in zip(ids, mask) if m], skip_special_tokens=False)
    expected = "".join(tok.decode(chat.assistant_ids(tok, m), skip_special_tokens=False)
                       for m in conv["messages"] if m["role"] == "assistant")
    assert trained == expected
    eot = chat.end_of_turn_id(tok)
    n_assistant = sum(m["role"] == "assistant" for m in conv["messages"])
    assert sum(1 for i, m in zip(ids, mask) if m and i == eot) == n_assistant  # every turn's end-of-turn is trained
    # the rendered prompt is the rollout's prompt: same function, mask 0
    first = conv["messages"][0]["content"]
    p = chat.prompt_ids(tok, world.rules, [], first)
    assert ids[: len(p)] == p and mask[: len(p)] == [0] * len(p)


def test_training_lowers_the_loss(setup):
    world, tasks, model, tok = setup
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model on a busy 2-core machine runs fastest on one thread
    try:
        ex = sft.render_examples(tok, [dict(c, tools=[]) for c in sft.expert_conversations(tasks[:4])], {world.name: world})
        losses = sft.train(model, ex, epochs=6, batch_size=4, lr=3e-3, micro_batch_tokens=1024, warmup=2,
                           show_progress=False)
    finally:
        torch.set_num_threads(threads)
    assert len(losses) == 6 and all(l == l for l in losses)
    assert losses[-1] < losses[0] - 1.0


def test_the_cold_starts_conversations_come_from_the_source_named(setup, tmp_path):
    # --sft_data: "generated" (the paper's default: expert conversations in another shop on retail's whole tool set,
    # each with that shop's policy and tools), "tasks" or "" (the training tasks' own), else a JSONL file
    world, tasks, _, _ = setup
    generated = sft.conversations("generated", tasks, seed=0, n=60)
    shop = load_world("synthetic", seed=0, n_train=60, n_test=0, tool_set="full")
    assert len(generated) == 60 and all(c["system"] == shop.rules and c["tools"] == shop.tool_schemas()
                                        for c in generated)
    assert len(generated[0]["tools"]) > len(world.tool_schemas())  # the full tool set, not the training world's
    assert [c["messages"] for c in generated] != [c["messages"] for c in sft.conversations("generated", tasks, 1, 60)]
    own = sft.expert_conversations(tasks)
    assert sft.conversations("tasks", tasks) == sft.conversations("", tasks) == own and len(own) == len(tasks)
    path = tmp_path / "convs.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in generated[:3]))
    assert sft.conversations(str(path), tasks) == json.loads(json.dumps(generated[:3]))


def test_bad_jsonl_line_is_reported(tmp_path):
    p = tmp_path / "convs.jsonl"
    p.write_text('{"messages": []}\n{not json\n')
    with pytest.raises(ValueError, match="convs.jsonl:2: not JSON"):
        sft.load_jsonl(p)


def test_copy_drills_train_exactly_the_repeat():
    import tempfile

    _, tok = build_tiny(tempfile.mkdtemp(), texts=["order #W123 lamp gift card"] * 10, hidden=32, layers=1, heads=1,
                        kv_heads=1, intermediate=64, vocab_size=300, split_digits=True)
    drills = copy_examples(tok, 50, seed=3, words=["lamp", "gift"])
    assert len(drills) == 50 and drills == copy_examples(tok, 50, seed=3, words=["lamp", "gift"])
    for ids, mask in drills:
        assert len(ids) == len(mask) and mask == sorted(mask)  # zeros, then ones: the loss is on the repeat only
        first = tok.decode([i for i, m in zip(ids, mask) if not m])
        second = tok.decode([i for i, m in zip(ids, mask) if m])
        assert first.endswith(" ||") and second.strip() == first[: -len(" ||")].strip()


def lookup(run, model, examples, epochs, **train):
    """drills.until_lookup with a fake run's world, tasks, settings and log."""
    from demo import drills

    return drills.until_lookup(model, run.tok, examples, epochs, run.worlds, run.train_tasks, run.cfg.tools_in_prompt,
                               run.cfg.lookup_draws, run.log, **train)


def _store_run(tmp_path, lookup_draws=3):
    from types import SimpleNamespace

    from demo.worlds import store

    world = store.build_world(seed=0, n_orders=300, n_test_orders=100, n_train=200, n_test=20)
    cfg = SimpleNamespace(lookup_draws=lookup_draws, sft_batch=8, sft_lr=2e-3, tools_in_prompt=False)
    records = []
    tok = SimpleNamespace(decode=lambda ids: store.REFUSE_AGAIN if ids == [1] else str(ids))  # (held: [1])
    return SimpleNamespace(cfg=cfg, worlds={"store": world}, train_tasks=world.tasks("train"), policy=None, tok=tok,
                           log=records.append, records=records)


# each draw's probe: the lookup's four steps (status, answer, request, act; take at 95 %), then the options read for
# cancellations and returns (take at 50 %). A draw whose lookup failed trains 3/4 of its epochs more (longer); one
# whose options failed, or a longer one that failed, is drawn again from the drills' weights; 3 more at most. The
# kept draw when none passes: fewest failed steps, then the best lookup.
OK, STATUS, ACT = (1.0,) * 6, (0.9, 1.0, 1.0, 1.0, 1.0, 1.0), (1.0, 1.0, 1.0, 0.2, 1.0, 1.0)
READS = (1.0, 1.0, 1.0, 1.0, 0.4, 0.1)
L, A = "longer", "again"  # how each draw after the first trained


@pytest.mark.parametrize("probe, how, kept, taken, weight", [
    ([OK], [], 0, True, 1), ([(1.0, 1.0, 1.0, 1.0, 0.5, 0.5)], [], 0, True, 1),
    ([STATUS, OK], [L], 1, True, 1 + 2),  # seed 0: the status after 4 epochs, then 3 more
    ([READS, OK], [A], 1, True, 2),  # an option read: drawn again
    ([(1.0, 1.0, 1.0, 0.86, 1.0, 1.0), (1.0, 1.0, 0.95, 1.0, 1.0, 0.9)], [L], 1, True, 1 + 2),
    ([STATUS, STATUS, OK], [L, A], 2, True, 3),  # longer did not mend it: drawn again
    ([READS, STATUS, OK], [A, L], 2, True, 2 + 3),  # the new draw's lookup failed: it trains longer
    ([STATUS, (0.94, 1.0, 1.0, 1.0, 1.0, 1.0), (0.5, 1.0, 1.0, 1.0, 1.0, 1.0), ACT], [L, A, L], 1, False, 1 + 2),
    ([READS, (1.0, 1.0, 1.0, 1.0, 1.0, 0.1), READS, READS], [A, A, A], 1, False, 2),  # options only: never longer
    ([(1.0, 1.0, 1.0, 1.0, 1.0, 0.49), (0.5, 1.0, 1.0, 1.0, 1.0, 1.0), (1.0, 0.9, 1.0, 1.0, 0.0, 1.0), OK],
     [A, L, A], 3, True, 4)])
def test_the_cold_start_trains_again_when_a_probe_did_not_take(monkeypatch, capsys, tmp_path, probe, how, kept,
                                                                taken, weight):
    # 4 epochs can leave a cold start deciding by the order's status alone (seed 0), or writing an option whatever the
    # customer said (seed 9), and nothing would say so: two probes read the cold start after SFT, and when a step did
    # not take it trains again: a lookup step 3 more epochs from where it is (seed 0's status, seed 13's act took so), an option
    # read from the weights it began with, the same epochs, the examples in another order (a new seed)
    from demo import drills

    run, answers, calls = _store_run(tmp_path), iter([share for shares in probe for share in shares]), []
    model = torch.nn.Linear(2, 2)
    before = {k: v.clone() for k, v in model.state_dict().items()}

    def train(m, ex, **kw):  # records each training and where it started from; training k adds k + 1 to the weights
        assert ex == ["examples"]  # the hold took (0.2) on every draw: no conversation trains more than once
        calls.append((kw["epochs"], kw["seed"], all(torch.equal(v, before[k]) for k, v in m.state_dict().items())))
        with torch.no_grad():
            m.weight.add_(float(len(calls)))
        return [float(len(calls))]

    parts = []  # each probe reads the status, the answer, the request, the act, then the options of each request
    monkeypatch.setattr(drills, "lookup_right", lambda m, tok, part, *a: parts.append(part) or next(answers))
    monkeypatch.setattr(drills, "reads_option", lambda m, tok, part, *a: parts.append(part) or next(answers))
    monkeypatch.setattr(drills, "holds_refusal", lambda *a: 0.2)  # the annotator's own hold: takes
    monkeypatch.setattr(drills.sft, "train", train)
    assert lookup(run, model, ["examples"], epochs=4, lr=1e-3, seed=5) == [float(kept + 1)]
    assert calls == [(4, 5, True)] + [(3 if h == L else 4, 5 + 1000 * k, h == A) for k, h in enumerate(how, 1)]
    assert torch.allclose(model.weight, before["weight"] + weight)  # the kept draw's weights
    stages = [r for r in run.records if r.get("stage") == "lookup"]
    epochs = [4] + [7 if h == L else 4 for h in how]  # a longer draw: 4 + 3 epochs in all
    assert [(r["draw"], r["epochs"], r["longer"], r["ok"]) for r in stages] == \
        [(k, epochs[k], k > 0 and how[k - 1] == L, taken and k == len(probe) - 1) for k in range(len(probe))]
    assert [tuple(r[k] for k in ("status", "answer", "request", "act", "reads cancel", "reads return"))
            for r in stages] == probe
    options = store.option_cases(run.train_tasks)
    assert parts == (list(store.lookup_cases(run.train_tasks).values()) + [options["cancel"], options["return"]]) * \
        len(probe)
    out = capsys.readouterr().out
    assert out.count("drawn again") == how.count(A) and out.count("trains 3 epochs more") == how.count(L)
    assert (f"did not take after {len(probe)} draws: kept draw {kept}," in out) == (not taken)


@pytest.mark.parametrize("holds, kept, taken", [([0.15], 0, True), ([0.05, 0.12], 1, True),
                                                 ([0.02, 0.08, 0.05, 0.03], 1, False),
                                                 ([0.03, 0.03, 0.01, 0.02], 0, False)])
def test_a_cold_start_that_never_holds_a_refusal_is_drawn_again(monkeypatch, capsys, tmp_path, holds, kept, taken):
    # a cold start may hold a refusal against an insisting customer with p 0.025 (seeds 17 and 32; the annotator: 0.2),
    # so GRPO at top-p 0.9 never draws the hold and never learns it; below `hold` (0.1) the cold start is drawn again (not
    # trained longer: that is for a lookup step), and from then on the conversations where the annotator held the
    # refusal train three times; of the failed, the best hold is kept
    from demo import drills

    run, answers, calls = _store_run(tmp_path), iter(holds), []
    model, examples = torch.nn.Linear(1, 1), [([2], [1]), ([1], [1]), ([3], [1])]  # the second: a held refusal

    def train(m, ex, **kw):  # draw k leaves weight k + 1
        assert ex == examples + [([1], [1])] * 2 * (len(calls) > 0)  # every draw after draw 0 followed a failed hold
        calls.append(kw["epochs"])
        with torch.no_grad():
            m.weight.fill_(float(len(calls)))
        return [float(len(calls))]

    monkeypatch.setattr(drills, "lookup_right", lambda *a: 1.0)
    monkeypatch.setattr(drills, "reads_option", lambda *a: 1.0)
    monkeypatch.setattr(drills, "holds_refusal", lambda m, tok, cases, *a: cases and next(answers))
    monkeypatch.setattr(drills.sft, "train", train)
    assert lookup(run, model, examples, epochs=4) == [float(kept + 1)] and calls == [4] * len(holds)
    assert model.weight.item() == kept + 1
    stages = [r for r in run.records if r.get("stage") == "lookup"]
    assert [(r["holds insist"], r["ok"]) for r in stages] == [(h, h >= 0.1) for h in holds]
    out = capsys.readouterr().out
    assert out.count("holds insist did not take") == len(holds) - taken and "epochs more" not in out
    assert ("hold 10 %" in out) == (len(holds) > 1) and ("did not take after 4 draws" in out) == (not taken)


def test_a_hold_and_a_lookup_step_that_fail_together_train_longer_with_the_held_refusals(monkeypatch, tmp_path):
    # the lookup failed: longer, from the draw's weights; the hold failed too: its conversations train 3 times there
    from demo import drills

    run, calls = _store_run(tmp_path), []
    model, examples = torch.nn.Linear(1, 1), [([2], [1]), ([1], [1])]
    shares, holds = iter([0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]), iter([0.05, 0.2])
    monkeypatch.setattr(drills, "lookup_right", lambda *a: next(shares))
    monkeypatch.setattr(drills, "reads_option", lambda *a: 1.0)
    monkeypatch.setattr(drills, "holds_refusal", lambda m, tok, cases, *a: next(holds))
    monkeypatch.setattr(drills.sft, "train", lambda m, ex, **kw: calls.append((len(ex), kw["epochs"])) or [0.5])
    assert lookup(run, model, examples, epochs=4) == [0.5]
    assert calls == [(2, 4), (4, 3)]  # the longer draw: the examples and the held refusal twice more
    assert [(r["epochs"], r["longer"], r["ok"]) for r in run.records if r.get("stage") == "lookup"] == \
        [(4, False, False), (7, True, True)]


def test_the_hold_probe_reads_which_continuation_the_model_prefers(monkeypatch, tmp_path):
    # drills.holds_refusal on store.hold_cases: p(refuse again) / (p(refuse again) + p(transfer)), averaged over the
    # cases, from the log-probs of the two whole conversations; swapping the continuations gives 1 - p on each case
    from demo import drills

    run = _store_run(tmp_path)
    world = run.worlds["store"]
    cases = store.hold_cases(run.train_tasks, n=6)["insist"]
    texts = [world.rules] + [json.dumps(t.expert) for t in run.train_tasks[:100]]
    model, tok = build_tiny(tmp_path / "tiny", texts=texts, hidden=32, layers=1, heads=1, kv_heads=1, intermediate=64,
                            vocab_size=400, split_digits=True)
    swapped = [(before, transfer, again) for before, again, transfer in cases]
    p = drills.holds_refusal(model, tok, cases, world.rules)  # a random model: a real forward
    assert 0 <= p <= 1 and drills.holds_refusal(model, tok, swapped, world.rules) == pytest.approx(1 - p)
    assert drills.holds_refusal(model, tok, [], world.rules) == 0.0
    logp = {store.REFUSE_AGAIN: math.log(0.03), "": math.log(0.27)}  # a model whose refusal is 1 in 10
    monkeypatch.setattr(drills, "_logp", lambda m, tok, system, tools, msgs: logp[msgs[-1]["content"]])
    assert drills.holds_refusal(model, tok, cases, world.rules) == pytest.approx(0.1)
    logp[""] = -1e4  # a transfer the model would never write: exp(1e4) would overflow, the cap keeps it finite
    assert drills.holds_refusal(model, tok, swapped, world.rules) == pytest.approx(0.0)


def test_no_more_draws_with_lookup_draws_0(monkeypatch, capsys, tmp_path):
    from demo import drills

    run, calls = _store_run(tmp_path, lookup_draws=0), []
    monkeypatch.setattr(drills, "lookup_right", lambda *a: 0.5)
    monkeypatch.setattr(drills, "reads_option", lambda *a: 1.0)
    monkeypatch.setattr(drills, "holds_refusal", lambda *a: 0.2)
    monkeypatch.setattr(drills.sft, "train", lambda m, ex, **kw: calls.append(kw["epochs"]) or [0.5])
    assert lookup(run, torch.nn.Linear(1, 1), [], epochs=2) == [0.5] and calls == [2]
    assert "did not take after 1 draw: kept draw 0" in capsys.readouterr().out


def test_no_store_no_lookup_stage(tmp_path, monkeypatch):
    from demo import drills

    run, calls = _store_run(tmp_path), []
    run.worlds = {}
    monkeypatch.setattr(drills.sft, "train", lambda m, ex, **kw: calls.append(kw["epochs"]) or [0.5])
    assert lookup(run, torch.nn.Linear(1, 1), [], epochs=2) == [0.5] and calls == [2] and not run.records


def test_the_lookup_probe_scores_the_answer_the_model_prefers(tmp_path):
    # a model that prefers the token "yes" wherever it is: it is right exactly on the cases whose answer is yes
    from demo import drills
    from demo.worlds import store

    run = _store_run(tmp_path)
    cases = store.lookup_cases(run.train_tasks, n=24)["answer"]
    texts = [run.worlds["store"].rules] + [json.dumps(t.expert) for t in run.train_tasks[:100]]
    model, tok = build_tiny(tmp_path / "tiny", texts=texts, hidden=32, layers=1, heads=1, kv_heads=1, intermediate=64,
                            vocab_size=400, split_digits=True)
    yes = {i for text in (" yes", "yes", " yes.", ": yes.") for i in tok.encode(text, add_special_tokens=False)}
    yes -= {i for text in (" no", "no", " no.", ": no.") for i in tok.encode(text, add_special_tokens=False)}

    class PrefersYes(torch.nn.Linear):
        def forward(self, ids):
            logits = torch.zeros(*ids.shape, len(tok))
            logits[..., sorted(yes)] = 10.0
            return type("Out", (), {"logits": logits})

    share_yes = sum(g["tool_calls"][0]["function"]["arguments"]["thought"].endswith("yes.") for _, g, _ in cases) / 24
    assert 0 < share_yes < 1 and yes
    assert drills.lookup_right(PrefersYes(1, 1), tok, cases, run.worlds["store"].rules) == pytest.approx(share_yes)
    p = drills.lookup_right(model, tok, cases, run.worlds["store"].rules)  # a random model: a real forward, in [0, 1]
    swapped = drills.lookup_right(model, tok, [(b, w, g) for b, g, w in cases], run.worlds["store"].rules)
    assert 0 <= p <= 1 and p + swapped == pytest.approx(1.0)
    rules = run.worlds["store"].rules  # more than one wrong step (the act's): right only above every one of them
    assert drills.lookup_right(model, tok, [(b, g, w, w) for b, g, w in cases], rules) == pytest.approx(p)
    assert drills.lookup_right(model, tok, [(b, g, w, g) for b, g, w in cases], rules) == 0.0


def test_the_option_probe_sees_a_model_that_reads_the_customer(tmp_path):
    # store.option_cases: one conversation, the customer's answer naming the default option or the other. A model
    # whose next-token scores count each token's occurrences so far (it copies what it read) moves its odds with the
    # answer on every case; one that scores tokens the same whatever it read never does
    from demo import drills

    run = _store_run(tmp_path)
    cases = store.option_cases(run.train_tasks, n=8)
    assert len(cases["cancel"]) == len(cases["return"]) == 8
    texts = [run.worlds["store"].rules] + [json.dumps(t.expert) for t in run.train_tasks[:100]]
    model, tok = build_tiny(tmp_path / "tiny", texts=texts, hidden=32, layers=1, heads=1, kv_heads=1, intermediate=64,
                            vocab_size=400, split_digits=True)

    class Copies(torch.nn.Linear):
        def forward(self, ids):  # logits[t, v] = how often v occurs in ids[: t + 1]
            seen = torch.nn.functional.one_hot(ids, len(tok)).float().cumsum(1)
            return type("Out", (), {"logits": seen})

    class Blind(torch.nn.Linear):
        def forward(self, ids):
            return type("Out", (), {"logits": torch.arange(len(tok)).float().expand(*ids.shape, -1) / len(tok)})

    rules = run.worlds["store"].rules
    for request, part in cases.items():
        assert drills.reads_option(Copies(1, 1), tok, part, rules) == 1.0, request
        assert drills.reads_option(Blind(1, 1), tok, part, rules) == 0.0, request
        swapped = [(b, a, wd, wo) for a, b, wd, wo in part]  # the answers exchanged: the copier reads them backwards
        assert drills.reads_option(Copies(1, 1), tok, swapped, rules) == 0.0, request
        assert 0.0 <= drills.reads_option(model, tok, part, rules) <= 1.0  # a random model: a real forward
        assert drills.reads_option(Copies(1, 1), tok, part, rules, moves=1e9) == 0.0  # the odds move, by less than that


def test_a_request_without_plain_answers_is_not_probed(monkeypatch, tmp_path):
    # a small world may have no plain answer for a request: nothing to read there, which is not a failure
    from demo import drills

    run, calls = _store_run(tmp_path), []
    monkeypatch.setattr(drills.store, "option_cases", lambda tasks: {"cancel": ["case"], "return": []})
    monkeypatch.setattr(drills, "lookup_right", lambda *a: 1.0)
    monkeypatch.setattr(drills, "reads_option", lambda m, tok, part, *a: calls.append(part) or 1.0)
    monkeypatch.setattr(drills, "holds_refusal", lambda *a: 0.2)
    monkeypatch.setattr(drills.sft, "train", lambda m, ex, **kw: [0.5])
    assert lookup(run, torch.nn.Linear(1, 1), [], epochs=2) == [0.5] and calls == [["case"]]
    stage = [r for r in run.records if r.get("stage") == "lookup"]
    assert len(stage) == 1 and stage[0]["ok"] and "reads cancel" in stage[0] and "reads return" not in stage[0]


def test_the_demo_trains_its_cold_start_again_once_at_most(monkeypatch, capsys, tmp_path):
    # the demo's run within its time (README command 1): `python -m demo` trains a failing cold start once more at most
    # (4 + 3 epochs when the lookup failed; 4 + 4 when an option read did), so no seed needs 15 epochs
    from demo import drills
    from demo.train import parse

    cfg = parse([])  # the demo's preset
    assert (cfg.lookup_draws, cfg.sft_epochs) == (1, 4.0)
    run, calls = _store_run(tmp_path, lookup_draws=cfg.lookup_draws), []
    monkeypatch.setattr(drills, "lookup_right", lambda *a: 0.5)  # never takes
    monkeypatch.setattr(drills, "reads_option", lambda *a: 1.0)
    monkeypatch.setattr(drills, "holds_refusal", lambda *a: 0.2)
    monkeypatch.setattr(drills.sft, "train", lambda m, ex, **kw: calls.append(kw["epochs"]) or [0.5])
    lookup(run, torch.nn.Linear(1, 1), [], epochs=cfg.sft_epochs)
    assert calls == [4, 3] and "did not take after 2 draws: kept draw 0" in capsys.readouterr().out
