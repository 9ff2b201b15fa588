"""Evaluation: pass^k on held-out tasks, with the paper's diagnostics (turns, tool-call mix, stop
reasons).

    python eval.py --model runs/muarl/final                      # a trained run, with that run's own settings
    python eval.py --model Qwen/Qwen3-8B --domains retail,airline,telecom --user_model gpt-4.1
    python eval.py --agent openai --agent_model gpt-4.1 --domains retail --user_model gpt-4.1
    python eval.py --agent oracle --domains retail,airline       # the gold actions replayed: every task scores 1

pass^k (tau-bench): run every task k times; with c successes out of n trials, a task contributes
C(c, k) / C(n, k), the chance that k trials drawn without replacement all succeed; pass^k is the
mean over tasks. MUA-RL reports pass^1 with the customer at temperature 0, the mean of 4 runs: here
4 trials a task by default, and pass^1..4.

Every conversation runs through rollout.rollout(), the loop training uses, then rollout.score().
Three agents:
local (a model through an engine, rollout.PolicyAgent, as in training); openai (any
OpenAI-compatible endpoint, message-level, with its own tool calling); oracle (the gold actions
replayed: a harness check). `--model RUN/final` takes the settings that run trained with (its
worlds, turn and token limits, customer) unless a flag says otherwise. In tau2's worlds the
conversation keeps tau2's own limits (200 messages, 10 tool errors: an episode cut by either scores
0) and the customer reads tau2's own guidelines (--user_prompt auto).

Departure from tau2's evaluation: the reward is the database check plus the required outputs
(--check_outputs); tau2's newest natural-language assertions need an LLM judge and are not run.
"""

from __future__ import annotations

import sys

from plumbing.flags import ConfigError

# the command line first: --help and a bad flag answer before torch loads
if __name__ == "__main__":
    from evaluation.flags import parse_args

    try:
        CLI = parse_args()
    except ConfigError as e:
        print(f"eval: config error: {e}", file=sys.stderr)
        sys.exit(2)

import math  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Callable  # noqa: E402

from tqdm import tqdm  # noqa: E402

from domains import BENCHES, load_worlds  # noqa: E402
from domains.tau2_data import provenance  # noqa: E402
from plumbing import view  # noqa: E402
from plumbing.preflight import RunStopped  # noqa: E402
from plumbing.runlog import customer_fidelity  # noqa: E402
from rollout import Episode, RolloutConfig, TrajectoryLog, rollout, score  # noqa: E402
from tools import TRANSFER_TOOL  # noqa: E402

# --------------------------------------------------------------------------------------------------
# Metrics


def pass_hat_k(successes: dict[str, list[bool]], k: int) -> float:
    """tau-bench's pass^k: mean over tasks of C(c, k) / C(n, k)."""
    vals = [math.comb(sum(s), k) / math.comb(len(s), k) for s in successes.values() if len(s) >= k]
    return sum(vals) / len(vals) if vals else float("nan")


def summarize(episodes: list[Episode], trials: int) -> dict:
    """pass^1..k and the paper's diagnostics. An aborted episode (the customer's endpoint or the
    agent's failed) says nothing about the agent: it is counted, but left out of pass^k and the
    means, not scored as a 0."""
    scored = [e for e in episodes if not e.aborted]
    by_task: dict[str, list[bool]] = {}
    for e in scored:
        by_task.setdefault(e.task.id, []).append(e.reward == 1.0)
    calls, n = Counter(c for e in scored for c in e.tool_calls), max(1, len(scored))
    # the paper's task completion rate: share of a task's assertions met
    shares: dict[str, list[float]] = {}
    for e in (e for e in scored if "completion" in e.info):
        shares.setdefault(e.task.domain, []).append(e.info["completion"])
    n_calls = max(1, sum(calls.values()))
    # The paper's Table 3 diagnostics: how long conversations run, and the share of think /
    # calculate / transfer among tool calls (RL raised think use and lowered needless transfers to a
    # human).
    return {**{f"pass^{k}": pass_hat_k(by_task, k) for k in range(1, trials + 1)},
            "episodes": len(episodes), "aborted": len(episodes) - len(scored),
            "avg_turns": sum(e.turns for e in scored) / n, "avg_agent_turns": sum(e.agent_turns for e in scored) / n,
            "calls_per_episode": sum(calls.values()) / n, "think_rate": calls["think"] / n_calls,
            "calculate_rate": calls["calculate"] / n_calls, "transfer_rate": calls[TRANSFER_TOOL] / n_calls,
            "stop_reasons": dict(Counter(e.stop_reason for e in episodes)), "tool_mix": dict(calls.most_common()),
            "completion": {d: sum(v) / len(v) for d, v in shares.items()},
            **customer_fidelity([e.info.get("customer_mistakes") for e in scored], [e.reward for e in scored])}


