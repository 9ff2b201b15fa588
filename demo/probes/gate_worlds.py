"""A customer model's gate on many runs' worlds: how often would README command 1 stop at it?

Before training anything, a CPU-demo run gates its customer on its own world's 200 held-out tasks
(demo.customer.ServedCustomer.gate: against the policy's right lines and a noisy agent, at the run's temperature,
every request seeded from the run's seed); below --user_gate (95 %) it stops. A customer's fidelity.json reads that
gate on one world only. This plays the run's gate exactly, seed by seed, against one served model folder, so its
margin over the threshold is read over many worlds, and a candidate customer can be compared with the shipped one
before any run is spent on it.

    python demo/probes/gate_worlds.py demo/customer_model --seeds 0-29
    python demo/probes/gate_worlds.py /tmp/customer --seeds 0,1,5,17,27

One row per seed (each gate agent's fidelity and mistakes, the gate figure: the lower), then the seeds below the
threshold, printed last. About 30 s a seed on 2 cores (one server for all of them).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from demo.train import parse  # noqa: E402
from domains import load_worlds, task_sets  # noqa: E402


def seeds_of(text: str) -> list[int]:
    """'0-4,9' -> [0, 1, 2, 3, 4, 9]."""
    out = []
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


def run_tasks(seed: int) -> tuple[object, list]:
    """README command 1's configuration for `seed` (the preset: the seed is the world's) and its gate's tasks: the
    held-out tasks with a store spec, as ServedCustomer.start passes them."""
    cfg = parse(["--seed", str(seed)])
    _, held_out = task_sets(cfg, load_worlds(cfg))
    return cfg, [t for t in held_out if t.spec and "behaviour" in t.spec]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("folder", type=Path, help="a customer model folder (demo/customer_model: the shipped one)")
    ap.add_argument("--seeds", default="0-9", help="runs' seeds: 0-29, or 0,1,5")
    ap.add_argument("--threshold", type=float, default=None, help="the gate (default: the preset's --user_gate)")
    a = ap.parse_args(argv)
    if not (a.folder / "config.json").is_file():
        raise SystemExit(f"gate_worlds: no model in {a.folder} (no config.json)")
    from demo.customer import gate
    from plumbing.serve import ModelServer
    from user_sim import LLMUser

    rows, below = [], []
    log = Path(tempfile.mkdtemp(prefix="muarl-gate-")) / "customer-server.log"
    with ModelServer(a.folder, name="customer", log_path=log) as srv:
        print(f"| seed | right lines | noisy agent | gate | s |\n|---|---|---|---|---|", flush=True)
        for seed in seeds_of(a.seeds):
            cfg, tasks = run_tasks(seed)
            threshold = cfg.user_gate if a.threshold is None else a.threshold
            t0 = time.perf_counter()
            user = LLMUser("customer", base_url=srv.base_url, api_key=srv.api_key, temperature=cfg.user_temperature,
                           max_tokens=cfg.user_max_tokens, max_workers=cfg.user_concurrency, seed=cfg.seed,
                           thinking=True)  # (the demo's customer: no thinking switch, serve.trained_here)
            g = gate(user, tasks, seed=cfg.seed or 0)  # (a user per world: it caches each task's opening by id)
            cells = [f"{100 * r['fidelity']:.1f} % {r['mistakes'] or ''}" for r in g["agents"].values()]
            print(f"| {seed} | {' | '.join(cells)} | {100 * g['fidelity']:.1f} % | {time.perf_counter() - t0:.0f} |",
                  flush=True)
            rows.append(g["fidelity"])
            below += [seed] * (g["fidelity"] < threshold)
    print(f"\n{a.folder}: gate {100 * min(rows):.1f}-{100 * max(rows):.1f} % over {len(rows)} worlds (mean "
          f"{100 * sum(rows) / len(rows):.1f} %); below {100 * threshold:.0f} % on {len(below)} of {len(rows)}"
          + (f" (seeds {', '.join(map(str, below))})" if below else ""))


if __name__ == "__main__":
    main()
