"""The demo's research probes (demo/probes/): each reads a CPU-demo run, or the worlds its seeds make, and prints a
table; each test feeds one a small run folder built here and checks its table, or its one-line refusal of a folder
that is not a run."""

import json
import subprocess
import sys

import pytest
import torch

from conftest import REPO
from demo.worlds import shop, store
from demo.tiny_model import build_tiny

PROBES = REPO / "demo" / "probes"
sys.path.insert(0, str(PROBES))  # the probes are scripts: each imports as its file's name


def test_probe_decision_reads_p_refuse_per_request_and_status(tmp_path):
    # A run folder as the store's evaluation writes it: a model folder and transcripts (here the held-out tasks'
    # correct conversations, the thought included, and a random tiny model): one p(refuse) per conversation that
    # looked an order up, a probability, grouped by (request, status); a run without them is one line, exit 1.
    world = store.build_world(0, n_orders=60, n_test_orders=20, n_train=10, n_test=12)
    build_tiny(tmp_path / "cold-start", texts=[world.rules] + [json.dumps(t.expert) for t in world.tasks()],
               hidden=32, layers=1, heads=1, kv_heads=1, intermediate=64, vocab_size=300)
    with open(tmp_path / "episodes-rank0.jsonl", "w") as f:
        for t in world.tasks("test"):
            msgs = [{"role": "system", "content": world.rules}] + t.expert
            f.write(json.dumps({"phase": "eval", "name": "cold start", "task_id": t.id, "messages": msgs}) + "\n")
    from probe_decision import probe

    res = probe(tmp_path, "cold-start", "cold start")
    spoke = [t for t in world.tasks("test") if any(m["role"] == "assistant" and not m.get("tool_calls")
                                                  for m in t.expert[2:])]
    assert sum(map(len, res.values())) == len(spoke) > 0
    assert set(res) == {(t.spec["request"], t.spec["status"]) for t in spoke}
    assert all(0.0 <= p <= 1.0 for ps in res.values() for p in ps)
    proc = subprocess.run([sys.executable, str(PROBES / "probe_decision.py"), str(tmp_path / "none")],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "has no cold-start/" in proc.stderr and "Traceback" not in proc.stderr


def test_compare_customers_cells_are_eval_commands_of_each_runs_own_world(tmp_path):
    # the comparison of customers: each cell is eval.py on the run's final model, its world and limits, against a
    # customer; each cell's command line is one eval.py takes (its flags are muarl's: --domains, --eval_trials)
    import compare_customers as cc

    from demo import SHIPPED
    from evaluation.flags import parse_args

    run, other = tmp_path / "llm-1", tmp_path / "B"
    for model in (run / "final", other):  # model folders, as eval.py's parse sees them
        model.mkdir(parents=True)
        (model / "config.json").write_text("{}")
    # a demo run's saved settings: its customer served from the shipped model's folder, 2 trials an evaluation
    saved = {"domains": "store", "user": "llm", "user_serve": str(SHIPPED), "seed": 1, "synthetic_seed": 1,
             "tools_in_prompt": False, "max_turns": 10, "max_new_tokens": 64, "max_context": 1024, "eval_trials": 2}
    (run / "config.json").write_text(json.dumps(saved))
    script, own, held = (cc.cell_argv(run, c, str(other)) for c in cc.COLUMNS)
    for argv in (script, own, held):
        assert argv[argv.index("--model") + 1] == str(run / "final") and argv[argv.index("--synthetic_seed") + 1] == "1"
        a = parse_args(argv)
        assert (a.model, a.domains, a.synthetic_seed, a.seed, a.max_turns, a.max_new_tokens, a.max_context,
                bool(a.tools_in_prompt), a.temperature) == (str(run / "final"), "store", 1, 1, 10, 64, 1024, False, 0.0)
    assert (parse_args(script).user, parse_args(script).eval_trials) == ("scripted", 1)  # a script: one trial
    assert own[-2:] == ["--user_serve", str(SHIPPED)] and held[-2:] == ["--user_serve", str(other)]
    for argv in (own, held):  # a served customer samples: 2 trials
        a = parse_args(argv)
        assert (a.user, a.user_temperature, a.eval_trials) == ("llm", 0.7, 2) and "--eval_trials" in argv
    (run / "config.json").write_text(json.dumps({**saved, "user": "sampled"}))
    sampled = cc.cell_argv(run, "its training customer", str(other))
    assert sampled[-4:] == ["--user", "sampled", "--eval_trials", "2"] and parse_args(sampled).eval_trials == 2
    text = cc.table({("the script", "the script"): [(0, 0.5, 1.0), (1, 0.7, 0.99)],
                     ("the LLM customer", "a held-out customer"): [(0, 0.8, 0.97)]})
    assert "| the script | 60.0 +- 14.1 (n=2; fidelity 99.0-100.0 %) | not run | not run |" in text
    assert "| the LLM customer | not run | not run | 80.0 (n=1; fidelity 97.0-97.0 %) |" in text
    diff = cc.paired({("the script", "a held-out customer"): [(0, 0.5, 1.0), (1, 0.7, 0.9), (2, 0.6, 1.0)],
                      ("the LLM customer", "a held-out customer"): [(0, 0.8, 0.97), (1, 0.6, 0.9)]})
    assert "| the LLM customer - the script | no seed in both | no seed in both | +30.0, -10.0 (seeds 0, 1; mean " \
           "+10.0) |" in diff  # seed by seed, only the seeds both rows ran
    shares = cc.broken({("the sampled script", "a held-out customer"): [0.1, 0.2, 0.3]})
    assert "| the sampled script | not run | not run | 20.0 % (10.0-30.0) |" in shares


def test_fidelity_split_separates_conversations_with_other_agent_text(tmp_path):
    # demo/probes/fidelity_split.py: the in-loop fidelity of a run's evaluations, split by whether every agent text was a
    # policy line (any id, any status) or not; an episode that is not an evaluation's is left out.
    from fidelity_split import policy_line

    refuse = shop.REFUSE["return"].format("#W113", "pending")
    assert policy_line(store.ASK_ID) and policy_line(refuse) and policy_line(shop.DONE["cancel"].format("#W7"))
    assert not policy_line('I am sorry, but the policy do thir", "arguments": {"sum') and not policy_line(refuse + " x")

    def episode(texts, mistakes, phase="eval", name="GRPO step 10"):
        msgs = [{"role": "user", "content": "Hi, return #W113."}, {"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "get_order_details", "arguments": {"order_id": "#W113"}}}]}]
        msgs += [{"role": "assistant", "content": t} for t in texts]
        return {"phase": phase, "name": name, "info": {"customer_mistakes": mistakes}, "messages": msgs}

    run = tmp_path / "run"
    run.mkdir()
    rows = [episode([refuse], []), episode([refuse, store.REFUSE_AGAIN], ["no_human"]),
            episode([refuse, 'I am sorry, but the policy do thir", "arg'], ["extra_insist"]),
            episode(["Sorry, order #W1 is is is"], []), episode(["garbled"], ["gibberish"], phase="step")]
    (run / "episodes-rank0.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = subprocess.run([sys.executable, str(PROBES / "fidelity_split.py"), str(run)], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "| GRPO step 10 | 50.0 % of 4 | 50.0 % of 2 | 50.0 % of 2 |" in out.stdout, out.stdout
    assert out.stdout.strip().splitlines()[-1].startswith("lowest in-loop fidelity: 50.0 %")
    missing = subprocess.run([sys.executable, str(PROBES / "fidelity_split.py"), str(tmp_path / "none")],
                             cwd=REPO, capture_output=True, text=True, timeout=120)
    assert missing.returncode == 1 and "not found" in missing.stderr and "Traceback" not in missing.stderr


def test_gate_worlds_plays_each_runs_own_gate_tasks(tmp_path):
    # demo/probes/gate_worlds.py: README command 1's world for each seed, and the held-out tasks its gate plays
    from gate_worlds import run_tasks, seeds_of

    assert seeds_of("0-3,9") == [0, 1, 2, 3, 9] and seeds_of("5") == [5]
    cfg, tasks = run_tasks(3)
    from demo import SHIPPED

    # the demo's run for seed 3 (python -m demo --seed 3): its world is seed 3's, its customer the shipped model
    assert (cfg.seed, cfg.synthetic_seed, cfg.user_serve, cfg.user_gate) == (3, 3, str(SHIPPED), 0.95)
    assert len(tasks) == 200 and all(t.split == "test" and t.spec["behaviour"] for t in tasks)
    other = run_tasks(4)[1]
    assert [t.spec["order_id"] for t in tasks] != [t.spec["order_id"] for t in other]  # a seed is its own world
    out = subprocess.run([sys.executable, str(PROBES / "gate_worlds.py"), str(tmp_path), "--seeds", "0"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "no model in" in out.stderr and "Traceback" not in out.stderr


def test_the_seeds_table_counts_gain_band_and_the_last_evaluations_mistakes(tmp_path, monkeypatch):
    import seeds

    monkeypatch.setattr(seeds, "blind_rule", lambda run: 50.0)  # (the rules' own play: tests/test_store.py)

    def run(name, seed, p1s, last_mistakes):
        d = tmp_path / name
        d.mkdir()
        (d / "config.json").write_text(json.dumps({"seed": seed}))
        names = ["untrained", "cold start", "GRPO step 10", "GRPO (30 steps)"][: len(p1s)]
        recs = [{"phase": "eval", "name": n, "pass^1": p, "customer_fidelity": 0.9 + 0.01 * i}
                for i, (n, p) in enumerate(zip(names, p1s))]
        (d / "log.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n")
        eps = [{"phase": "eval", "name": names[-2], "info": {"customer_mistakes": ["no_human"]}}]  # not the last
        eps += [{"phase": "eval", "name": names[-1], "info": {"customer_mistakes": m}} for m in last_mistakes]
        (d / "episodes-rank0.jsonl").write_text("\n".join(json.dumps(e) for e in eps) + "\n")
        return d

    runs = [run("a", 7, [0.0, 0.40, 0.50, 0.60], [["extra_human"], [], ["extra_human", "no_insist"]]),
            run("b", 8, [0.0, 0.70, 0.90, 0.95], [[]]),  # a cold start above the band: no
            run("c", 9, [0.0, 0.40, 0.50], [[]])]  # stopped before its last evaluation
    rows = {r["seed"]: r for r in map(seeds.row, runs)}
    assert rows[7]["learned"] and rows[7]["gain"] == pytest.approx(20.0)
    assert rows[7]["mistakes"] == "extra_human 2, no_insist 1 (of 3)" and rows[7]["fidelity_min"] == pytest.approx(91.0)
    assert not rows[8]["learned"] and rows[8]["finished"] and rows[8]["mistakes"] == "none (of 1)"
    assert not rows[9]["finished"]
    sft = tmp_path / "d"  # a run still in its cold start: a log, no evaluation, no conversations yet
    sft.mkdir()
    (sft / "config.json").write_text(json.dumps({"seed": 10}))
    (sft / "log.jsonl").write_text(json.dumps({"phase": "sft", "loss": 1.0}) + "\n")
    text = seeds.table(runs + [sft])
    assert "| 9 |" in text and "unfinished" in text and "2 finished run(s)" in text and "1 of 2 gained" in text
    assert "| 10 | - | - |" in text and text.count("unfinished") == 2


def test_read_probe_sees_a_reader_and_the_refusals(tmp_path):
    # demo/probes/read_probe.py (seed 17's diagnosis): the copier gives the other option more probability after the
    # customer said it than after the default, on both requests; the refusal cases end with the customer's reply to
    # the refusal (insisting, or asking for a human) and compare the refusal repeated with the transfer
    import read_probe as rp

    world = store.build_world(seed=0, n_orders=300, n_test_orders=100, n_train=200, n_test=20)
    train_tasks = world.tasks("train")
    texts = [world.rules] + [json.dumps(t.expert) for t in train_tasks[:100]]
    _, tok = build_tiny(tmp_path / "tiny", texts=texts, hidden=32, layers=1, heads=1, kv_heads=1, intermediate=64,
                        vocab_size=400, split_digits=True)

    class Copies(torch.nn.Linear):
        def forward(self, ids):  # logits[t, v] = how often v occurs in ids[: t + 1], scaled: p stays below 1
            return type("Out", (), {"logits": torch.nn.functional.one_hot(ids, len(tok)).float().cumsum(1) / 200})

    world.tasks = lambda split: train_tasks  # the probe reads the training split
    out = rp.probe(Copies(1, 1), tok, world)

    class Blind(torch.nn.Linear):  # the same scores whatever it read
        def forward(self, ids):
            return type("Out", (), {"logits": torch.arange(len(tok)).float().expand(*ids.shape, -1) / len(tok)})

    blind = rp.probe(Blind(1, 1), tok, world)
    for request in ("cancel", "return"):
        assert out[f"{request}: p(other | said other)"] > out[f"{request}: p(other | said default)"], out
        assert blind[f"{request}: p(other | said other)"] == pytest.approx(blind[f"{request}: p(other | said default)"])
    cases = store.hold_cases(train_tasks, n=4)
    assert len(cases["insist"]) == len(cases["human"]) == 4
    for behaviour, part in cases.items():
        for before, again, transfer in part:
            assert before[-2]["role"] == "assistant" and "cannot be" in before[-2]["content"]
            assert before[-1]["role"] == "user" and again["content"] == store.REFUSE_AGAIN
            assert transfer["tool_calls"][0]["function"]["name"] == "transfer_to_human_agents"
            assert rp.p_first(Copies(1, 1), tok, world.rules, before, again, again) == 0.5
    assert 0.0 <= out["p(refuse again | insist)"] <= 1.0 and 0.0 <= out["p(refuse again | human)"] <= 1.0


def test_read_probe_counts_the_other_option_written(tmp_path):
    # written_other reads a run's transcripts: held-out conversations whose customer wants the non-default option
    # (no change of mind), per evaluation and request: the last write call's option against the customer's
    import read_probe as rp

    world = store.build_world(seed=0, n_orders=300, n_test_orders=100, n_train=50, n_test=60)
    t = next(t for t in world.tasks("test") if t.spec["choice"] and not t.spec["change"] and t.spec["choice"] !=
             store.shop.DEFAULT[store.CHOICES[t.spec["request"]][0]])
    arg, other = store.CHOICES[t.spec["request"]][0], t.spec["choice"]
    lines = [{"phase": "eval", "name": "cold start", "task_id": t.id, "messages": [
        store.shop._call("write", {"order_id": "#W1", arg: o}) for o in written]}
        for written in ([other], [store.shop.DEFAULT[arg]], [], [store.shop.DEFAULT[arg], other])]
    lines.append({"phase": None, "task_id": t.id, "messages": []})  # a training episode: not counted
    (tmp_path / "episodes-rank0.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert rp.written_other(tmp_path, world) == {"cold start": f"{t.spec['request']} 2/4"}


def test_read_probe_names_a_damaged_checkpoint(tmp_path):
    # a --model file that is no state dict: one line naming it, exit non-zero, no traceback
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"domains": "store", "synthetic_seed": 0, "synthetic_train": 60,
                                                 "synthetic_test": 10}))
    world = store.build_world(seed=0, n_orders=300, n_test_orders=100, n_train=60, n_test=10)
    build_tiny(run / "cold-start", texts=[world.rules] + [json.dumps(t.expert) for t in world.tasks("train")],
               hidden=32, layers=1, heads=1, kv_heads=1, intermediate=64, vocab_size=400, split_digits=True)
    (tmp_path / "bad.pt").write_bytes(b"not a checkpoint")
    proc = subprocess.run([sys.executable, str(PROBES / "read_probe.py"), str(run), "--model",
                           str(tmp_path / "bad.pt")], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "read_probe: cannot load" in proc.stderr and "bad.pt" in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout.startswith("cold-start: cancel: p(other | said other)")
