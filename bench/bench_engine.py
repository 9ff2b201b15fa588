"""Time HFEngine against VLLMEngine on the tiny model: B prompts x N new tokens, one process, same weights.

    python bench/bench_engine.py                 # B in {8, 32}, N = 64, 3 timed repeats after one warm-up
    python bench/bench_engine.py --batches 8 --new 32 --repeats 5

Every sample runs to exactly N tokens (no stop ids), so both engines do the same work. Prompts are chat-rendered
(system + the generic tools block + a user message, ~550 tokens), like a rollout's first turn; the ~520-token
system part is the same in every prompt, which vLLM's prefix cache exploits (--no-prefix-caching to compare).
HF is timed before vLLM starts (vLLM binds threads when it starts), then again after, to show any effect.
The last line is the ratio vLLM time / HF time per batch size (> 1: the transformers loop is faster).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from anywhere: the repo root is importable


def prompts_for(tok, n: int, round_: int) -> list[list[int]]:
    from models import default_corpus
    from tools import GENERIC_TOOLS, function_schema

    tools = [function_schema(fn) for fn in GENERIC_TOOLS]
    lines = default_corpus()[:16]
    out = []
    for i in range(n):
        msgs = [{"role": "system", "content": "You are a customer service agent."},
                {"role": "user", "content": f"Request {round_}.{i}: {lines[i % len(lines)]}"}]
        text = tok.apply_chat_template(msgs, tools=tools, tokenize=False, add_generation_prompt=True, enable_thinking=False)
        out.append(tok.encode(text, add_special_tokens=False))
    return out


def time_engine(engine, tok, b: int, new: int, repeats: int) -> float:
    # Each call gets fresh user messages: the shared system prefix may be cached (vLLM's prefix cache does that
    # in a real rollout too), the rest of every prompt is new work.
    engine.generate(prompts_for(tok, b, -1), new, temperature=1.0, stop_token_ids=[], seed=0)  # warm-up
    times = []
    for r in range(repeats):
        prompts = prompts_for(tok, b, r)
        t0 = time.perf_counter()
        out = engine.generate(prompts, new, temperature=1.0, stop_token_ids=[], seed=r)
        times.append(time.perf_counter() - t0)
        assert all(len(s.token_ids) == new for s in out)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[8, 32], help="numbers of prompts per generate call")
    ap.add_argument("--new", type=int, default=64, help="new tokens per prompt")
    ap.add_argument("--repeats", type=int, default=3, help="timed repeats (median reported)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads for HFEngine (0: torch's default)")
    ap.add_argument("--no-prefix-caching", action="store_true", help="turn vLLM's prefix cache off (HF has none)")
    args = ap.parse_args()

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)

    from engine import HFEngine, VLLMEngine
    from models import build_tiny, n_params

    d = tempfile.mkdtemp(prefix="muarl-bench-")
    model, tok = build_tiny(d)
    print(f"tiny model: {n_params(model):,} params, V={len(tok)}; torch threads {torch.get_num_threads()}")
    hf = HFEngine(model, tok)
    for b in args.batches:
        ps = prompts_for(tok, b, 0)
        print(f"  B={b}: prompt lengths {min(map(len, ps))}-{max(map(len, ps))} tokens")

    res: dict[str, dict[int, float]] = {"hf": {}, "vllm": {}, "hf_after": {}}
    for b in args.batches:
        res["hf"][b] = time_engine(hf, tok, b, args.new, args.repeats)
        print(f"HFEngine    B={b:3d} x {args.new} tokens: {res['hf'][b]:7.3f} s")
    t0 = time.perf_counter()
    vl = VLLMEngine(d, max_model_len=2048, enable_prefix_caching=not args.no_prefix_caching)
    print(f"VLLMEngine start: {time.perf_counter() - t0:.1f} s")
    for b in args.batches:
        res["vllm"][b] = time_engine(vl, tok, b, args.new, args.repeats)
        print(f"VLLMEngine  B={b:3d} x {args.new} tokens: {res['vllm'][b]:7.3f} s")
    for b in args.batches:
        res["hf_after"][b] = time_engine(hf, tok, b, args.new, args.repeats)
        print(f"HFEngine (after vLLM started) B={b:3d}: {res['hf_after'][b]:7.3f} s  (torch threads {torch.get_num_threads()})")
    print("ratio vLLM/HF: " + ", ".join(f"B={b}: {res['vllm'][b] / res['hf'][b]:.2f}" for b in args.batches))


if __name__ == "__main__":
    main()
