"""Evaluation: pass^k on held-out tasks, with the paper's diagnostics (turns, tool-call mix, stop reasons).

    python eval.py --model runs/muarl/final --domain synthetic --user scripted          # a local model, greedy
    python eval.py --agent openai --agent_model gpt-4.1 --domain retail --user llm ...   # any chat endpoint
    python eval.py --agent oracle --domain retail,airline --split test                 # replays gold actions

pass^k (tau-bench): run every task k times; with c successes out of n trials, a task contributes C(c, k) / C(n, k),
the chance that k trials drawn without replacement all succeed; pass^k is the mean over tasks. MUA-RL reports pass^1,
the success rate (greedy agent, user at temperature 0, mean of 4 runs). A greedy local agent with the scripted user
plays every trial alike; `--temperature 1` samples the agent (trial j: its own seed), so pass^k measures consistency.

Every conversation runs through rollout.rollout(), the loop training uses, then rollout.score(). Three agents
(agents.py): local, a model through an engine (rollout.PolicyAgent, as in training); openai, any OpenAI-compatible
endpoint, message-level with its own tool calling; oracle, the gold actions replayed (a harness check: all score 1).

With several domains (`--domain retail,telecom`) the table has one row per domain, then all of them together; its
completion column is telecom's task completion rate (the share of a task's assertions met, the paper's second figure).
In telecom the customer acts on its phone: the scripted one (domains/telecom_user.py) or an LLM with the user tools.

Before any episode, every endpoint in use (customer, agent) is checked once (preflight.py), and the run says where
the tau2 data came from; transcripts are written batch by batch. An evaluation in which every episode aborted
(an endpoint failed throughout) exits non-zero with the first error.

Departure from tau2's evaluation: the reward is the DB check plus, with --check_outputs (default on here),
the required-output check; tau2's newest NL assertions need an LLM judge and are not run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from collections import Counter

from tqdm import tqdm

from agents import MessageAgent, OracleAgent, openai_act
from config import Config, ConfigError, add_flags, field_problems, make_customer, model_problem
from domains import BENCHES, DEFAULT, DOMAINS, load_worlds, script_for
from domains.tau2_data import provenance
from engine import make_engine
from models import load_policy, load_tokenizer
from preflight import PreflightError, check_endpoint, endpoint, prompt_warning
from rollout import Episode, PolicyAgent, RolloutConfig, TrajectoryLog, rollout, score
from tools import TRANSFER_TOOL
from user_sim import USERS, FixedUser

# ---------------------------------------------------------------------------------------------------------------
# Metrics


def pass_hat_k(successes: dict[str, list[bool]], k: int) -> float:
    """tau-bench's pass^k: mean over tasks of C(c, k) / C(n, k)."""
    vals = [math.comb(sum(s), k) / math.comb(len(s), k) for s in successes.values() if len(s) >= k]
    return sum(vals) / len(vals) if vals else float("nan")


def summarize(episodes: list[Episode], trials: int) -> dict:
    """pass^1..k and the paper's diagnostics. An aborted episode (the customer's endpoint or the agent's failed)
    says nothing about the agent: it is counted, but left out of pass^k and the means, not scored as a 0."""
    scored = [e for e in episodes if not e.aborted]
    by_task: dict[str, list[bool]] = {}
    for e in scored:
        by_task.setdefault(e.task.id, []).append(e.reward == 1.0)
    calls, n = Counter(c for e in scored for c in e.tool_calls), max(1, len(scored))
    shares: dict[str, list[float]] = {}  # the paper's task completion rate: share of a task's assertions met (telecom)
    for e in (e for e in scored if "completion" in e.info):
        shares.setdefault(e.task.domain, []).append(e.info["completion"])
    n_calls = max(1, sum(calls.values()))
    # The paper's Table 3 diagnostics: how long conversations run, and the share of think / calculate / transfer
    # among tool calls (RL raised think use and lowered needless transfers to a human).
    return {**{f"pass^{k}": pass_hat_k(by_task, k) for k in range(1, trials + 1)},
            "episodes": len(episodes), "aborted": len(episodes) - len(scored),
            "avg_turns": sum(e.turns for e in scored) / n, "avg_agent_turns": sum(e.agent_turns for e in scored) / n,
            "calls_per_episode": sum(calls.values()) / n, "think_rate": calls["think"] / n_calls,
            "calculate_rate": calls["calculate"] / n_calls, "transfer_rate": calls[TRANSFER_TOOL] / n_calls,
            "stop_reasons": dict(Counter(e.stop_reason for e in episodes)), "tool_mix": dict(calls.most_common()),
            "completion": {d: sum(v) / len(v) for d, v in shares.items()},
            **customer_fidelity([e.info.get("customer_mistakes") for e in scored], [e.reward for e in scored])}


