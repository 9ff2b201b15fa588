"""Torch threads for the CPU demo's training steps: 1 against 2, alone and beside a busy neighbour.

Why `--train_threads 2 --threads 1` is the preset (demo/__init__.py): drills, SFT and each update are the policy
alone computing (the served customer idles then), so a second thread should pay; the conversations are the policy
and the customer's vLLM server computing at once on 2 cores, where a second policy thread has to wait at every
barrier of every op for a core the server holds. This bench measures both sides with the demo's own pieces: SFT
steps (sft.train) of the preset's tiny model (hidden 128, 2 layers, vocabulary 512) on the store world's expert
conversations, batch 8 in rows of 512 tokens, as the cold start runs them.

    python bench/bench_threads.py            # 4 variants, interleaved, 3 repeats of 20 steps each (~2 min idle)
    python bench/bench_threads.py --quick    # 1 repeat of 8 steps

Variants: threads 1 or 2, alone or with a "neighbour": a second process doing single-threaded matmuls without a
pause (standing in for the customer's server mid-rollout). Wall-clock seconds per step, best repeat of each; the
machine is shared, so run it on an idle one and read the ratios, which the last line prints.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import sft  # noqa: E402
from demo.tiny_model import build_tiny  # noqa: E402
from domains import load_world  # noqa: E402


def neighbour(stop) -> None:
    """A process that keeps one core busy (single-threaded matmuls) until told to stop."""
    torch.set_num_threads(1)
    a = torch.randn(256, 256)
    while not stop.is_set():
        a = torch.tanh(a @ a)


def seconds_per_step(model, examples, threads: int, steps: int, busy: bool) -> float:
    stop = mp.Event()
    other = mp.Process(target=neighbour, args=(stop,)) if busy else None
    if other:
        other.start()
        time.sleep(0.5)  # let it get going
    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    sft.train(model, examples, epochs=steps * 8 / len(examples), batch_size=8, lr=1e-3, micro_batch_tokens=512,
              show_progress=False)
    dt = (time.perf_counter() - t0) / steps
    if other:
        stop.set()
        other.join()
    return dt


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true")
    a = p.parse_args()
    steps, repeats = (8, 1) if a.quick else (20, 3)
    world = load_world("store", seed=0)
    tasks = world.tasks("train")[:200]
    model, tok = build_tiny(tempfile.mkdtemp(), texts=[world.rules] + [json.dumps(t.expert) for t in tasks],
                            vocab_size=512, hidden=128, layers=2, intermediate=512, split_digits=True)
    examples = sft.render_examples(tok, [dict(c, tools=[]) for c in sft.expert_conversations(tasks)],
                                   {world.name: world})
    variants = [(1, False), (2, False), (1, True), (2, True)]
    best = {v: float("inf") for v in variants}
    for r in range(repeats):  # interleaved: a load change hits every variant alike
        for v in variants:
            best[v] = min(best[v], seconds_per_step(model, examples, v[0], steps, v[1]))
            print(f"repeat {r}: threads {v[0]}, {'beside a busy neighbour' if v[1] else 'alone'}: "
                  f"{best[v]:.3f} s/step (best so far)", flush=True)
    print("\n| threads | alone (s/step) | beside a busy neighbour (s/step) |\n|---|---|---|")
    for n in (1, 2):
        print(f"| {n} | {best[(n, False)]:.3f} | {best[(n, True)]:.3f} |")
    print(f"\nalone: 2 threads are {best[(1, False)] / best[(2, False)]:.2f}x as fast as 1; beside a busy neighbour: "
          f"{best[(1, True)] / best[(2, True)]:.2f}x")


if __name__ == "__main__":
    main()
