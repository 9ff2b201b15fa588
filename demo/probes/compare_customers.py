"""The paper's question on the CPU demo : does training against a stochastic LLM customer generalise to
customers the agent never met better than training against a script?

Rows: the agent trained against the script (`--user scripted`), against the script sampling its paraphrases (`--user
sampled`), against the LLM customer (README command 1: the shipped demo/customer_model). Columns: the agent evaluated
against the script, against the customer it trained with, and against a held-out customer: a customer model trained
on another phrase bank (store.PHRASINGS["b"]: the same key words in other frames), which no agent trained against.
Each cell: held-out pass^1 over the run's world's 200 held-out tasks (2 trials where the customer is stochastic), the
mean and spread over the seeds of that row, and the customer's fidelity (store.customer_mistakes) in that cell; a
second table gives the share of each cell's conversations that ended in the agent's malformed tool call.

    for s in 0 17 29 35 37 38; do  # the README's six seeds
      python -m demo --seed $s --out_dir runs/cmp/llm-$s                              # README command 1
      for u in scripted sampled; do  # the same seed's cold start (its weights), then RL against another customer
        python -m demo --config runs/cmp/llm-$s/config.json --model runs/cmp/llm-$s/cold-start --sft_epochs 0 \
          --user $u --user_serve "" --threads 2 --out_dir runs/cmp/$u-$s               # ~4 min
      done
    done
    python demo/probes/compare_customers.py runs/cmp/*-*                                      # ~20 s per cell

The held-out customer is committed in demo/customer_model_b/ (gate 100 / 98.0 %, its fidelity.json), built by
`python -m demo.customer build --phrasing b --seed 1 --out DIR` (12 min here); `--held_out DIR` takes another.

The three rows of a seed start from one cold start (the LLM run's `cold-start/` weights, its config: world, limits,
GRPO settings), so they differ only in the customer GRPO met. Every cell is `python -m demo.eval --model RUN/final
...` with the run's own world, seed and limits (cell_argv), so each figure can be re-run alone; a run's evaluation
against its own training customer gives its last logged evaluation.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

ROWS = {"scripted": "the script", "sampled": "the sampled script", "llm": "the LLM customer"}
COLUMNS = ("the script", "its training customer", "a held-out customer")
SERVED = ["--user", "llm", "--user_temperature", "0.7", "--user_max_tokens", "64", "--eval_trials", "2"]  # the preset's


def cell_argv(run: Path, column: str, held_out: str) -> list[str]:
    """eval.py's command line for one cell: the run's final model on its world's held-out tasks, against `column`
    (`--out` first: the rest, argv[2:], is what the cell computes)."""
    cfg = json.loads((run / "config.json").read_text())
    base = ["--out", str(run / "compare" / f"{COLUMNS.index(column)}.jsonl"), "--model", str(run / "final"),
            "--domains", "store", "--tools_in_prompt", str(int(cfg["tools_in_prompt"])), "--max_turns",
            str(cfg["max_turns"]), "--max_new_tokens", str(cfg["max_new_tokens"]), "--max_context",
            str(cfg["max_context"]), "--synthetic_seed", str(cfg["synthetic_seed"]), "--seed", str(cfg["seed"])]
    trained = cfg["user"] if cfg["user"] != "llm" else "served"
    user = "scripted" if column == "the script" else trained if column == "its training customer" else "held_out"
    from demo import SHIPPED

    served = cfg.get("user_serve") if cfg.get("user_serve") not in (None, "", "demo") else str(SHIPPED)
    return base + {"scripted": ["--user", "scripted", "--eval_trials", "1"],
                   "sampled": ["--user", "sampled", "--eval_trials", "2"],
                   "served": SERVED + ["--user_serve", served],
                   "held_out": SERVED + ["--user_serve", held_out]}[user]


def table(cells: dict) -> str:
    """cells: {(row, column): [(seed, pass^1, fidelity or None)]} -> the markdown table, mean +- sd over seeds."""
    lines = ["| trained against | " + " | ".join(COLUMNS) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    for row in ROWS.values():
        out = []
        for col in COLUMNS:
            got = cells.get((row, col), [])
            p1, fid = [100 * p for _, p, _ in got], [100 * f for _, _, f in got if f is not None]
            sd = f" +- {statistics.stdev(p1):.1f}" if len(p1) > 1 else ""
            out.append(f"{statistics.mean(p1):.1f}{sd} (n={len(p1)}; fidelity {min(fid):.1f}-{max(fid):.1f} %)"
                       if p1 and fid else f"{statistics.mean(p1):.1f}{sd} (n={len(p1)})" if p1 else "not run")
        lines.append(f"| {row} | " + " | ".join(out) + " |")
    return "\n".join(lines)


def broken(shares: dict) -> str:
    """shares: {(row, column): [share of a cell's conversations that ended in the agent's malformed tool call]} ->
    a table of the mean over seeds and the range: how much of a column's loss is the agent's own text breaking."""
    lines = ["| ended in a malformed call | " + " | ".join(COLUMNS) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    for row in ROWS.values():
        got = [[100 * v for v in shares.get((row, col), [])] for col in COLUMNS]
        lines.append(f"| {row} | " + " | ".join(f"{statistics.mean(g):.1f} % ({min(g):.1f}-{max(g):.1f})" if g else
                                                 "not run" for g in got) + " |")
    return "\n".join(lines)


def paired(cells: dict, row: str = "the LLM customer") -> str:
    """The LLM row minus each other row, seed by seed (a seed's rows share one cold start, so the pair differs only
    in the customer GRPO met): per column, each seed's difference in points, and their mean."""
    lines = ["| difference | " + " | ".join(COLUMNS) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    for other in (r for r in ROWS.values() if r != row):
        out = []
        for col in COLUMNS:
            mine, theirs = ({s: p for s, p, _ in cells.get((r, col), [])} for r in (row, other))
            d = {s: 100 * (mine[s] - theirs[s]) for s in sorted(mine.keys() & theirs.keys())}
            out.append(", ".join(f"{v:+.1f}" for v in d.values()) + f" (seeds {', '.join(map(str, d))}; mean "
                       f"{statistics.mean(d.values()):+.1f})" if d else "no seed in both")
        lines.append(f"| {row} - {other} | " + " | ".join(out) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description="the comparison of customers: trained against X, evaluated against Y")
    p.add_argument("runs", nargs="+", help="finished runs of python -m demo (each with final/ and config.json)")
    p.add_argument("--held_out", default=str(Path(__file__).resolve().parent.parent / "demo" / "customer_model_b"),
                   help="the held-out customer model (default: the one committed, built by demo.customer --phrasing b)")
    a = p.parse_args()
    import eval as evaluation

    cells, shares, per_seed, done = {}, {}, [], {}  # done: each command's metrics, evaluated once
    for run in map(Path, a.runs):
        if not (run / "final").is_dir() or not (run / "config.json").is_file():
            sys.exit(f"compare_customers: {run} is not a finished run (no final/ or config.json)")
        cfg = json.loads((run / "config.json").read_text())
        for col in COLUMNS:
            argv = cell_argv(run, col, a.held_out)
            print(f"[cell] {run.name} against {col}: python -m demo.eval {' '.join(argv)}", flush=True)
            key = tuple(argv[2:])  # (a script-trained run's two script columns are one command)
            if key not in done:
                done[key] = evaluation.main(argv)
            m = done[key]
            where, malformed = (ROWS[cfg["user"]], col), m["stop_reasons"].get("malformed_call", 0) / m["episodes"]
            cells.setdefault(where, []).append((cfg["seed"], m["pass^1"], m.get("customer_fidelity")))
            shares.setdefault(where, []).append(malformed)
            per_seed.append(f"| {run.name} | {col} | {100 * m['pass^1']:.1f} | "
                            f"{100 * m.get('customer_fidelity', float('nan')):.1f} | {100 * malformed:.1f} |")
    print("\n| run | against | pass^1 | customer fidelity | ended in a malformed call |\n|---|---|---|---|---|\n" +
          "\n".join(per_seed) + "\n\n" + broken(shares) + "\n")
    print(table(cells) + "\n\nSeed by seed, in points of pass^1:\n\n" + paired(cells))
