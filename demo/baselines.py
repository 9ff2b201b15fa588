"""What the demo's result means: rule policies beside the trained agent, and success per behaviour.

If a rule that ignores what the customer says reaches the trained agent's score, RL learnt that
rule, not to listen. So this file plays rule policies on a run's held-out tasks, through
evaluation's rollout() + score() (eval.evaluate, the loop training uses), against the store's
scripted customer. A rule makes two decisions the customer's words can inform (RULES):

    the option it writes    default (the shop's default option), other (the one that is not the
                            default), first / last (the first / last option the customer named;
                            the default when it named none)
    the hand-off            never (refuses twice), always (hands off whenever a refused customer
                            goes on), asked (hands off iff the customer's reply to the refusal says
                            "human", "person" or "agent"; else refuses again)

Every rule reads the order id and the request from the customer's words (nothing can be done
without them) and the status from the lookup. The customer-BLIND rules (BLIND: default / other x
never / always, every constant policy) read nothing else: tests/test_baselines.py feeds them
conversations that differ only in the customer's words and checks the same actions. The other
rules read one piece each (the option named, the ask for a human) or everything ("reads
everything": the last option named, a hand-off when asked), so the table says what each piece of
reading is worth.

From a run's transcripts (episodes-rank0.jsonl) it adds each evaluation's success per behaviour
(plain, change of mind, accept, insist, human; the held-out combinations no training task has;
allowed cancellations and returns apart), the options the agent wrote against the ones its
customer asked for (is its option constant?), how much of its customer's words are the store
script's own lines, and a check that the world rebuilt from config.json is the run's (every
transcript's tool calls scored again).

    python -m demo.baselines --run runs/muarl          # the run's world (its seed); writes runs/muarl/baselines.md
    python -m demo.baselines --seed 3 --user sampled   # any world, against the script sampling its paraphrases

A rule's moves are the store's own lines (demo/worlds/store.py), so the table compares decisions, not
wording. The rules play the scripted customer; a run's evaluations played the run's own customer
(the served customer model in the demo's preset): the table names both."""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import re
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

from evaluation.agents import MessageAgent
from demo import TINY
from demo.train import DemoConfig as Config
from demo.worlds import store
from domains import load_worlds
from eval import evaluate
from rollout import RolloutConfig
from user_sim import make_user

# rule -> (the option it writes, when it hands a refused customer to a human)
RULES = {
    "default, never transfer": ("default", "never"),  # blind: the default option; refuses twice
    "default, transfer": ("default", "always"),  # blind: the default option; hands off when a refused customer goes on
    "other, never transfer": ("other", "never"),  # blind: the option that is not the default; refuses twice
    "other, transfer": ("other", "always"),  # blind: the other option; hands off whenever a refused customer goes on
    "default, transfer if asked": ("default", "asked"),  # reads the ask for a human only
    "other, transfer if asked": ("other", "asked"),  # reads the ask for a human only
    "last option, never transfer": ("last", "never"),  # reads the options only: the last one named
    "last option, transfer": ("last", "always"),  # reads the options only: the last one named
    "first option, never transfer": ("first", "never"),  # reads the options only: the first one named
    "annotator": ("first", "always"),  # the cold start's teacher without its slips: first option, hands off
    "first option, transfer if asked": ("first", "asked"),  # reads both, the option as the annotator does
    "reads everything": ("last", "asked"),  # reads both: the last option named, hands off iff asked
}
CONSTANT_OPTIONS, CONSTANT_HAND_OFFS = ("default", "other"), ("never", "always")
# the customer-blind rules: every constant policy (each option x each hand-off), the options decided without a word
BLIND = tuple(k for k, (o, h) in RULES.items() if o in CONSTANT_OPTIONS and h in CONSTANT_HAND_OFFS)
BEHAVIOURS = ("plain", "change", "accept", "insist", "human")
COLUMNS = ("all",) + BEHAVIOURS + ("unseen", "cancels", "returns", "flow")  # "cancels"/"returns": the allowed ones
ASKED = re.compile(r"\b(human|person|agent)\b")  # the "asked" hand-off's keywords
WRITES = {"cancel": "cancel_pending_order", "return": "return_delivered_order"}


def _call(name: str, args: dict) -> dict:
    return {"content": "", "tool_calls": [{"function": {"name": name, "arguments": args}}]}


def _options(request: str) -> tuple[str, str, str]:
    """(the write's argument, the shop's default option, the other option) of a request."""
    arg, options = store.CHOICES[request]
    default = store.shop.DEFAULT[arg]
    return arg, default, next(o for o in sorted(options) if o != default)


