"""Update-step throughput: packed rows (grpo.pack_sequences) vs padded micro-batches (grpo.pad_sequences).

One "update step" here is what muarl does per optimizer step: for every micro-batch, token_logprobs
(forward) + grpo_loss + backward, gradients accumulated with num_tokens = the step's trained-token count.
Throughput counts real tokens only (padding is work, not progress).

Episode lengths follow a long tail, as multi-turn rollouts do (most end after a few turns, a few run long):
lognormal with median --median tokens, clipped to [--min-len, --max-len]. The model is a tiny random Qwen3
(sdpa attention, float32, CPU).

Variants:
  padded       micro-batches of --batch episodes in rollout order, right-padded to the longest one
  packed       first-fit-decreasing rows of at most --max-tokens tokens, one row per forward, no padding
  padded-sort  (reference) the same micro-batches after sorting episodes by length, the cheap alternative

What packing does and does not save on this path: no pad token goes through the MLPs, the projections or the
lm_head. But sdpa with the block-diagonal mask transformers builds from position_ids still computes each
row's full (L, L) attention scores and masks the off-diagonal blocks; only flash-attention's variable-length
kernels (GPU) skip them. So on this path the row budget matters: rows much longer than a typical episode pay
for attention between episodes that the mask then throws away. The default budget, 1024, is about twice the
median episode; an episode longer than the budget simply gets a row of its own. Try --max-tokens 2048.

    python bench/bench_packing.py            # 32 episodes of 200-2000 tokens, ~1-3 min
    python bench/bench_packing.py --quick    # 12 episodes of 100-600 tokens, ~10 s

Timing: the machines this was written on are shared (other jobs compete for the 2 cores), so wall-clock times
swing by several x. The bench therefore runs torch on --threads threads (default 1) and counts the process's
CPU time (time.process_time), which competing jobs do not inflate; wall time is printed beside it. Variants
are interleaved across repeats and the best repeat of each is kept.

The last line printed is the ratio packed / padded tokens per CPU-second (goal: >= 1.5).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import grpo  # noqa: E402


def make_episodes(n: int, median: int, lo: int, hi: int, vocab: int, seed: int):
    """n episodes: token ids, a rollout-like loss mask, advantages, sampling and reference log-probs."""
    g = torch.Generator().manual_seed(seed)
    lens = (median * torch.exp(0.7 * torch.randn(n, generator=g))).clamp(lo, hi).long().tolist()
    seqs = [torch.randint(0, vocab, (L,), generator=g).tolist() for L in lens]
    # untrained prompt of 30% of min length, then agent turns (trained) alternating with observations
    masks = [[0] * (lo * 3 // 10) + [int((t // 50) % 2 == 0) for t in range(L - lo * 3 // 10)] for L in lens]
    adv = torch.randn(n, generator=g).tolist()
    old = [(-3 * torch.rand(L, generator=g)).tolist() for L in lens]
    ref = [(-3 * torch.rand(L, generator=g)).tolist() for L in lens]
    return seqs, masks, adv, old, ref


def update_step(model, batches, num_tokens: int, chunk: int) -> None:
    """Forward + loss + backward over every micro-batch of one step (gradients accumulate)."""
    model.zero_grad(set_to_none=True)
    for b in batches:
        logp = grpo.token_logprobs(model, b["input_ids"], b.get("attention_mask"), b.get("position_ids"),
                                   chunk_size=chunk)  # (b, L)
        loss, _ = grpo.grpo_loss(logp, b["old"], b["ref"], b["adv"], b["mask"], num_tokens=num_tokens)
        loss.backward()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--episodes", type=int, default=32, help="episodes per step (e.g. 4 tasks x G=8)")
    p.add_argument("--median", type=int, default=500, help="median episode length (tokens)")
    p.add_argument("--min-len", type=int, default=200)
    p.add_argument("--max-len", type=int, default=2000)
    p.add_argument("--batch", type=int, default=4, help="episodes per padded micro-batch")
    p.add_argument("--max-tokens", type=int, default=1024,
                   help="token budget of a packed row (longer episodes get a row of their own)")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--chunk", type=int, default=1024, help="token_logprobs chunk_size")
    p.add_argument("--repeats", type=int, default=2, help="timed steps per variant (after one warm-up)")
    p.add_argument("--quick", action="store_true", help="12 episodes of 100-600 tokens, 1 repeat")
    p.add_argument("--threads", type=int, default=1, help="torch threads (CPU time is the measure)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if args.quick:
        args.episodes, args.median, args.min_len, args.max_len, args.max_tokens, args.repeats = 12, 150, 100, 600, 600, 1

    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    cfg = Qwen3Config(hidden_size=args.hidden, num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64,
                      num_key_value_heads=max(1, args.hidden // 128), head_dim=64, intermediate_size=2 * args.hidden,
                      vocab_size=args.vocab, attn_implementation="sdpa")
    model = Qwen3ForCausalLM(cfg).float()
    seqs, masks, adv, old, ref = make_episodes(args.episodes, args.median, args.min_len, args.max_len, args.vocab,
                                               args.seed)
    lens = sorted(map(len, seqs))
    real = sum(lens)
    num_tokens = sum(sum(m) for m in masks)
    print(f"{args.episodes} episodes, {real} tokens; lengths min {lens[0]} median {lens[len(lens) // 2]} "
          f"max {lens[-1]}; model hidden {args.hidden}, {args.layers} layers, vocab {args.vocab}")

    order = sorted(range(len(seqs)), key=lambda k: len(seqs[k]))
    pick = lambda xs, idx: [xs[k] for k in idx]  # noqa: E731
    variants = {
        "padded": grpo.pad_sequences(seqs, masks, args.batch, adv=adv, old=old, ref=ref),
        "packed": grpo.pack_sequences(seqs, masks, args.max_tokens, adv=adv, old=old, ref=ref),
        "padded-sort": grpo.pad_sequences(*(pick(x, order) for x in (seqs, masks)), args.batch,
                                          adv=pick(adv, order), old=pick(old, order), ref=pick(ref, order)),
    }
    for batches in variants.values():
        update_step(model, batches, num_tokens, args.chunk)  # warm-up (allocator, kernels)
    cpu = {name: [] for name in variants}
    wall = {name: [] for name in variants}
    for _ in range(args.repeats):  # interleaved, so a burst of competing load hits every variant alike
        for name, batches in variants.items():
            w0, c0 = time.perf_counter(), time.process_time()
            update_step(model, batches, num_tokens, args.chunk)
            cpu[name].append(time.process_time() - c0)
            wall[name].append(time.perf_counter() - w0)
    speed = {}
    for name, batches in variants.items():
        computed = sum(b["input_ids"].numel() for b in batches)
        speed[name] = real / min(cpu[name])
        print(f"  {name:12s} {len(batches):3d} micro-batches, {computed:6d} tokens computed "
              f"({computed / real - 1:5.1%} padding); best of {args.repeats}: {min(cpu[name]):6.2f} CPU s "
              f"({min(wall[name]):6.2f} s wall), {speed[name]:7.0f} real tokens per CPU-second")
    print(f"packed vs length-sorted padding: {speed['packed'] / speed['padded-sort']:.2f}x")
    print(f"speedup packed / padded (tokens per CPU-second): {speed['packed'] / speed['padded']:.2f}")


if __name__ == "__main__":
    main()
