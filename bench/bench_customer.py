"""What the LLM customer costs: replies per second through the served model, and a GRPO step with it against one with
the scripted customer, on the same tasks.

MUA-RL's customer is a language model inside every rollout, so every customer turn is a request to a chat endpoint;
the scripted customer is a Python function. This script measures, on a finished CPU demo run (`python -m demo`
leaves runs/muarl/cold-start, the agent before RL; the customer is the shipped demo/customer_model):

    throughput   customer replies per second through vLLM's OpenAI server (serve.py, the run's own customer model),
                 at 1, 8 and 64 requests in flight (LLMUser.replies, the rollout's own call), on real mid-conversation
                 requests of held-out store tasks
    step         one GRPO step as muarl.train runs it (rollout of B x G episodes, score, advantages, update) from the
                 cold-start model, with the served customer and with the scripted one, on the same B tasks; repeated,
                 the two interleaved, the policy reloaded before each step so every step starts from the same model.
                 Printed per step: its time, the rollout's split (policy generation / customer / tools) and the
                 customer's share of the step; last, the median ratio of the two steps' times

    python bench/bench_customer.py --run runs/muarl            # ~75 s on 2 cores, the server's start included

Read the ratio with its caveat: the two customers do not say the same words, so the conversations differ (the
scripted one never misunderstands, the model sometimes does and the conversation runs longer). The per-step
split says how much of the difference is the customer's own time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import muarl  # noqa: E402
from demo import customer  # noqa: E402
from demo.train import parse as demo_parse  # noqa: E402
from plumbing.serve import ModelServer  # noqa: E402
from domains import load_worlds, task_sets  # noqa: E402
from engine import make_engine  # noqa: E402
from plumbing.models import load_policy  # noqa: E402
from rollout import PolicyAgent, RolloutConfig, rollout, score  # noqa: E402
from plumbing.sampling import episode_seed  # noqa: E402
from user_sim import make_user  # noqa: E402


def requests_of(tasks, n: int) -> list[tuple]:
    """n real customer requests: each held-out task's conversation after the policy's right lines for 0-2 turns (the
    customer then answers an agent question: the id, the option, a refusal)."""
    out, user = [], make_user("scripted")
    for k, t in enumerate(tasks[:n]):
        history = [{"role": "user", "content": user.first_message(t)}]
        for _ in range(k % 3):
            history.append({"role": "assistant", "content": customer._right_line(t.spec, history) or "Sorry."})
            history.append({"role": "user", "content": user.reply(t, history)})
        history.append({"role": "assistant", "content": customer._right_line(t.spec, history) or "Sorry."})
        out.append((t, history))
    return out


def one_step(cfg, worlds, tasks, policy, tok, user, step: int) -> dict:
    """muarl.train's steps 1-5 on `tasks` (no weight sync: the engine shares the policy's weights on a CPU)."""
    opt = torch.optim.AdamW(policy.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    t0 = time.perf_counter()
    policy.eval()
    eps = rollout(tasks, cfg.group_size, worlds, PolicyAgent(make_engine("hf", model=policy, tokenizer=tok), tok), user,
                  RolloutConfig.of(cfg, seed=episode_seed(cfg.seed, "bench", step)))
    score(eps, worlds, check_outputs=cfg.train_check_outputs)
    t1 = time.perf_counter()
    kept, adv = muarl.advantages(eps, cfg.group_size, cfg.advantage, cfg.reward, cfg.turn_bonus)
    policy.train()
    if kept:
        muarl.update(policy, None, kept, adv, opt, cfg)
    t2 = time.perf_counter()
    split = {k: sum(e.timings[k] for e in eps) for k in ("generate", "user", "tools")}
    return {"step_s": t2 - t0, "rollout_s": t1 - t0, "update_s": t2 - t1, **split,
            "turns": sum(e.turns for e in eps) / len(eps), "aborted": sum(e.aborted for e in eps)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--run", default="runs/muarl", help="a finished CPU demo run (its customer/ and cold-start/)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    run = Path(a.run)
    for need in ("customer/config.json", "cold-start/config.json"):
        if not (run / need).is_file():
            sys.exit(f"bench_customer: {run / need} is missing: run `python -m demo --out_dir {run}` "
                     "first")
    torch.set_num_threads(a.threads)
    cfg = demo_parse([])  # the CPU demo's settings: B = 8 tasks x G = 8, T = 1.0, ...
    worlds = load_worlds(cfg)
    train, held_out = task_sets(cfg, worlds)
    print(f"load average {os.getloadavg()[0]:.1f} | {a.threads} torch thread(s) | customer {run / 'customer'}")
    with ModelServer(customer.SHIPPED, name="customer", log_path=run / "bench-customer-server.log",
                     max_model_len=2048) as srv:
        # 1. throughput: the same 64 requests at 1, 8 and 64 in flight
        reqs = requests_of(held_out, 64)
        for workers in (1, 8, 64):
            user = make_user("llm", model="customer", base_url=srv.base_url, api_key=srv.api_key,
                             temperature=cfg.user_temperature, max_tokens=cfg.user_max_tokens, max_workers=workers,
                             thinking=True)  # (the demo's customer: no thinking switch, serve.trained_here)
            user.replies(reqs[:4])  # warm: the server's first requests compile nothing on a CPU, but fill its caches
            t0 = time.perf_counter()
            out = user.replies(reqs)
            dt = time.perf_counter() - t0
            bad = sum(not isinstance(r, str) for r in out)
            print(f"throughput: {len(reqs)} customer replies at {workers:2d} in flight: {dt:5.2f} s = "
                  f"{len(reqs) / dt:6.1f} replies/s ({bad} failed)")
        # 2. a GRPO step with each customer, on the same tasks, interleaved
        llm = make_user("llm", model="customer", base_url=srv.base_url, api_key=srv.api_key,
                        temperature=cfg.user_temperature, max_tokens=cfg.user_max_tokens, max_workers=cfg.user_concurrency,
                        thinking=True)
        customers = {"llm": llm, "scripted": make_user("scripted")}
        times = {k: [] for k in customers}
        for rep in range(a.reps):
            tasks = train[rep * cfg.tasks_per_step : (rep + 1) * cfg.tasks_per_step]
            for name in (("llm", "scripted") if rep % 2 == 0 else ("scripted", "llm")):
                policy, tok = load_policy(str(run / "cold-start"), dtype="float32")
                r = one_step(cfg, worlds, tasks, policy, tok, customers[name], rep)
                times[name].append(r["step_s"])
                print(f"step {rep} {name:8s}: {r['step_s']:5.1f} s (rollout {r['rollout_s']:4.1f}: generate "
                      f"{r['generate']:4.1f}, customer {r['user']:4.1f}, tools {r['tools']:.2f}; update "
                      f"{r['update_s']:4.1f}); customer {100 * r['user'] / r['step_s']:4.1f} % of the step; "
                      f"{r['turns']:.1f} turns/episode, {r['aborted']} aborted")
    ratio = statistics.median(x / y for x, y in zip(times["llm"], times["scripted"]))
    print(f"a GRPO step with the LLM customer takes {ratio:.2f}x the time of one with the scripted customer "
          f"(median of {a.reps} pairs, B={cfg.tasks_per_step} x G={cfg.group_size})")


if __name__ == "__main__":
    main()