def rule_act(option: str, hand_off: str):
    """A rule policy as an `act(messages, tools)` for agents.MessageAgent: one decision per turn
    from the conversation so far (the order id and request from the customer's words, the status
    from the lookup; the option and the hand-off as RULES says)."""
    if option not in ("default", "other", "first", "last") or hand_off not in ("never", "always", "asked"):
        raise ValueError(f"no rule ({option!r}, {hand_off!r})")

    def act(messages, tools):
        said = [m["content"] or "" for m in messages if m["role"] == "user"]
        mine = [m for m in messages if m["role"] == "assistant"]
        request = "return" if "return" in said[0].lower() else "cancel"
        ids = [w.strip(".,!?:") for w in " ".join(said).split() if w.startswith("#W")]
        if not ids:
            return {"content": store.ASK_ID, "tool_calls": []}
        looked = [m for m in messages if m["role"] == "tool" and m.get("name") == "get_order_details"]
        if not looked:
            return _call("get_order_details", {"order_id": ids[-1]})
        status = json.loads(looked[-1]["content"]).get("status", "") if looked[-1]["content"].startswith("{") else ""
        arg, default, other = _options(request)
        if (request, status) in store.ALLOWED:
            if not any(m["content"] in (store.shop.ASK_REASON, store.shop.ASK_REFUND) for m in mine):
                return {"content": store.shop.ASK_REASON if request == "cancel" else store.shop.ASK_REFUND,
                        "tool_calls": []}
            if any(m.get("tool_calls") and m["tool_calls"][0]["function"]["name"] != "get_order_details" for m in mine):
                return {"content": store.shop.DONE[request].format(ids[-1]), "tool_calls": []}
            if option in ("default", "other"):  # a constant: no word of the customer's is read
                choice = default if option == "default" else other
            else:
                named = [o for s in said for o in store._named(s)] or [default]
                choice = named[0] if option == "first" else named[-1]
            return _call(WRITES[request], {"order_id": ids[-1], arg: choice})
        if not any(store._refuses(m["content"] or "") for m in mine):
            return {"content": store.shop.REFUSE[request].format(ids[-1], status), "tool_calls": []}
        # a refused customer went on (an answer that ends the chat is never answered)
        if hand_off == "always" or (hand_off == "asked" and ASKED.search(said[-1].lower())):
            return _call("transfer_to_human_agents", {"summary": f"The customer wants to {request} {ids[-1]}."})
        return {"content": store.REFUSE_AGAIN, "tool_calls": []}

    return act


def play_rules(world, user, trials: int = 1, seed: int = 0, rules=None) -> dict:
    """pass^1 of every rule (of `rules`, default RULES) on the world's held-out tasks against
    `user`; per behaviour; and each task's mean reward ("rewards")."""
    tasks, out = world.tasks("test"), {}
    cfg = RolloutConfig(max_turns=10, max_new_tokens=64, max_context=4096, tools_in_prompt=False, seed=seed)
    for name in rules or RULES:
        option, hand_off = RULES[name]
        m, eps = evaluate(tasks, {"store": world}, MessageAgent(lambda task, o=option, h=hand_off: rule_act(o, h)),
                          user, cfg, trials=trials, progress=False)
        rewards = defaultdict(list)
        for e in eps:
            rewards[e.task.id].append(e.reward or 0.0)
        out[name] = {"pass^1": m["pass^1"], **by_behaviour([(e.task.spec, e.reward or 0.0) for e in eps]),
                     "rewards": {k: sum(v) / len(v) for k, v in rewards.items()}}
    return out


def _keys(spec: dict) -> tuple:
    allowed = spec.get("kind") in ("cancel", "return")
    return (spec["behaviour"],) + (("unseen",) if spec.get("unseen") else ()) + \
        ((spec["request"] + "s",) if allowed else ())


def by_behaviour(pairs) -> dict:
    """[(spec, reward)] -> success per behaviour, on the held-out combinations (unseen), and on the
    allowed cancellations and returns (cancels, returns: the option written)."""
    sums = defaultdict(lambda: [0.0, 0])
    for spec, r in pairs:
        for key in _keys(spec):
            sums[key][0] += r
            sums[key][1] += 1
    return {k: s / n for k, (s, n) in sums.items()}