def format_table(rows: list[tuple[str, dict]], trials: int = 1) -> str:
    """Paper-style table: one row per (model, metrics); pass^k in percent, rates to 3 places, counts
    as they are."""
    cols = [f"pass^{k}" for k in range(1, trials + 1)] + ["avg_turns", "calls_per_episode", "think_rate",
                                                           "calculate_rate", "transfer_rate", "aborted"]
    cols += [c for c in ("customer_fidelity", "customer_faults") if any(c in m for _, m in rows)]
    lines = ["| model | " + " | ".join(cols) + " | completion % | stop reasons |", "|" + "---|" * (len(cols) + 3)]
    for name, m in rows:
        cells = ["-" if isinstance(v, float) and math.isnan(v) else f"{100 * v:.1f}" if c.startswith("pass") else
                 f"{v:.3f}" if isinstance(v, float) else str(v)  # "-": not measured (pass^4 of a 1-trial row)
                 for c, v in zip(cols, (m.get(c, float("nan")) for c in cols))]
        done = ", ".join(f"{d}:{100 * v:.1f}" for d, v in sorted(m.get("completion", {}).items())) or "-"
        stops = ", ".join(f"{k}:{v}" for k, v in sorted(m.get("stop_reasons", {}).items(), key=lambda kv: -kv[1]))
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {done} | {stops} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# Evaluation: the training rollout, then the score


def evaluate(tasks, worlds, agent, user, cfg: RolloutConfig, trials: int = 1, batch: int = 64,
             check_outputs: bool = True, progress: bool = True, log=None):
    """Run every task `trials` times through rollout() (batches of `batch` tasks), score; (metrics,
    episodes). Episode seeds depend on (cfg.seed, task, trial) only, so batching changes nothing a
    trial samples. `log`: each batch's transcripts are written as soon as it is scored. The bar
    counts finished episodes, with their rate."""
    episodes = []
    with tqdm(total=len(tasks) * trials, desc="eval", unit="episode", disable=not progress, mininterval=1) as bar:
        for s in range(0, len(tasks), batch):
            done = len(episodes)
            eps = rollout(tasks[s : s + batch], trials, worlds, agent, user, cfg,
                          progress=lambda k, n: bar.update(done + k - bar.n))
            episodes += score(eps, worlds, check_outputs)
            # a function of a batch of episodes (eval.py: a TrajectoryLog's write)
            if log is not None:
                log(eps)
    return summarize(episodes, trials), episodes


def customer_gate(name: str, m: dict, gate: float, log, first: bool) -> None:
    """An evaluation's customer fidelity held against --user_gate: below it at the evaluation RL
    starts from (`first`), RunStopped before any GRPO step; at a later one, named (the policy
    drifted into conversations the customer plays badly)."""
    if m.get("customer_fidelity", 1) >= gate:
        return
    line = (f"in {name}'s conversations the customer kept to its instructions in "
            f"{100 * m['customer_fidelity']:.1f} % of them, below --user_gate {gate:g}")
    log({"phase": "stage", "stage": "customer_fidelity", "name": name, "ok": False})
    if first:
        raise RunStopped(f"customer gate: {line}: no GRPO step is trained against this customer")
    print(f"[customer] warning: {line}", flush=True)