def customer_fidelity(mistakes: list, rewards: list[float]) -> dict:
    """Share of checkable episodes whose customer kept to its instructions, and share of all scored episodes that
    failed with a customer mistake in them (the reward then says nothing sure about the agent). {} if none checkable."""
    checked = [(m, r) for m, r in zip(mistakes, rewards) if m is not None]
    return {"customer_fidelity": sum(not m for m, _ in checked) / len(checked),
            "customer_faults": sum(bool(m) and r < 1 for m, r in checked) / len(checked)} if checked else {}


def format_table(rows: list[tuple[str, dict]], trials: int = 1) -> str:
    """Paper-style table: one row per (model, metrics); pass^k in percent, rates to 3 places, counts as they are."""
    cols = [f"pass^{k}" for k in range(1, trials + 1)] + ["avg_turns", "calls_per_episode", "think_rate",
                                                           "calculate_rate", "transfer_rate", "aborted"]
    cols += [c for c in ("customer_fidelity", "customer_faults") if any(c in m for _, m in rows)]  # (store world)
    lines = ["| model | " + " | ".join(cols) + " | completion % | stop reasons |", "|" + "---|" * (len(cols) + 3)]
    for name, m in rows:
        cells = ["-" if isinstance(v, float) and math.isnan(v) else f"{100 * v:.1f}" if c.startswith("pass") else
                 f"{v:.3f}" if isinstance(v, float) else str(v)  # "-": not measured (e.g. pass^4 of a 1-trial row)
                 for c, v in zip(cols, (m.get(c, float("nan")) for c in cols))]
        done = ", ".join(f"{d}:{100 * v:.1f}" for d, v in sorted(m.get("completion", {}).items())) or "-"
        stops = ", ".join(f"{k}:{v}" for k, v in sorted(m.get("stop_reasons", {}).items(), key=lambda kv: -kv[1]))
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {done} | {stops} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------
# Evaluation: the training rollout, then the score; its command line


def evaluate(tasks, worlds, agent, user, cfg: RolloutConfig, trials: int = 1, batch: int = 64,
             check_outputs: bool = True, progress: bool = True, log=None):
    """Run every task `trials` times through rollout() (batches of `batch` tasks), score; (metrics, episodes).
    Episode seeds depend on (cfg.seed, task, trial) only, so batching changes nothing a trial samples. `log`: each
    batch's transcripts are written as soon as it is scored. The bar counts finished episodes, inside a batch too."""
    episodes = []
    with tqdm(total=len(tasks) * trials, desc="eval", disable=not progress, leave=False, mininterval=10) as bar:
        for s in range(0, len(tasks), batch):
            done = len(episodes)
            eps = rollout(tasks[s : s + batch], trials, worlds, agent, user, cfg,
                          progress=lambda k, n: bar.update(done + k - bar.n))
            episodes += score(eps, worlds, check_outputs)
            if log is not None:  # a function of a batch of episodes (eval.py: a TrajectoryLog's write)
                log(eps)
    return summarize(episodes, trials), episodes


# The flags eval.py shares with muarl.py, declared once (config.Config); evaluation's own defaults beside them
SHARED = ("model", "engine", "user", "user_model", "user_base_url", "user_api_key", "allow_insecure_http",
          "user_temperature", "user_max_tokens", "user_serve", "user_concurrency", "user_timeout", "user_retries",
          "user_backoff", "preflight", "data_dir", "max_turns", "max_new_tokens", "max_context", "tools_in_prompt",
          "temperature", "top_p", "seed", "synthetic_seed")
DEFAULTS = {**{k: getattr(Config, k) for k in SHARED}, "model": "", "engine": "hf", "user": "scripted",
            "user_temperature": 0.0, "user_max_tokens": 512, "user_serve": "", "temperature": 0.0, "top_p": 1.0,
            "tools_in_prompt": True, "seed": 0, "synthetic_seed": 0}  # greedy agent; the paper's caps (config.py)