def best_constant(world, rules: dict) -> tuple[str, float]:
    """The best constant policy with the option chosen per request (cancellation's and return's
    apart: 2 x 2 x 2 policies), from the BLIND rules' rewards: an allowed request's reward depends
    on the option only, a refused one's on the hand-off only. (its name, its pass^1)"""
    tasks, best = world.tasks("test"), ("", -1.0)
    for cancel, ret, hand_off in itertools.product(CONSTANT_OPTIONS, CONSTANT_OPTIONS, CONSTANT_HAND_OFFS):
        pick = {"cancel": cancel, "return": ret}

        def rule(t):
            option = pick[t.spec["request"]] if t.spec["choice"] else "default"
            return next(k for k in BLIND if RULES[k] == (option, hand_off))

        score = sum(rules[rule(t)]["rewards"][t.id] for t in tasks) / len(tasks)
        if score > best[1]:
            best = (f"cancellations {cancel}, returns {ret}, {'never transfer' if hand_off == 'never' else 'transfer'}",
                    score)
    return best


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
    behaviours. A cold start that imitated its data exactly would land here; the demo's
    --stage_band asks 25-65 % of it."""
    test = [t.spec["behaviour"] for t in world.tasks("test")]
    return sum(right.get(b, 0.0) for b in test) / max(1, len(test))


def _evals(run: Path, world):
    """(episode, its held-out task) of every evaluation in a run's transcripts."""
    tasks = {t.id: t for t in world.tasks("test")}
    path = run / "episodes-rank0.jsonl"
    if not path.is_file():
        return
    with open(path) as f:
        for line in f:
            e = json.loads(line)
            if e.get("phase") == "eval" and e.get("task_id") in tasks:
                yield e, tasks[e["task_id"]]


def run_table(run: Path, world) -> dict:
    """Success per behaviour of each evaluation in a run's transcripts (eval phase of
    episodes-rank0.jsonl); and "status flow": where the request and the order's status disagree (a
    delivered order to cancel, a pending one to return), the share of conversations in which the
    agent asked the question of the flow the status implies."""
    pairs, flow = defaultdict(list), defaultdict(list)
    for e, t in _evals(run, world):
        if e["info"].get("user_error"):
            continue
        s = t.spec
        pairs[e["name"]].append((s, e["reward"] or 0.0))
        if (s["request"], s["status"]) in (("cancel", "delivered"), ("return", "pending")):
            q = store.shop.ASK_REASON if s["request"] == "return" else store.shop.ASK_REFUND
            flow[e["name"]].append(any(q in (m.get("content") or "") for m in e["messages"]))
    return {name: by_behaviour(p) | {"all": sum(r for _, r in p) / len(p), "flow": sum(flow[name]) /
                                     max(1, len(flow[name]))} for name, p in pairs.items()}


def options_written(run: Path, world) -> dict:
    """Per evaluation and request, on the allowed requests: Counter of (the option the customer
    asked for: "default" | "other", what the agent wrote first: "default" | "other" | "none")."""
    out = defaultdict(lambda: defaultdict(Counter))
    for e, t in _evals(run, world):
        s = t.spec
        if not s["choice"]:
            continue
        arg, default, _ = _options(s["request"])
        written = [(c["function"].get("arguments") or {}) for m in e["messages"] if m.get("role") == "assistant"
                   for c in m.get("tool_calls") or [] if c["function"].get("name") == WRITES[s["request"]]]
        value = written[0].get(arg) if written and isinstance(written[0], dict) else None
        wrote = "none" if value is None else "default" if value == default else "other"
        out[e["name"]][s["request"]][("default" if s["choice"] == default else "other", wrote)] += 1
    return out


def script_lines(spec: dict, phrasing: str = "a") -> set[str]:
    """Every message the store's scripted customer (banks PHRASINGS[phrasing]) can say for this task."""
    bank, fill = store.PHRASINGS[phrasing], {"request": spec["request"], "oid": spec["order_id"]}
    _, options = store.CHOICES[spec["request"]]
    lines = {store.STOP, *bank["accept"], *bank["thanks"]}
    lines |= {p.format(**fill) for k in ("give_id", "insist", "human") for p in bank[k]}
    lines |= {p.format(**fill) for p in bank["first"][True] + bank["first"][False]}
    said = {o: bank["say"][o] for o in options}
    lines |= {p for o in options for p in said[o]}
    lines |= {c.format(first=a, second=b) for c in bank["change"] for o1, o2 in itertools.permutations(options, 2)
              for a in said[o1] for b in said[o2]}
    return lines


def _template(text: str) -> str:
    return re.sub(r"\b(cancel|return)\b", "REQUEST", re.sub(r"#W\d+", "#W", text))


