"""Does the CPU demo learn on every seed? One row per run of README command 1 (a seed is also a world: its orders
and held-out tasks), read from each run's log.jsonl; then the mean and spread of the gain.

    for s in 0 1 2 3 4 5; do python -m demo --seed $s --out_dir runs/seed$s; done
    python demo/probes/seeds.py runs/seed*          # the table the README's "every seed" rows come from

A seed "learns" when its held-out pass^1 after GRPO is >= 15 points above its cold start, with the cold
start inside the preset's band (25-65 %). Every evaluation is listed, so a peak that did not last shows; beside
them the best customer-blind rule on the same held-out tasks (demo.baselines: RL must beat it by reading the
customer), the customer's fidelity, the lowest any evaluation of the run measured (the gate asks >= 95 %), and the
kinds of its mistakes at the last evaluation (store.customer_mistakes, from episodes-rank0.jsonl).
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: demo.baselines


def row(run: Path) -> dict:
    """One run's seed, its evaluations' pass^1 (in order), the gain of the last over the cold start, and the lowest
    customer fidelity of any evaluation after the cold start."""
    recs = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    seed = json.loads((run / "config.json").read_text())["seed"]
    evals = [r for r in recs if r["phase"] == "eval" and r["name"] != "untrained"]
    p1 = [(r["name"], 100 * r["pass^1"]) for r in evals]
    fid = [100 * r["customer_fidelity"] for r in evals if "customer_fidelity" in r]
    done = bool(evals) and evals[-1]["name"].startswith(("GRPO (", "not trained"))
    gain = p1[-1][1] - p1[0][1] if len(p1) > 1 else float("nan")
    last = evals[-1]["name"] if evals else None
    path = run / "episodes-rank0.jsonl"  # the last evaluation's conversations (none yet: a run still in its SFT)
    eps = [e for e in map(json.loads, path.read_text().splitlines()) if e.get("name") == last] if path.is_file() else []
    mistakes = Counter(m for e in eps for m in e["info"].get("customer_mistakes", []))
    return {"seed": seed, "pass1": p1, "gain": gain, "fidelity_min": min(fid, default=float("nan")),
            "finished": done, "learned": done and gain >= 15 and 25 <= p1[0][1] <= 65, "blind": blind_rule(run),
            "mistakes": (", ".join(f"{k} {n}" for k, n in mistakes.most_common()) or "none") + f" (of {len(eps)})"}


def blind_rule(run: Path) -> float:
    """pass^1 of the best customer-blind rule on the run's held-out tasks, against the store's script."""
    from demo.baselines import BLIND, make_user, play_rules, world_of

    world, settings = world_of(json.loads((run / "config.json").read_text()))
    rules = play_rules(world, make_user("scripted"), seed=settings["synthetic_seed"])
    return 100 * max(rules[k]["pass^1"] for k in BLIND)


def table(runs: list[Path]) -> str:
    rows = sorted((row(r) for r in runs if (r / "log.jsonl").is_file()), key=lambda r: r["seed"])
    names = max((r["pass1"] for r in rows), key=len, default=[])
    lines = ["| seed | " + " | ".join(n for n, _ in names) + " | gain | best blind rule | lowest fidelity | >= +15 | "
             "customer's mistakes, last evaluation |", "|---" * (len(names) + 6) + "|"] if rows else []
    for r in rows:
        cells = " | ".join([f"{v:.1f}" for _, v in r["pass1"]] + ["-"] * (len(names) - len(r["pass1"])))
        lines.append(f"| {r['seed']} | {cells} | {r['gain']:+.1f} | {r['blind']:.1f} | {r['fidelity_min']:.1f} | "
                     f"{'yes' if r['learned'] else 'no' if r['finished'] else 'unfinished'} | {r['mistakes']} |")
    gains = [r["gain"] for r in rows if r["finished"]]
    if gains:
        spread = f", sd {statistics.stdev(gains):.1f}" if len(gains) > 1 else ""
        lines.append(f"\n{len(gains)} finished run(s): gain mean {statistics.mean(gains):+.1f} points{spread}, "
                     f"min {min(gains):+.1f}, max {max(gains):+.1f}; {sum(r['learned'] for r in rows)} of "
                     f"{len(gains)} gained >= 15 points from a cold start in 25-65 %")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit("usage: python demo/probes/seeds.py RUN_DIR [RUN_DIR ...]")
    print(table([Path(a) for a in sys.argv[1:]]))