@dataclass
class HeldOut:
    """A training run's evaluations: its held-out tasks played by the greedy agent (rank 0), each
    evaluation's pass^1..k kept in `results` under its name, logged, and its conversations written to
    `episodes` and the run's page. `gate`: the lowest customer fidelity accepted (0: none); below it at
    the evaluation RL starts from the run stops before any GRPO step, at a later one it is named."""

    tasks: list  # the held-out tasks ([]: no evaluation)
    worlds: dict
    user: object  # the run's customer (user_sim.User)
    rollout: RolloutConfig  # the run's limits, the agent greedy, one seed
    trials: int  # k of pass^k: each task played this many times
    out: Path  # the run's folder: view.html is written there
    episodes: TrajectoryLog  # the run's transcripts
    log: Callable  # the run's log (plumbing.runlog.RunLog)
    gate: float = 0.0
    results: dict = field(default_factory=dict)  # name -> metrics, in the order measured

    def run(self, name: str, agent, step: int = 0, trials: int | None = None, first: bool = False) -> dict:
        """pass^1..k of `agent` (a PolicyAgent over the run's engine, or over the untrained model) after
        GRPO step `step`, logged with the global step. `first`: the evaluation RL starts from."""
        k = trials or self.trials
        m, eps = evaluate(self.tasks, self.worlds, agent, self.user, self.rollout, trials=k, progress=False)
        self.episodes.write(eps, phase="eval", name=name)
        self.results[name] = m
        self.log({"phase": "eval", "name": name, "step": step, **m, "user": self.user.take_stats()})
        extra = f", pass^{k} {100 * m[f'pass^{k}']:.1f}%" if k > 1 else ""
        fid = f"; customer fidelity {100 * m['customer_fidelity']:.1f}%" if "customer_fidelity" in m else ""
        print(f"[eval] {name}: pass^1 {100 * m['pass^1']:.1f}%{extra} over {len(self.tasks)} held-out tasks "
              f"x {k}{fid}", flush=True)
        customer_gate(name, m, self.gate, self.log, first)
        self.user.after(name, m, self.log)  # (a customer down too long stops the run here)
        view.write(self.out)  # out/view.html: every conversation so far, in one offline page
        return m


def main(argv=None, a=None) -> dict:
    """`python eval.py ARGS` as a function (or its parsed arguments `a`): the worlds and tasks, the
    customer, the agent, the table (one row per domain, then all of them together)."""
    from evaluation.flags import make_agent, parse_args, rules, start_customer

    a = a or parse_args(argv)
    bench = BENCHES.get(a.bench)
    worlds = load_worlds(a)  # (missing data: FileNotFoundError, one line at __main__)
    tasks = [t for w in worlds.values() for t in w.tasks(a.split)]
    tasks = (bench.select(tasks, a.category) if bench else tasks)[: a.eval_tasks or None]  # 0: all
    if not tasks:  # an empty set would print pass^1 = nan and exit 0
        raise ConfigError(f"no tasks in split {a.split!r} of {a.domains} (train, test, all)")
    cfg = rules(a, worlds, tasks, bench)  # tau2's caps in its worlds, a benchmark's own rules
    for source in provenance(worlds):  # where the tau2 data came from
        print(f"[data] {source['domain']}: {source['path']} (sha256 {source['sha256']}; "
              f"{source['revision']})")
    user = start_customer(a, tasks, worlds, bench)  # each endpoint checked once, before any episode
    t0 = time.time()
    agent, name = make_agent(a, worlds, bench)
    log = TrajectoryLog(a.out)
    if log.path.is_file():  # the log appends, as training's must: here one evaluation (a device such
        log.path.unlink()  # as --out /dev/null is written to, never removed)
    metrics, eps = evaluate(tasks, worlds, agent, user, cfg, trials=a.eval_trials,
                            check_outputs=bool(a.check_outputs),
                            log=lambda batch: log.write(batch, phase="eval", agent=name))
    user.close()
    if log.path.is_file():  # view.html beside the transcripts, one offline page
        view.write(log.path.parent, log.path)
    print(f"{len(tasks)} tasks x {a.eval_trials} trials on {a.domains}/{a.split} in "
          f"{time.time() - t0:.1f}s; transcripts: {a.out}")
    domains = sorted({t.domain for t in tasks})
    rows = [(f"{name} [{d}]", summarize([e for e in eps if e.task.domain == d], a.eval_trials))
            for d in domains] + [(f"{name} [all]", metrics)]
    print(format_table(rows if len(domains) > 1 else [(name, metrics)], a.eval_trials))
    if bench is not None:  # the benchmark's own figures, computed as it computes them
        extra, text = bench.summary(eps)
        metrics.update(extra)
        print(text)
    errors = [e.info.get(e.stop_reason) for e in eps if e.aborted]
    if errors and len(errors) == len(eps):  # nothing was measured: say why, and fail
        raise ConfigError(f"every episode ({len(eps)}) aborted; first error: {errors[0]} "
                          f"(transcripts: {a.out})")
    if errors:
        print(f"warning: {len(errors)} of {len(eps)} episodes aborted (not scored); first error: "
              f"{errors[0]}")
    return metrics


if __name__ == "__main__":
    try:
        main(a=CLI)
    except (ImportError, OSError, ValueError) as e:  # bad input (ConfigError too): one line, exit 2
        print(f"eval: {e}", file=sys.stderr)
        sys.exit(2)