def customer_share(run: Path, world) -> dict:
    """How much of a run's customer's words are the script's: of its messages in the evaluations'
    transcripts, the share that is verbatim a line the store's script says for that task (its bank
    "a", the one the customer model was trained on), and the share that is a line of any bank with
    any order id or request."""
    own = anywhere = n = 0
    templates = None
    for e, t in _evals(run, world):
        if templates is None:
            templates = {_template(x) for p in store.PHRASINGS for r in store.CHOICES
                         for x in script_lines(dict(t.spec, request=r), p)}
        lines = script_lines(t.spec)
        for m in e["messages"]:
            if m.get("role") == "user":
                text = m.get("content") or ""
                n, own, anywhere = n + 1, own + (text in lines), anywhere + (_template(text) in templates)
    return {"messages": n, "verbatim": own / max(1, n), "any_line": anywhere / max(1, n)}


def world_check(run: Path, world) -> tuple[int, int]:
    """(how many of the evaluations' transcripts score their recorded reward again, of how many)
    on `world`: the tool calls replayed and scored with the required outputs, as evaluation does.
    All of them: the world rebuilt from config.json is the run's."""
    same = n = 0
    for e, t in _evals(run, world):
        if e["info"].get("user_error") or e.get("reward") is None:
            continue
        calls = [c["function"] for m in e["messages"] if m.get("role") == "assistant"
                 for c in m.get("tool_calls") or []]
        env = world.new_env(t)
        for c in calls:
            env.call(c.get("name"), c.get("arguments"))
        same, n = same + (world.score(t, env, e["messages"], check_outputs=True)[0] == e["reward"]), n + 1
        env.close()
    return same, n


def results_pass1(run: Path) -> dict:
    """{evaluation: pass^1} from a run's results.md (its table's pass^1 column), {} without one."""
    path, out, col = run / "results.md", {}, None
    if not path.is_file():
        return out
    for line in path.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if "pass^1" in cells:
            col = cells.index("pass^1")
        elif col is not None and len(cells) > col and not set(cells[col]) <= set("-: "):
            try:
                out[cells[0]] = float(cells[col]) / 100
            except ValueError:
                pass
    return out


def world_of(cfg: dict, seed: int = 0):
    """(the store world exactly as the run built it, its settings): a run's saved config.json, else
    the CPU preset's with world seed `seed`. Keys this version does not know are ignored (an older
    run's); an older run's `tasks` is today's `task_source`."""
    cfg = dict(cfg)
    if "tasks" in cfg and "task_source" not in cfg:
        cfg["task_source"] = {"synthetic": "generated"}.get(cfg["tasks"], cfg["tasks"])
    known = {f.name for f in dataclasses.fields(Config)}
    settings = {k: v for k, v in cfg.items() if k in known} or dict(TINY, synthetic_seed=seed)
    c = dataclasses.replace(Config(), **(settings | {"domains": "store"}))
    return load_worlds(c)["store"], settings | {"synthetic_seed": c.synthetic_seed}


def _row(name: str, d: dict) -> str:
    return f"| {name} | " + " | ".join(f"{100 * d[k]:.1f}" if k in d else "-" for k in COLUMNS) + " |"


def _share(c: Counter, wanted: str) -> str:
    n = sum(v for (w, _), v in c.items() if w == wanted)
    return f"{c[(wanted, wanted)]}/{n}" if n else "-"


