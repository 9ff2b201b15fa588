"""What the demo's result means: rule policies beside the trained agent, and success per behaviour.

If a rule that ignores what the customer says reaches the trained agent's score, RL learnt that
rule, not to listen (EVIDENCE.md). So this file plays, on a run's held-out tasks and through
evaluation's rollout() + score():

    default, never transfer      customer-blind: the default option; refuse twice, never hand off
    default, transfer            customer-blind: the default option; hand off whenever a refused customer goes on
    last option, never transfer  reads the options only (the last one named)
    annotator                    the cold start's teacher without its slips: first option named, hands off when a
                                 refused customer goes on
    reads everything             last option named, hands off iff the customer asked for a human (the script's match)

and, from a run's transcripts (episodes-rank0.jsonl), each evaluation's success per behaviour
(plain, change of mind, accept, insist, human; the held-out combinations no training task has),
beside the cold start's data (annotator's).

    python -m demo.baselines --run runs/muarl          # the run's world (its seed), against the store's script
    python -m demo.baselines --seed 3 --user sampled   # any world, against the script sampling its paraphrases
A rule's moves are the store's own lines (domains/store.py), so the table compares decisions, not
wording."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections import defaultdict
from pathlib import Path

from plumbing.agents import MessageAgent
from demo import TINY
from demo.train import DemoConfig as Config
from domains import load_worlds, store
from eval import evaluate
from rollout import RolloutConfig
from user_sim import make_user

# rule -> (which option it writes, when it hands off after a refusal); None = customer-blind in that
# decision
RULES = {"default, never transfer": ("default", "never"), "default, transfer": ("default", "always"),
         "last option, never transfer": ("last", "never"), "annotator": ("first", "always"),
         "reads everything": ("last", "human")}
BLIND = ("default, never transfer", "default, transfer")  # the rules that read nothing the customer says
BEHAVIOURS = ("plain", "change", "accept", "insist", "human")


def _call(name: str, args: dict) -> dict:
    return {"content": "", "tool_calls": [{"function": {"name": name, "arguments": args}}]}


def rule_act(option: str, hand_off: str):
    """A rule policy as an `act(messages, tools)` for agents.MessageAgent: one decision per turn
    from the conversation so far (the order id and request from the customer's words, the status
    from the lookup)."""

    def act(messages, tools):
        said = [m["content"] for m in messages if m["role"] == "user"]
        mine = [m for m in messages if m["role"] == "assistant"]
        request = "return" if "return" in said[0].lower() else "cancel"
        ids = [w.strip(".,!?:") for w in " ".join(said).split() if w.startswith("#W")]
        if not ids:
            return {"content": store.ASK_ID, "tool_calls": []}
        looked = [m for m in messages if m["role"] == "tool" and m.get("name") == "get_order_details"]
        if not looked:
            return _call("get_order_details", {"order_id": ids[-1]})
        status = json.loads(looked[-1]["content"]).get("status", "") if looked[-1]["content"].startswith("{") else ""
        arg, _ = store.CHOICES[request]
        if (request, status) in store.ALLOWED:
            if not any(m["content"] in (store.shop.ASK_REASON, store.shop.ASK_REFUND) for m in mine):
                return {"content": store.shop.ASK_REASON if request == "cancel" else store.shop.ASK_REFUND,
                        "tool_calls": []}
            if any(m.get("tool_calls") and m["tool_calls"][0]["function"]["name"] != "get_order_details" for m in mine):
                return {"content": store.shop.DONE[request].format(ids[-1]), "tool_calls": []}
            named = [o for s in said for o in store._named(s)] or [store.shop.DEFAULT[arg]]
            choice = {"default": store.shop.DEFAULT[arg], "first": named[0], "last": named[-1]}[option]
            write = "cancel_pending_order" if request == "cancel" else "return_delivered_order"
            return _call(write, {"order_id": ids[-1], arg: choice})
        refused = sum(store._refuses(m["content"] or "") for m in mine)
        if not refused:
            return {"content": store.shop.REFUSE[request].format(ids[-1], status), "tool_calls": []}
        if hand_off == "always" or (hand_off == "human" and "human" in said[-1].lower()):  # (after a refusal)
            return _call("transfer_to_human_agents", {"summary": f"The customer wants to {request} {ids[-1]}."})
        return {"content": store.REFUSE_AGAIN, "tool_calls": []}

    return act


def play_rules(world, user, trials: int = 1, seed: int = 0) -> dict:
    """pass^1 of every rule on the world's held-out tasks against `user`; and per behaviour."""
    tasks, out = world.tasks("test"), {}
    cfg = RolloutConfig(max_turns=10, max_new_tokens=64, max_context=4096, tools_in_prompt=False, seed=seed)
    for name, (option, hand_off) in RULES.items():
        m, eps = evaluate(tasks, {"store": world}, MessageAgent(lambda task, o=option, h=hand_off: rule_act(o, h)),
                          user, cfg, trials=trials, progress=False)
        out[name] = {"pass^1": m["pass^1"], **by_behaviour([(e.task.spec, e.reward) for e in eps])}
    return out


