"""A benchmark's row: what `eval.py --bench NAME` needs to know about an evaluation-only benchmark.

A benchmark runs on a world of domains.DOMAINS (its tasks, its tools, its scorer, and, for ACEBench, its customer)
and adds what the world alone does not say: the conversation rules it fixes, the figures it reports, the gold replay
that checks the harness, and, for ACEBench, its own agent protocol. domains.BENCHES is the table of these rows;
eval.py reads it and names none.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable


@dataclass(frozen=True)
class Bench:
    """One row of domains.BENCHES: a benchmark `eval.py --bench NAME` runs on a domain of DOMAINS, with the
    conversation rules it fixes and the figures it reports (e.g. BFCL's accuracy per category)."""

    domain: str  # the DOMAINS row whose world and tasks it runs
    summary: Callable[[list], tuple[dict, str]]  # scored episodes -> (its figures, the text eval.py prints)
    select: Callable[[list, str], list] = lambda tasks, category: tasks  # --category: which tasks
    oracle: Callable | None = None  # task -> act(messages, tools): the gold replay (agents.MessageAgent)
    rollout: dict = field(default_factory=dict)  # RolloutConfig fields the benchmark fixes (e.g. all_calls)
    agent: Callable | None = None  # its own agent protocol (ACEBench): (kind, **settings) -> a rollout Agent


if __name__ == "__main__":
    # A toy row: a benchmark on the synthetic world that reports how many of its episodes scored 1.
    toy = Bench("synthetic", summary=lambda eps: ({"solved": sum(e.reward == 1 for e in eps)}, "solved: ..."),
                rollout={"all_calls": True})
    print(toy)