def report(world, rules: dict, user: str, seed: int, run: Path | None = None, rules_s: float | None = None) -> str:
    """The markdown report: the rules' table (pass^1 and per behaviour), beside it the cold start's
    data and a run's evaluations; the best customer-blind rule and the run's margin over it; with a
    run, the options it wrote, its customer's words and the world check."""
    cfg = json.loads((run / "config.json").read_text()) if run and (run / "config.json").is_file() else {}
    n = len(world.tasks("test"))
    timed = f" ({len(rules)} rules in {rules_s:.0f} s)" if rules_s is not None else ""
    lines = [f"Store world seed {seed}, {n} held-out tasks; rules against the {user} customer{timed}"
             + (f"; the run's evaluations against its own customer (`user` {cfg.get('user', '?')})" if run else ""),
             "", "| policy | pass^1 | " + " | ".join(BEHAVIOURS) + " | unseen combinations | allowed cancels | "
             "allowed returns | status flow |", "|---" * (len(COLUMNS) + 1) + "|"]
    for name, d in rules.items():
        lines.append(_row(name + (" (customer-blind)" if name in BLIND else ""), {"all": d["pass^1"], **d}))
    data = annotator_right(world)  # its "all": the data's rates weighted by the held-out tasks' behaviours
    lines.append(_row("cold-start data (annotator, train)", data | {"all": imitated(world, data)}))
    evals = run_table(run, world) if run else {}
    official = results_pass1(run) if run else {}
    for name, d in evals.items():
        lines.append(_row(f"run: {name}", d | ({"all": official[name]} if name in official else {})))
    lines += ["", "(default: the shop's default option, 'no longer needed' / 'original payment'; other: the other one, "
              "'ordered by mistake' / 'gift card'; first / last: the first / last option the customer named; "
              "\"transfer if asked\": a hand-off iff the reply to the refusal says human, person or agent. "
              "Allowed cancels / returns: the requests the policy allows, where the option written decides.)", ""]
    blind = [k for k in BLIND if k in rules]
    if blind:
        best = max(blind, key=lambda k: rules[k]["pass^1"])
        lines.append(f"Best customer-blind rule (the best rule that ignores the customer): **{best}**, pass^1 "
                     f"{100 * rules[best]['pass^1']:.1f} %.")
        if len(blind) == len(BLIND):
            name, score = best_constant(world, rules)
            lines.append(f"Best constant policy with the option chosen per request (8 of them): {name}, "
                         f"{100 * score:.1f} %.")
        last = list(official or evals)[-1] if (official or evals) else None
        if last is not None:
            p1 = official.get(last, evals.get(last, {}).get("all"))
            lines.append(f"The run's last evaluation ({last}): pass^1 {100 * p1:.1f} %, "
                         f"{100 * (p1 - rules[best]['pass^1']):+.1f} points over the best customer-blind rule.")
    if not run:
        return "\n".join(lines) + "\n"
    for name, d in evals.items():  # the transcripts' own mean beside results.md's (they agree unless some aborted)
        if name in official and abs(d["all"] - official[name]) > 0.001:
            lines.append(f"(run: {name}: results.md's pass^1 {100 * official[name]:.1f} %, its transcripts' mean "
                         f"{100 * d['all']:.1f} %.)")
    written = options_written(run, world)
    if written:
        lines += ["", "Options the agent wrote on the allowed requests (wrote what was asked / conversations; "
                  "default = the shop's default option):", "",
                  "| evaluation | request | asked default | asked other | options it wrote | constant? |",
                  "|---|---|---|---|---|---|"]
        for name, per in written.items():
            for request, c in sorted(per.items()):
                wrote = Counter()
                for (_, w), v in c.items():
                    wrote[w] += v
                kinds = [w for w in wrote if w != "none"]
                verdict = f"yes: always {kinds[0]}" if len(kinds) == 1 else "no" if kinds else "-"
                lines.append(f"| {name} | {request} | {_share(c, 'default')} | {_share(c, 'other')} | "
                             + ", ".join(f"{w} {v}" for w, v in wrote.most_common()) + f" | {verdict} |")
    share = customer_share(run, world)
    if share["messages"]:
        lines += ["", f"The run's customer in its evaluations: {100 * share['verbatim']:.1f} % of its "
                  f"{share['messages']} messages are verbatim lines the store's script says for that task "
                  f"(demo/worlds/store.py, bank a); {100 * share['any_line']:.1f} % are a script line of any bank, "
                  "with any order id or request."]
        same, k = world_check(run, world)
        lines.append(f"World check: {same} of {k} evaluation transcripts score their recorded reward again on the "
                     "world rebuilt from config.json" + ("." if same == k else " (NOT the run's world?)."))
    return "\n".join(lines) + "\n"


def main(argv=None) -> str:
    """`python -m demo.baselines ARGS` as a function: the report, printed (and written to
    RUN/baselines.md with --run)."""
    p = argparse.ArgumentParser(prog="python -m demo.baselines",
                                description="rule policies and per-behaviour success for the store world")
    p.add_argument("--run", default="", help="a run folder (its config.json: the world; its transcripts: the table); "
                   "the report is written to RUN/baselines.md too")
    p.add_argument("--seed", type=int, default=0, help="the world's seed (without --run)")
    p.add_argument("--user", default="scripted", choices=["scripted", "sampled"])
    p.add_argument("--trials", type=int, default=1, help="trials per task (the scripted customer: every one alike)")
    a = p.parse_args(argv)
    run = Path(a.run) if a.run else None
    if run and not (run / "config.json").is_file():
        sys.exit(f"baselines: no config.json in {run}")
    world, settings = world_of(json.loads((run / "config.json").read_text()) if run else {}, a.seed)
    t0 = time.perf_counter()
    rules = play_rules(world, make_user(a.user), trials=a.trials, seed=settings["synthetic_seed"])
    text = report(world, rules, a.user, settings["synthetic_seed"], run, time.perf_counter() - t0)
    print(text, end="")
    if run:
        (run / "baselines.md").write_text(text)
        print(f"\n(written to {run / 'baselines.md'})")
    return text


if __name__ == "__main__":
    main()