def parse_args(argv=None) -> argparse.Namespace:
    """The command line, checked: every bad value or combination is a ConfigError naming the flag, before any work."""
    p = argparse.ArgumentParser(description="Evaluate an agent: pass^k, turns, tool mix, stop reasons")
    p.add_argument("--agent", default="local", choices=["local", "openai", "oracle"])
    add_flags(p, SHARED, DEFAULTS)  # --model: a local model (agent=local); --temperature: the agent's (0: greedy)
    p.add_argument("--agent_model", default="", help="model name at the endpoint (agent=openai)")
    for name in ("agent_base_url", "agent_api_key"):
        p.add_argument(f"--{name}", default="")  # empty: the environment's ($OPENAI_BASE_URL, ...) or the default
    p.add_argument("--domain", default=DEFAULT, help="comma-separated names from domains.DOMAINS")
    p.add_argument("--bench", default="", choices=["", *BENCHES], help="a benchmark of domains.BENCHES: its domain, "
                   "its conversation rules, its figures (e.g. BFCL's accuracy per category); replaces --domain")
    p.add_argument("--category", default="", help="--bench: comma-separated categories (bfcl_multi_turn: base, "
                   "miss_func, miss_param, long_context; empty = all)")
    p.add_argument("--split", default="test")
    p.add_argument("--tasks", type=int, default=0, help="first N tasks of the split (0 = all)")
    p.add_argument("--trials", type=int, default=1, help="k: runs per task (pass^1 ... pass^k)")
    p.add_argument("--check_outputs", type=int, default=1)
    p.add_argument("--out", default="runs/eval/transcripts.jsonl", help="this evaluation's transcripts (replaced)")
    p.error = lambda message: (_ for _ in ()).throw(ConfigError(message))  # a bad type: one line, like the rest
    a = p.parse_args(argv)
    a.domain = BENCHES[a.bench].domain if a.bench else a.domain
    a.user_down_s, a.user_gate = float("inf"), 0.0  # (training's: an evaluation has no steps and no gate)
    unknown = [d for d in a.domain.split(",") if d not in DOMAINS]
    checks = [  # (holds, what to say otherwise): the first that fails is reported, as in config.validate
        (not unknown, f"--domain: unknown domain(s) {unknown}: choose from {', '.join(DOMAINS)}"),
        (a.trials >= 1 and a.tasks >= 0, f"--trials must be >= 1 and --tasks >= 0, got {a.trials} and {a.tasks}"),
        *field_problems(a, SHARED[1:]),  # the shared flags' own ranges (config.py); --model is checked below
        (a.engine != "auto", "--engine must be hf or vllm"),
        (a.check_outputs in (0, 1), "--check_outputs is 0 or 1"),
        (a.agent != "local" or a.model, "--agent local needs --model (a model folder or a hub id)"),
        (a.agent == "local" or not a.model, f"--model is for --agent local (got --agent {a.agent})"),
        (a.agent != "openai" or a.agent_model, "--agent openai needs --agent_model"),
        (a.agent == "openai" or not a.agent_model, f"--agent_model is for --agent openai (got --agent {a.agent})"),
        *[(False, m) for m in [model_problem(a.model) if a.agent == "local" else None] if m],
    ]
    if (message := next((m for ok, m in checks if not ok), None)) is not None:
        raise ConfigError(message)
    return a


