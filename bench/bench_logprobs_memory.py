"""Peak CPU memory of grpo.token_logprobs (chunked) against the naive full log-softmax, same values.

The model is Qwen3-0.6B's shape cut to one layer: hidden 1024, vocab 151,936 (tied embeddings), random
weights. At T = 4096 one float32 (T, V) tensor is 2.3 GiB, and the naive path holds several of them.

How memory is measured: torch's CPU allocations are invisible to tracemalloc, so each variant runs in a
fresh subprocess and reports the growth of its resident set during the measured call: the peak RSS during
the call (VmHWM, reset just before the call through /proc/self/clear_refs) minus the RSS just before it (the
model, its weights and the input are already there). The subprocess also saves its log-probs so the parent
can check both variants computed the same numbers. Linux only.

Three modes, each naive vs chunked (all three run by default, in this order):
  forward      under no_grad: how the old/reference log-probs are taken
  frozen-head  forward + backward with the embedding / lm_head weight frozen (the layer is still trained):
               besides the layer's activations, what is left is the memory that depends on how log-probs
               are computed
  step         forward + backward, every weight trained (as in MUA-RL). Both variants also hold the gradient
               of the tied embedding / lm_head weight, V x H floats, plus a same-sized temporary while it is
               accumulated: a floor that no log-prob method removes, and that dominates the chunked peak.

    python bench/bench_logprobs_memory.py                  # all three modes, T=4096: ~8 min on 2 cores
    python bench/bench_logprobs_memory.py --quick          # T=1024, V=32,768, forward only: ~20 s
    python bench/bench_logprobs_memory.py --mode step      # one mode

The last line printed holds the ratio chunked_peak / naive_peak for each mode run (goal: <= 0.125).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def reset_peak() -> bool:
    """Reset the kernel's peak-RSS counter (VmHWM) so construction-time peaks do not hide the call's."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_bytes(reset_ok: bool) -> int:
    if reset_ok:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # never reset; Linux reports KiB


def child(args) -> None:
    """One variant, one process: build the model, measure one call, save the values, print a JSON line."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    import grpo

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    cfg = Qwen3Config(hidden_size=args.hidden, num_hidden_layers=1, num_attention_heads=16, num_key_value_heads=8,
                      head_dim=128, intermediate_size=3 * args.hidden, vocab_size=args.vocab,
                      tie_word_embeddings=True, attn_implementation="sdpa")
    model = Qwen3ForCausalLM(cfg).float()
    if args.mode == "frozen-head":
        model.get_output_embeddings().weight.requires_grad_(False)  # tied: the embedding is frozen too
    ids = torch.randint(0, args.vocab, (1, args.T))  # (1, T)
    w = torch.randn(1, args.T)  # (1, T): a stand-in for the loss weights (advantage * mask / N)

    def naive():
        logits = model(ids, use_cache=False).logits.float()  # (1, T, V): the whole thing, at once
        logp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)  # (1, T-1)
        return torch.nn.functional.pad(logp, (1, 0))  # (1, T)

    def chunked():
        return grpo.token_logprobs(model, ids, chunk_size=args.chunk)  # (1, T)

    fn = naive if args.child == "naive" else chunked
    reset_ok = reset_peak()
    before, peak_before = rss_bytes(), peak_rss_bytes(reset_ok)
    t0 = time.perf_counter()
    if args.mode != "forward":
        logp = fn()
        (logp * w).sum().backward()
    else:
        with torch.no_grad():
            logp = fn()
    seconds = time.perf_counter() - t0
    peak = peak_rss_bytes(reset_ok)
    torch.save(logp.detach(), args.out)
    print(json.dumps({"variant": args.child, "rss_before": before, "peak_before": peak_before, "peak": peak,
                      "delta": peak - before, "seconds": seconds}))


def run_mode(args, mode: str, tmp: str) -> float:
    """Run naive and chunked for one mode in fresh subprocesses; print their peaks; return the ratio."""
    import torch

    res, values = {}, {}
    for variant in ("naive", "chunked"):
        out = os.path.join(tmp, f"{mode}-{variant}.pt")
        cmd = [sys.executable, os.path.abspath(__file__), "--child", variant, "--mode", mode, "--out", out,
               "--T", str(args.T), "--vocab", str(args.vocab), "--hidden", str(args.hidden),
               "--chunk", str(args.chunk), "--threads", str(args.threads)]
        # glibc keeps freed blocks below a moving threshold (up to 32 MiB) in its heap, where they still count
        # as resident; a fixed mmap threshold hands every large tensor back to the OS when torch frees it, so
        # the resident set follows live tensors. Same setting for both variants.
        env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            sys.exit(f"{mode}/{variant} failed:\n{proc.stderr[-3000:]}")
        r = res[variant] = json.loads(proc.stdout.strip().splitlines()[-1])
        values[variant] = torch.load(out, weights_only=True)  # a tensor: nothing else is unpickled
        note = "" if r["peak"] > r["peak_before"] else "  (call did not pass an earlier peak: an upper bound)"
        print(f"  {mode:11s} {variant:8s} rss before {r['rss_before'] / 2**30:5.2f} GiB   "
              f"peak growth during call {r['delta'] / 2**30:5.2f} GiB   {r['seconds']:6.1f} s{note}")
    diff = (values["naive"] - values["chunked"]).abs().max().item()
    ratio = res["chunked"]["delta"] / res["naive"]["delta"]
    print(f"  {mode:11s} max |naive - chunked| = {diff:.1e} ({'same values' if diff <= 1e-5 else 'MISMATCH'}); "
          f"chunked / naive = {ratio:.3f}")
    return ratio


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--T", type=int, default=4096, help="tokens in the row")
    p.add_argument("--vocab", type=int, default=151936, help="vocabulary size V (Qwen3: 151,936)")
    p.add_argument("--hidden", type=int, default=1024, help="hidden size H (Qwen3-0.6B: 1024)")
    p.add_argument("--chunk", type=int, default=128,
                   help="chunk_size (tokens) for token_logprobs; at V=151,936 one (128, V) float32 tensor is 74 MiB")
    p.add_argument("--mode", choices=["forward", "step", "frozen-head", "all"], default="all")
    p.add_argument("--quick", action="store_true", help="T=1024, V=32,768, forward only, unless set explicitly")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads")
    p.add_argument("--child", choices=["naive", "chunked"], help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)
    if args.quick:
        given = " ".join(sys.argv)
        args.T = args.T if "--T" in given else 1024
        args.vocab = args.vocab if "--vocab" in given else 32768
        args.mode = args.mode if "--mode" in given else "forward"

    modes = ["forward", "frozen-head", "step"] if args.mode == "all" else [args.mode]
    print(f"T={args.T} V={args.vocab} H={args.hidden} chunk={args.chunk} "
          f"(one (T, V) float32 tensor = {args.T * args.vocab * 4 / 2**30:.2f} GiB, "
          f"the V x H weight = {args.vocab * args.hidden * 4 / 2**30:.2f} GiB)")
    with tempfile.TemporaryDirectory() as tmp:
        ratios = {mode: run_mode(args, mode, tmp) for mode in modes}
    print("peak ratio chunked / naive: " + ", ".join(f"{m} {r:.3f}" for m, r in ratios.items()))


if __name__ == "__main__":
    main()
