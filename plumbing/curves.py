"""The training dynamics of a run, drawn: one small panel per curve, from its log.jsonl
(`runs/<name>/curves.png`).

MUA-RL's paper shows how its agents changed under RL (its training-dynamics figure): success goes
up, turns settle, and the needless uses of generic tools (asking a human to take over, thinking out
loud for nothing) are pruned. The same curves for any muarl run, read from the GRPO step records of
its log, with the held-out evaluations marked:

    reward                              mean outcome reward of the step's scored episodes (dots: held-out pass^1)
    all_correct / all_wrong groups      the groups GRPO cannot learn from (every episode the same reward)
    transfer_rate, think_rate           shares of tool calls that hand the customer over / only think
    turns                               tool executions + customer replies per episode
    customer_fidelity                   share of episodes whose customer kept to its instructions (store world)

    python -m plumbing.curves runs/muarl      # redraws runs/muarl/curves.png from runs/muarl/log.jsonl

matplotlib is an optional extra (`pip install matplotlib`): without it, `draw` says so in one line
and returns None; a run never fails for want of a picture.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

PANELS = [("reward", "reward (dots: held-out pass^1)"), ("all_correct_groups", "all-correct groups"),
          ("all_wrong_groups", "all-wrong groups"), ("transfer_rate", "transfer rate (of calls)"),
          ("think_rate", "think rate (of calls)"), ("turns", "turns per episode"),
          ("customer_fidelity", "customer fidelity")]


def read_log(path: Path) -> tuple[list[dict], list[dict]]:
    """(GRPO step records, evaluation records) of a log.jsonl; lines that are not JSON (a crash
    mid-write) skipped; no file (a run that logged nothing) is no records."""
    steps, evals = [], []
    for line in path.read_text(errors="replace").splitlines() if path.is_file() else []:
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue
        if r.get("phase") == "grpo":
            steps.append(r)
        elif r.get("phase") == "eval":
            evals.append(r)
    return steps, evals


def draw(run_dir: str | Path) -> Path | None:
    """Write run_dir/curves.png from run_dir/log.jsonl; return its path, or None (no matplotlib, no
    steps)."""
    run_dir = Path(run_dir)
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display needed (a server, CI, a laptop over ssh)
        import matplotlib.pyplot as plt
    except ImportError:
        print("curves: matplotlib is not installed (pip install matplotlib); no curves.png drawn", flush=True)
        return None
    steps, evals = read_log(run_dir / "log.jsonl")
    if not steps:
        print(f"curves: no GRPO steps in {run_dir / 'log.jsonl'} yet; nothing to draw", flush=True)
        return None
    panels = [(k, title) for k, title in PANELS if any(k in r for r in steps)]
    cols, rows = 4, (len(panels) + 3) // 4
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.4 * rows), squeeze=False)
    for ax, (key, title) in zip(axes.flat, panels):
        xs = [r["step"] + 1 for r in steps if isinstance(r.get(key), (int, float))]
        ys = [r[key] for r in steps if isinstance(r.get(key), (int, float))]
        ax.plot(xs, ys, lw=1.2)
        if key == "reward":  # held-out pass^1 at each evaluation, at the step it measured
            # each eval record carries the GRPO step of the model it measured; older logs: read it from the name
            pts = [(e["step"] if "step" in e else _eval_step(e), e["pass^1"]) for e in evals if "pass^1" in e]
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=14, color="black", zorder=3)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("GRPO step", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.tight_layout()
    out = run_dir / "curves.png"
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _eval_step(record: dict) -> int:
    # older logs, before eval records carried "step":
    # "GRPO step 10" -> 10; "GRPO (30 steps)" -> 30; "cold start" / "untrained" -> 0
    words = record.get("name", "").replace("(", " ").split()
    nums = [int(w) for w in words if w.isdigit()]
    return nums[0] if nums else 0


if __name__ == "__main__":
    if len(sys.argv) != 2 or not (Path(sys.argv[1]) / "log.jsonl").is_file():
        sys.exit("usage: python -m plumbing.curves RUN_DIR   (a folder holding log.jsonl, e.g. runs/muarl)")
    path = draw(sys.argv[1])
    print(f"wrote {path}" if path else "nothing written")