def main(argv=None):
    a = parse_args(argv)
    bench = BENCHES.get(a.bench)
    # the worlds as muarl.py builds them (generated worlds: the held-out tasks are a function of the seed alone)
    worlds = load_worlds(Config(domains=a.domain, data_dir=a.data_dir, synthetic_seed=a.synthetic_seed,
                                synthetic_train=0))  # (missing data: FileNotFoundError, one line at __main__)
    tasks = [t for w in worlds.values() for t in w.tasks(a.split)]
    tasks = (bench.select(tasks, a.category) if bench else tasks)[: a.tasks or None]  # --tasks 0: all
    if not tasks:  # an empty set would print pass^1 = nan and exit 0
        raise ConfigError(f"no tasks in split {a.split!r} of {a.domain} (splits: train, test, all)")
    cfg = RolloutConfig(max_turns=a.max_turns, max_new_tokens=a.max_new_tokens, max_context=a.max_context,
                        temperature=a.temperature, top_p=a.top_p, seed=a.seed, tools_in_prompt=bool(a.tools_in_prompt))
    cfg = dataclasses.replace(cfg, **bench.rollout) if bench else cfg  # e.g. BFCL runs every call of a step
    # The oracle's conversation needs no customer beyond its opening line: FixedUser only says it is done (a bench's
    # customer, e.g. BFCL's scripted turns, plays it to the end).
    if getattr(USERS.get(a.user), "scripted", False) and a.agent != "oracle":  # a task no script plays would abort
        try:
            for t in tasks:
                script_for(t)
        except ValueError:
            raise ConfigError(f"the scripted customer does not play {a.domain}'s tasks: use --user llm") from None
    for source in provenance(worlds):  # where the tau2 data came from
        print(f"[data] {source['domain']}: {source['path']} (sha256 {source['sha256']}; {source['revision']})")
    # the customer, as muarl.py builds it (a served model: started at once, stopped at the end and at exit)
    user = FixedUser() if a.agent == "oracle" and not (bench and bench.oracle) else \
        make_customer(a, os.path.dirname(a.out) or ".")
    if a.agent == "openai":  # the agent's endpoint and key under user_sim.endpoint's rule (a key goes to its own host)
        a.agent_base_url, a.agent_api_key = endpoint(a.agent_base_url or None, a.agent_api_key or None,
                                                     bool(a.allow_insecure_http), "--agent")
    try:  # each endpoint once, before any episode: a misconfigured one is one line, not a table of aborted episodes
        user.check(tasks)  # (an endpoint's preflight; a served model's vLLM and folder)
        user.start(tasks)
        if a.preflight and a.agent == "openai":
            w = max(worlds.values(), key=lambda w: len(json.dumps(w.tool_schemas())))  # the longest prompt
            first = [{"role": "system", "content": w.rules}, {"role": "user", "content": "Hello"}]
            check_endpoint("agent", a.agent_model, first, a.max_new_tokens, None if bench and bench.agent else
                           w.tool_schemas(), a.agent_base_url or None, a.agent_api_key or None)  # (ACEBench: text)
    except PreflightError as e:  # (a served model that cannot start: ServeError, an OSError, one line in __main__)
        raise ConfigError(str(e)) from None
    t0 = time.time()
    if a.agent == "local":
        # vLLM reads the weights itself: only the tokenizer here (a transformers copy of 32B would be 131 GB of RAM)
        model, tok = load_policy(a.model) if a.engine == "hf" else (None, load_tokenizer(a.model))
        agent, name = PolicyAgent(make_engine(a.engine, model=model, tokenizer=tok, model_path=a.model), tok), a.model
        if warning := prompt_warning(tok, worlds, a.max_context, a.max_new_tokens, bool(a.tools_in_prompt)):
            print(warning)
    elif a.agent == "oracle":
        agent, name = MessageAgent(bench.oracle if bench and bench.oracle else OracleAgent), "oracle (gold actions)"
    else:
        act = openai_act(a.agent_model, a.agent_base_url, a.agent_api_key, a.temperature, a.max_new_tokens)
        agent, name = MessageAgent(lambda task: act), a.agent_model
    if bench is not None and bench.agent is not None:  # a benchmark speaking its own protocol brings its agent
        agent = bench.agent(a.agent, engine=getattr(agent, "engine", None), tokenizer=getattr(agent, "tok", None),
                            model=a.agent_model, base_url=a.agent_base_url, api_key=a.agent_api_key,
                            max_new_tokens=a.max_new_tokens, temperature=a.temperature)
    log = TrajectoryLog(a.out)
    log.path.unlink(missing_ok=True)  # (TrajectoryLog appends, as training's resumable log must: here, one evaluation)
    metrics, eps = evaluate(tasks, worlds, agent, user, cfg, trials=a.trials, check_outputs=bool(a.check_outputs),
                            log=lambda batch: log.write(batch, phase="eval", agent=name))
    user.close()
    print(f"{len(tasks)} tasks x {a.trials} trials on {a.domain}/{a.split} in {time.time() - t0:.1f}s; "
          f"transcripts: {a.out}")
    # one row per domain, as the paper's table has (pass^1..k, completion rate), then all domains together
    domains = sorted({t.domain for t in tasks})
    rows = [(f"{name} [{d}]", summarize([e for e in eps if e.task.domain == d], a.trials)) for d in domains]
    print(format_table(rows + [(f"{name} [all]", metrics)] if len(domains) > 1 else [(name, metrics)], a.trials))
    if bench is not None:  # the benchmark's own figures, computed as it computes them (BFCL: accuracy per category)
        extra, text = bench.summary(eps)
        metrics.update(extra)
        print(text)
    errors = [e.info.get(e.stop_reason) for e in eps if e.aborted]
    if errors and len(errors) == len(eps):  # nothing was measured: say why, and fail
        raise ConfigError(f"every episode ({len(eps)}) aborted; first error: {errors[0]} (transcripts: {a.out})")
    if errors:
        print(f"warning: {len(errors)} of {len(eps)} episodes aborted (not scored); first error: {errors[0]}")
    return metrics


if __name__ == "__main__":
    try:
        main()
    except (ImportError, OSError, ValueError) as e:  # bad input (ConfigError is a ValueError): one line, status 2
        print(f"eval: {e}", file=sys.stderr)
        sys.exit(2)