def by_behaviour(pairs) -> dict:
    """[(spec, reward)] -> success per behaviour, and on the held-out combinations (unseen)."""
    sums = defaultdict(lambda: [0.0, 0])
    for spec, r in pairs:
        for key in (spec["behaviour"], "unseen") if spec.get("unseen") else (spec["behaviour"],):
            sums[key][0] += r
            sums[key][1] += 1
    return {k: s / n for k, (s, n) in sums.items()}


def annotator_right(world) -> dict:
    """How often the cold start's data (the annotator's conversations on training tasks) shows each
    behaviour done right: its tool calls replayed and scored."""
    pairs = []
    for t in world.tasks("train"):
        calls = [c["function"] for m in t.expert for c in m.get("tool_calls") or []]
        env = world.replay([{"name": c["name"], "arguments": c["arguments"]} for c in calls])
        pairs.append((t.spec, world.score(t, env)[0]))
        env.close()
    return by_behaviour(pairs)


def imitated(world, right: dict) -> float:
    """What a policy doing each behaviour right as often as the cold start's data does (`right`,
    annotator_right) would score on the held-out tasks: those rates weighted by the held-out tasks'
    behaviours. A cold start that imitated its data exactly would land here; the band asks 25-65 %
    of it (issue 23)."""
    test = [t.spec["behaviour"] for t in world.tasks("test")]
    return sum(right.get(b, 0.0) for b in test) / max(1, len(test))


def run_table(run: Path, world) -> dict:
    """Success per behaviour of each evaluation in a run's transcripts (eval phase of
    episodes-rank0.jsonl); and "status flow": where the request and the order's status disagree (a
    delivered order to cancel, a pending one to return), the share of conversations in which the
    agent asked the question of the flow the status implies."""
    spec = {t.id: t.spec for t in world.tasks("test")}
    pairs, flow = defaultdict(list), defaultdict(list)
    with open(run / "episodes-rank0.jsonl") as f:
        for line in f:
            e = json.loads(line)
            if e.get("phase") == "eval" and e["task_id"] in spec and not e["info"].get("user_error"):
                pairs[e["name"]].append((s := spec[e["task_id"]], e["reward"] or 0.0))
                if (s["request"], s["status"]) in (("cancel", "delivered"), ("return", "pending")):
                    q = store.shop.ASK_REASON if s["request"] == "return" else store.shop.ASK_REFUND
                    flow[e["name"]].append(any(q in (m.get("content") or "") for m in e["messages"]))
    return {name: by_behaviour(p) | {"all": sum(r for _, r in p) / len(p), "flow": sum(flow[name]) /
                                     max(1, len(flow[name]))} for name, p in pairs.items()}


def world_of(cfg: dict, seed: int = 0):
    """(the store world exactly as muarl.py built it, its settings): a run's saved config.json, else
    the CPU preset's with world seed `seed`."""
    known = {f.name for f in dataclasses.fields(Config)}
    settings = {k: v for k, v in cfg.items() if k in known} or dict(TINY, synthetic_seed=seed)
    return load_worlds(dataclasses.replace(Config(), **(settings | {"domains": "store"})))["store"], settings


def _row(name: str, d: dict) -> str:
    cells = [f"{100 * d[k]:.1f}" if k in d else "-" for k in ("all",) + BEHAVIOURS + ("unseen", "flow")]
    return f"| {name} | " + " | ".join(cells) + " |"


if __name__ == "__main__":
    p = argparse.ArgumentParser(description="rule policies and per-behaviour success for the store world")
    p.add_argument("--run", default="", help="a run folder (its config.json: the world; its transcripts: the table)")
    p.add_argument("--seed", type=int, default=0, help="the world's seed (without --run)")
    p.add_argument("--user", default="scripted", choices=["scripted", "sampled"])
    a = p.parse_args()
    run = Path(a.run) if a.run else None
    if run and not (run / "config.json").is_file():
        sys.exit(f"baselines: no config.json in {run}")
    world, settings = world_of(json.loads((run / "config.json").read_text()) if run else {}, a.seed)
    seed = world_seed = settings["synthetic_seed"]
    print(f"store world seed {world_seed}, {len(world.tasks('test'))} held-out tasks; rules against the {a.user} "
          "customer\n")
    print(f"| policy | all | {' | '.join(BEHAVIOURS)} | unseen combinations | status flow |\n" + "|---" * 9 + "|")
    rules = play_rules(world, make_user(a.user), seed=seed)
    for name, d in rules.items():
        print(_row(name + (" (customer-blind)" if name in BLIND else ""), {"all": d["pass^1"], **d}))
    data = annotator_right(world)  # its "all": the data's rates weighted by the held-out tasks' behaviours
    print(_row("cold-start data (annotator, train)", data | {"all": imitated(world, data)}))
    if run and (run / "episodes-rank0.jsonl").is_file():
        for name, d in run_table(run, world).items():
            print(_row(f"run: {name}", d))
    best = max(BLIND, key=lambda k: rules[k]["pass^1"])
    print(f"\nbest customer-blind rule: {best}, pass^1 {100 * rules[best]['pass^1']:.1f} %")
