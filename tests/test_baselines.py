"""demo/baselines.py: the customer-blind rules read no word of the customer's, every constant policy is one of them,
reading beats them, and the report (python -m demo.baselines --run RUN) is written. No trained run needed: a small
generated store world and transcripts played by rules stand in for a run."""

import itertools
import json

import pytest

from demo import baselines
from demo.baselines import BLIND, RULES, rule_act
from demo.worlds import store
from domains import load_world
from eval import evaluate
from rollout import RolloutConfig
from user_sim import make_user


@pytest.fixture(scope="module")
def world():
    return load_world("store", seed=3, n_train=10, n_test=40)


@pytest.fixture(scope="module")
def played(world):
    return baselines.play_rules(world, make_user("scripted"))


def _play(world, task, act) -> list[dict]:
    """A conversation of rule `act` with the scripted customer of `task` (the store's tools, for real)."""
    env, msgs = world.new_env(task), [{"role": "user", "content": store.customer_turn(task.spec, [])}]
    for _ in range(12):
        out = act(msgs, None)
        if out["tool_calls"]:
            f = out["tool_calls"][0]["function"]
            msgs += [{"role": "assistant", "content": "", "tool_calls": out["tool_calls"]},
                     {"role": "tool", "name": f["name"], "content": env.call(f["name"], f["arguments"])}]
            if f["name"] == "transfer_to_human_agents":
                break
            continue
        msgs.append({"role": "assistant", "content": out["content"]})
        msgs.append({"role": "user", "content": store.customer_turn(task.spec, msgs)})
        if store.STOP in msgs[-1]["content"]:
            break
    env.close()
    return msgs


def _others(spec: dict):
    """Every other customer of the same order and request: other options, changes of mind, reactions to a refusal,
    paraphrases and phrasings; the same order id given at the same point (omit)."""
    _, options = store.CHOICES[spec["request"]]
    allowed = spec["choice"] is not None
    for choice, behaviour, style, phrasing in itertools.product(
            sorted(options) if allowed else [None], ("plain", "change") if allowed else ("accept", "insist", "human"),
            range(12), sorted(store.PHRASINGS)):
        yield dict(spec, choice=choice, behaviour=behaviour, change=behaviour == "change",
                   insist=behaviour == "insist", human=behaviour == "human", style=style, phrasing=phrasing)


def _acts_differ(act, msgs: list[dict], other: dict) -> bool:
    """Does `act` do anything else when another customer (`other`) says its own words in `msgs`' place?"""
    swapped = []
    for m in msgs:
        if m["role"] == "assistant" and act(swapped, None) != act([x for x in msgs[: len(swapped)]], None):
            return True
        swapped.append({"role": "user", "content": store.customer_turn(other, swapped)} if m["role"] == "user" else m)
    return False


def test_every_constant_policy_is_a_customer_blind_rule():
    assert len(BLIND) == 4 and {RULES[k] for k in BLIND} == set(itertools.product(("default", "other"),
                                                                                   ("never", "always")))
    # the rules that read: each option reading with each hand-off, the annotator and reads everything among them
    assert set(RULES.values()) == set(itertools.product(("default", "other", "first", "last"),
                                                        ("never", "always", "asked")))
    assert RULES["annotator"] == ("first", "always") and RULES["reads everything"] == ("last", "asked")
    with pytest.raises(ValueError):
        rule_act("middle", "never")


def test_the_blind_rules_act_alike_whatever_the_customer_says(world):
    # two conversations that differ only in the customer's words (the order id and request aside: every rule needs
    # them) get the same actions from a blind rule; every rule that reads is caught acting otherwise somewhere
    # (the check can tell)
    caught = set()
    for task in world.tasks("test"):
        for name, (option, hand_off) in RULES.items():
            act = rule_act(option, hand_off)
            msgs = _play(world, task, act)
            for other in _others(task.spec):
                if _acts_differ(act, msgs, other):
                    assert name not in BLIND, (name, task.spec, other)
                    caught.add(name)
                    break
    assert caught == set(RULES) - set(BLIND)


