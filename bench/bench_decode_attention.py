"""What one decode step's attention costs on a CPU: torch's SDPA over a batch's cached keys/values.

In a batched decode step every row reads its whole cache once per layer, so this is the part of a step that grows
with the rows (bench_rollout.py's README paragraph explains why it bounds the batched / one-at-a-time ratio). The
shapes are the CPU demo model's as HFEngine calls SDPA in decode (hf_engine.sdpa_gqa_attention): Hkv = 2 key/value
heads, G = 2 query heads per key/value head folded into the query axis, head size D = 64, one query per row.

    python bench/bench_decode_attention.py             # 1 and 13 rows, ~1,100 cached tokens each
    python bench/bench_decode_attention.py --rows 1 32 --context 2000

For each row count and dtype (fp32, bf16, fp16) it times SDPA with the mask HFEngine passes (0 / -inf bias; bool
shown for comparison), the median of `--rounds` calls, and prints the bytes of keys/values read per second. Run it
twice if the machine is busy: the variants run one after the other, not interleaved. The last line is the ratio
bf16 time / fp32 time, and fp16 / fp32, at the largest row count: below 1 would mean half-precision keys/values
pay off here.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F


def timed(fn, n: int) -> float:
    """Median seconds per call over n calls (after two warm-up calls)."""
    fn(), fn()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def case(rows: int, context: int, dtype: torch.dtype, hkv: int = 2, g: int = 2, d: int = 64, seed: int = 0):
    """Tensors for one decode step: rows of context lengths context .. context + 37 (rows - 1), left-padded to the
    longest, as HFEngine lays them out. Returns (query, keys, values, bias, bool mask, bytes of keys/values read)."""
    gen = torch.Generator().manual_seed(seed)
    lens = [context + 37 * i for i in range(rows)]
    k = max(lens)
    q = torch.randn(rows, hkv, g, d, generator=gen).to(dtype)  # (B, Hkv, G, D): G queries share a key/value head
    keys = torch.randn(rows, hkv, k, d, generator=gen).to(dtype)  # (B, Hkv, k, D)
    values = torch.randn(rows, hkv, k, d, generator=gen).to(dtype)  # (B, Hkv, k, D)
    real = torch.arange(k)[None, :] >= (k - torch.tensor(lens))[:, None]  # (B, k) True = a real column
    bias = torch.zeros(rows, 1, 1, k, dtype=dtype).masked_fill_(~real[:, None, None, :], float("-inf"))  # (B,1,1,k)
    return q, keys, values, bias, real[:, None, None, :], 2 * keys.numel() * keys.element_size()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 13], help="rows in the decode batch")
    ap.add_argument("--context", type=int, default=1100, help="cached tokens of the shortest row")
    ap.add_argument("--rounds", type=int, default=200, help="timed calls per variant")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); Hkv 2, G 2, D 64, one query per row")
    ratios = {}
    for rows in args.rows:
        ms = {}
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            q, k, v, bias, boolean, nbytes = case(rows, args.context, dtype)
            for name, mask in (("bias", bias), ("bool", boolean)):
                s = timed(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask), args.rounds)
                ms[dtype, name] = s * 1e3
                print(f"rows {rows:3d}  {str(dtype).replace('torch.', ''):9s} mask {name:4s}  {s * 1e3:7.3f} ms  "
                      f"{nbytes / s / 1e9:5.1f} GB/s of keys/values ({nbytes / 2**20:.1f} MiB)", flush=True)
        ratios[rows] = {dt: ms[dt, "bias"] / ms[torch.float32, "bias"] for dt in (torch.bfloat16, torch.float16)}
    rows = max(args.rows)
    print(f"ratio at {rows} rows, time / fp32 time: bf16 {ratios[rows][torch.bfloat16]:.2f}, "
          f"fp16 {ratios[rows][torch.float16]:.2f} (< 1: half-precision keys/values would pay off)")


if __name__ == "__main__":
    main()
