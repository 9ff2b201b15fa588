"""Time HFEngine against VLLMEngine on the tiny model: B prompts x N new tokens, one process, same weights.

    python bench/bench_engine.py                 # B in {8, 32}, N = 64, 5 rounds after one warm-up
    python bench/bench_engine.py --batches 8 --new 32 --rounds 3 --no-prefix-caching

Every sample runs to exactly N tokens (no stop ids), so both engines do the same work. Prompts are chat-rendered
(system + the generic tools block + a user message, ~550 tokens), like a rollout's first turn; the ~520-token
system part is the same in every prompt, which both engines exploit: vLLM's prefix cache, and HFEngine's shared
prefix (computed once per call) and its store of earlier calls' keys/values (--no-prefix-caching turns both
caches off). Each round uses fresh user messages, so only that shared part can be cached.

Both engines are started first, then timed in alternation (HF, vLLM, HF, vLLM, ...) so that load from other
processes on the machine hits both alike. Reported: the minimum and the median over rounds. The last line is
the ratio vLLM time / HF time (< 1: vLLM is faster).

On a 2-core machine that other processes also load, `--threads 1` gives steady numbers; torch's default of one
thread per core then slows both engines several-fold and makes the timings swing from round to round.
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
    from demo.tiny_model import default_corpus
    from tools import GENERIC_TOOLS, function_schema

    tools = [function_schema(fn) for fn in GENERIC_TOOLS]
    lines = default_corpus()[:16]
    out = []
    for i in range(n):
        msgs = [{"role": "system", "content": "You are a customer service agent."},
                {"role": "user", "content": f"Request {round_}.{i}: {lines[i % len(lines)]}"}]
        text = tok.apply_chat_template(msgs, tools=tools, tokenize=False, add_generation_prompt=True,
                                       enable_thinking=False)
        out.append(tok.encode(text, add_special_tokens=False))  # token ids: engines never see text
    return out


def timed(engine, prompts, new: int, seed: int) -> float:
    """Seconds for one generate() call; every sample must run to `new` tokens (no stop ids: equal work)."""
    t0 = time.perf_counter()
    out = engine.generate(prompts, new, temperature=1.0, stop_token_ids=[], seed=seed)
    dt = time.perf_counter() - t0
    assert all(len(s.token_ids) == new for s in out)
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[8, 32], help="numbers of prompts per generate call")
    ap.add_argument("--new", type=int, default=64, help="new tokens per prompt")
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds per engine and batch size")
    ap.add_argument("--threads", type=int, default=0, help="torch threads for HFEngine (0: torch's default)")
    ap.add_argument("--no-prefix-caching", action="store_true",
                    help="turn vLLM's prefix cache and HFEngine's store of earlier calls off")
    args = ap.parse_args()

    import torch

    from engine import VLLMEngine
    from plumbing.hf_engine import HFEngine
    from demo.tiny_model import build_tiny
    from plumbing.models import n_params

    if args.threads:
        torch.set_num_threads(args.threads)
    d = tempfile.mkdtemp(prefix="muarl-bench-")
    model, tok = build_tiny(d)
    print(f"tiny model: {n_params(model):,} params, V={len(tok)}; torch threads {torch.get_num_threads()}")
    t0 = time.perf_counter()
    engines = {"hf": HFEngine(model, tok, cache_gib=0 if args.no_prefix_caching else 2.0),
               "vllm": VLLMEngine(d, max_model_len=2048, enable_prefix_caching=not args.no_prefix_caching)}
    print(f"VLLMEngine start: {time.perf_counter() - t0:.1f} s; torch threads now {torch.get_num_threads()}")

    times = {(k, b): [] for k in engines for b in args.batches}
    for b in args.batches:
        ps = prompts_for(tok, b, 0)
        print(f"B={b}: prompt lengths {min(map(len, ps))}-{max(map(len, ps))} tokens")
        for eng in engines.values():
            timed(eng, prompts_for(tok, b, -1), args.new, seed=0)  # warm-up (vLLM's first calls are slow)
        for r in range(args.rounds):
            ps = prompts_for(tok, b, r)
            for k, eng in engines.items():
                times[k, b].append(timed(eng, ps, args.new, seed=r))
        for k in engines:
            ts = times[k, b]
            print(f"  {k:5s} B={b:3d} x {args.new} tokens: min {min(ts):6.2f} s   median {statistics.median(ts):6.2f} s"
                  f"   ({', '.join(f'{t:.2f}' for t in ts)})")
    ts = []
    for _ in range(3):  # the per-step cost of keeping vLLM in sync with the trainer
        t0 = time.perf_counter()
        engines["vllm"].update_weights(model.state_dict().items())
        ts.append(time.perf_counter() - t0)
    print(f"VLLMEngine.update_weights: min {min(ts):.3f} s")
    print("ratio vLLM/HF (min, median): " + "; ".join(
        f"B={b}: {min(times['vllm', b]) / min(times['hf', b]):.2f}, "
        f"{statistics.median(times['vllm', b]) / statistics.median(times['hf', b]):.2f}" for b in args.batches))


if __name__ == "__main__":
    main()
