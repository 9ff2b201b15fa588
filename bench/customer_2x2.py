"""Does training against a stochastic customer generalise better than training against a script? The 2 x 2 table.

Two CPU demo runs with the same seed differ only in the customer they trained against: the store's customer model,
served and sampled (`python muarl.py --model tiny`, the default), and the store's deterministic script (`python
muarl.py --model tiny --user scripted`). Their cold starts are the same model (the cold start never meets a customer).
Each final model, and the cold start, is evaluated against both customers on the same 200 held-out tasks:

    rows      trained against: (cold start) | the LLM customer | the script
    columns   evaluated against: the LLM customer (served, temperature 0.7, 4 trials: pass^1 / pass^4) |
              the script (deterministic: one trial)

    python bench/customer_2x2.py --llm_run runs/muarl --scripted_run runs/scripted [--train]

`--train` first trains whichever of the two runs is missing (about 20 and 12 minutes on 2 cores). The evaluation
itself is eval.evaluate, the function eval.py and muarl.py use, with a greedy agent; the table is printed last.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import muarl  # noqa: E402
from domains import load_worlds, task_sets  # noqa: E402
from engine import make_engine  # noqa: E402
from eval import evaluate  # noqa: E402
from models import load_policy  # noqa: E402
from rollout import PolicyAgent  # noqa: E402
from serve import ModelServer  # noqa: E402
from user_sim import make_user  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--llm_run", default="runs/muarl")
    p.add_argument("--scripted_run", default="runs/scripted")
    p.add_argument("--seed", type=int, default=0, help="the runs' seed (--train) and the evaluation's")
    p.add_argument("--trials", type=int, default=4, help="trials per task against the LLM customer")
    p.add_argument("--train", action="store_true", help="train the runs that are missing first")
    a = p.parse_args()
    llm_run, scripted_run = Path(a.llm_run), Path(a.scripted_run)
    for run, extra in ((llm_run, []), (scripted_run, ["--user", "scripted"])):
        if not (run / "final" / "config.json").is_file():
            if not a.train:
                sys.exit(f"customer_2x2: {run}/final is missing: pass --train, or run python muarl.py --model tiny "
                         f"{' '.join(extra)} --seed {a.seed} --out_dir {run}")
            subprocess.run([sys.executable, "muarl.py", "--model", "tiny", *extra, "--seed", str(a.seed),
                            "--out_dir", str(run)], cwd=ROOT, check=True)
    torch.set_num_threads(1)
    cfg = muarl.parse_config(["--model", "tiny", "--seed", str(a.seed)])
    worlds = load_worlds(cfg)
    held_out = task_sets(cfg, worlds)[1][: cfg.eval_tasks]
    models = {"cold start": llm_run / "cold-start", "trained against the LLM customer": llm_run / "final",
              "trained against the script": scripted_run / "final"}
    table = {}
    with ModelServer(llm_run / "customer", name="customer", log_path=llm_run / "2x2-customer-server.log",
                     max_model_len=2048) as srv:
        customers = {"LLM customer": (make_user("llm", model="customer", base_url=srv.base_url,
                                                temperature=cfg.user_temperature, max_tokens=cfg.user_max_tokens,
                                                max_workers=cfg.user_concurrency), a.trials),
                      "script": (make_user("scripted"), 1)}
        for row, path in models.items():
            policy, tok = load_policy(str(path), dtype="float32")
            agent = PolicyAgent(make_engine("hf", model=policy, tokenizer=tok), tok)
            for col, (user, trials) in customers.items():
                m, _ = evaluate(held_out, worlds, agent, user, muarl.rollout_cfg(cfg, greedy=True, seed=a.seed),
                                trials=trials, progress=False)
                table[row, col] = m
                print(f"{row} vs {col}: pass^1 {100 * m['pass^1']:.1f}"
                      + (f", pass^{trials} {100 * m[f'pass^{trials}']:.1f}" if trials > 1 else ""), flush=True)
    print(f"\nHeld-out pass^1 ({len(held_out)} store tasks; against the LLM customer: {a.trials} trials, pass^1 / "
          f"pass^{a.trials}), seed {a.seed}\n")
    print("| trained against \\ evaluated against | LLM customer | script |\n|---|---|---|")
    for row in models:
        llm, script = table[row, "LLM customer"], table[row, "script"]
        print(f"| {row} | {100 * llm['pass^1']:.1f} / {100 * llm[f'pass^{a.trials}']:.1f} | "
              f"{100 * script['pass^1']:.1f} |")


if __name__ == "__main__":
    main()