def test_reading_everything_beats_every_blind_rule_against_the_script(world, played):
    assert played["reads everything"]["pass^1"] == 1.0
    assert all(played[k]["pass^1"] < 1.0 for k in BLIND), {k: played[k]["pass^1"] for k in BLIND}
    # each piece of reading adds to a constant: the ask for a human, and the option named
    for option in ("default", "other"):
        asked = played[f"{option}, transfer if asked"]["pass^1"]
        assert asked > max(played[f"{option}, never transfer"]["pass^1"], played[f"{option}, transfer"]["pass^1"])
    assert played["last option, never transfer"]["pass^1"] > max(played[k]["pass^1"] for k in BLIND if "never" in k)
    # the best constant with the option per request is no worse than the best blind rule, and no better than reading
    name, score = baselines.best_constant(world, played)
    assert max(played[k]["pass^1"] for k in BLIND) <= score < 1.0 and name.startswith("cancellations ")
    assert all(set(d["rewards"]) == {t.id for t in world.tasks("test")} for d in played.values())


def test_by_behaviour_counts_the_allowed_requests_apart():
    specs = [{"behaviour": "plain", "kind": "cancel", "request": "cancel"},
             {"behaviour": "change", "kind": "return", "request": "return", "unseen": True},
             {"behaviour": "insist", "kind": "refuse", "request": "return"}]
    d = baselines.by_behaviour(zip(specs, [1.0, 0.0, 1.0]))
    assert d == {"plain": 1.0, "cancels": 1.0, "change": 0.0, "unseen": 0.0, "returns": 0.0, "insist": 1.0}


def test_an_older_runs_config_builds_its_world():
    # an older version's config.json: `tasks` (today's task_source) and keys that no longer exist are tolerated
    old = {"domains": "store", "tasks": "train", "synthetic_seed": 3, "synthetic_train": 10, "synthetic_test": 40,
           "synthetic_users": 40, "a_field_long_gone": 1}
    w, settings = baselines.world_of(old)
    assert settings["synthetic_seed"] == 3 and settings["task_source"] == "train"
    assert "a_field_long_gone" not in settings
    assert len(w.tasks("test")) == 40
    assert baselines.world_of({"tasks": "synthetic", "synthetic_seed": 3, "synthetic_train": 10,
                               "synthetic_test": 40})[1]["task_source"] == "generated"


def test_the_report_of_a_run_is_printed_and_written(tmp_path, capsys):
    cfg = {"domains": "store", "tasks": "train", "synthetic_seed": 3, "synthetic_train": 10, "synthetic_test": 40,
           "user": "scripted", "a_field_long_gone": 1}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    w, _ = baselines.world_of(cfg)
    # a "run": its cold start writes the default and hands off, its last evaluation the other option and asks
    evals, rows = [], []
    for name, rule in (("cold start", ("default", "always")), ("GRPO (40 steps)", ("other", "asked"))):
        m, eps = evaluate(w.tasks("test"), {"store": w}, baselines.MessageAgent(lambda t, r=rule: rule_act(*r)),
                          make_user("scripted"), RolloutConfig(max_turns=10, tools_in_prompt=False), progress=False)
        evals += [{"phase": "eval", "name": name, "task_id": e.task.id, "reward": e.reward, "info": e.info,
                   "messages": e.messages} for e in eps]
        rows.append(f"| {name} | {100 * m['pass^1']:.1f} | 5.0 |")
    (tmp_path / "episodes-rank0.jsonl").write_text("\n".join(map(json.dumps, evals)) + "\n")
    (tmp_path / "results.md").write_text("| model | pass^1 | avg_turns |\n|---|---|---|\n" + "\n".join(rows) + "\n")
    text = baselines.main(["--run", str(tmp_path)])
    assert (tmp_path / "baselines.md").read_text() == text == capsys.readouterr().out.split("\n(written to")[0]
    assert "| run: cold start |" in text and "| run: GRPO (40 steps) |" in text and "(customer-blind)" in text
    assert "| GRPO (40 steps) | cancel | 0/" in text and "yes: always other" in text and "yes: always default" in text
    assert "100.0 % of its" in text  # the scripted customer speaks its own lines, all of them
    n = len(evals)
    assert f"World check: {n} of {n} evaluation transcripts" in text
    blind = baselines.play_rules(w, make_user("scripted"), rules=BLIND)
    best = max(BLIND, key=lambda k: blind[k]["pass^1"])
    assert f"Best customer-blind rule (the best rule that ignores the customer): **{best}**, pass^1 " in text
    last = baselines.results_pass1(tmp_path)["GRPO (40 steps)"]
    assert last == pytest.approx(round(baselines.run_table(tmp_path, w)["GRPO (40 steps)"]["all"], 3))
    margin = 100 * (last - blind[best]["pass^1"])
    assert f"pass^1 {100 * last:.1f} %, {margin:+.1f} points over the best customer-blind rule" in text
