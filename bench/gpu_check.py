"""The GPU check (issue 24): the real entry point, on one GPU, with what a bare GPU machine has (torch, transformers;
no vLLM, no model hub), printing what it saw. Written before any GPU ran it; on a CPU it runs too (gloo), which is
how tests/test_gpu_path.py keeps it working.

    torchrun --nproc_per_node 1 bench/gpu_check.py [--out_dir runs/gpu-check] [--offload]  # ~2-4 minutes on a CPU

What it runs: muarl.main on the tiny model with the transformers engine, --dtype bfloat16 (bf16 compute, fp32
masters), FSDP2 over one rank (NCCL on a GPU), a KL reference, 2 GRPO steps with a checkpoint after each; then a
resume to step 3 from the checkpoint. What it prints: where the parameters, gradients and AdamW moments live and
in which dtype (seen at each optimizer step), each step's loss, the share of weights the steps moved, the step the
resume started at. Device mix-ups (a CPU tensor meeting a CUDA one, #24 defect 1) stop it with a traceback.
With --offload the same run keeps the shards, gradients and AdamW state in host memory (FSDP2 CPUOffloadPolicy,
NCCL for CUDA tensors and gloo for CPU ones): the steps should then find them all on the CPU.
"""

import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: muarl and its modules

import muarl  # noqa: E402

SEEN = []  # one record per optimizer step: where and in which dtype the step found its tensors


def _step_hook(opt, args, kwargs):
    """A global optimizer post-step hook: record the devices and dtypes of parameters, gradients and AdamW moments."""
    params = [p for g in opt.param_groups for p in g["params"]]
    local = [getattr(p, "_local_tensor", p) for p in params]  # FSDP2's parameters are DTensors: their shards
    grads = [getattr(p.grad, "_local_tensor", p.grad) for p in params if p.grad is not None]
    moments = [getattr(t, "_local_tensor", t) for s in opt.state.values() for t in s.values() if t.dim() > 0]
    SEEN.append({what: sorted({f"{t.device.type}/{str(t.dtype)[6:]}" for t in ts})
                 for what, ts in (("params", local), ("grads", grads), ("adamw", moments))})


def main(out_dir: str, offload: bool = False) -> None:
    from safetensors.torch import load_file

    out = Path(out_dir)
    args = ["--model", "tiny", "--domains", "shop", "--tiny_hidden", "64", "--tiny_layers", "2", "--threads", "1",
            "--tasks_per_step", "2", "--group_size", "2", "--max_new_tokens", "24", "--max_turns", "6",
            "--eval_tasks", "1", "--sft_epochs", "0", "--copy_warmup", "0", "--engine", "hf", "--dtype", "bfloat16",
            "--kl_coef", "0.05", "--save_every", "1", "--out_dir", str(out)] + (["--offload"] if offload else [])
    from torch.optim.optimizer import register_optimizer_step_post_hook

    register_optimizer_step_post_hook(_step_hook)
    t0 = time.time()
    muarl.main(args + ["--steps", "2"])  # sets up the process group (NCCL or gloo), and closes it at the end
    first = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    muarl.main(args + ["--steps", "3", "--resume"])  # a new process group, the checkpoint of step 2, one more step
    rank = int(os.environ.get("RANK", 0))
    if rank != 0:
        return
    logs = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    a, b = load_file(out / "tiny-init" / "model.safetensors"), load_file(out / "final" / "model.safetensors")
    moved = sum(int((a[k] != b[k]).sum()) for k in a) / sum(a[k].numel() for k in a)
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none (CPU, gloo)"
    print(f"\n[gpu_check] torch {torch.__version__}, GPU {gpu}, world size {os.environ.get('WORLD_SIZE')}, "
          f"offload {offload}")
    for i, seen in enumerate(SEEN):
        print(f"[gpu_check] optimizer.step call {i}: " + "; ".join(f"{k} {', '.join(v)}" for k, v in seen.items()))
    for r in (r for r in logs if r["phase"] == "grpo"):
        print(f"[gpu_check] GRPO step {r['step']}: loss {r.get('loss', float('nan')):+.5f}, kl {r.get('kl', 0):.5f}, "
              f"reward {r['reward']:.2f}, skipped {r['skipped']}, logp_gap {r.get('logp_gap', 0):.4f}")
    resumed = [r["step"] for r in logs if r["phase"] == "grpo"][len([r for r in first if r["phase"] == "grpo"]):]
    print(f"[gpu_check] weights moved: {100 * moved:.1f} % of entries (tiny-init -> final)")
    print(f"[gpu_check] resume: started at step {resumed[0] if resumed else None}; steps logged {resumed}")
    if torch.cuda.is_available():
        print(f"[gpu_check] peak GPU memory {torch.cuda.max_memory_allocated() / 2**20:.0f} MiB")
    print(f"[gpu_check] done in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main(sys.argv[sys.argv.index("--out_dir") + 1] if "--out_dir" in sys.argv else "runs/gpu-check",
         offload="--offload" in sys.argv)
    muarl.exit_now(int(os.environ.get("WORLD_SIZE", 1)))
