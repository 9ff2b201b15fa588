"""The memory plan and fp32 masters, measured on a GPU: what `memory_plan.plan` says one GRPO update needs,
beside what CUDA's allocator saw during a real update (muarl.update) of a random model of Qwen3-8B's width, and how
many weights an update at the paper's lr moves with fp32 masters (bf16 compute) against bf16 weights.
bench/gpu_check.py is the whole GPU check (FSDP2, the KL reference, the longest row, weight sync, checkpoints,
offload, in one table); this probe adds the one-process case and the fp32-master comparison.

    python bench/gpu_plan.py [--layers 8] [--tokens 16384]     # on a GPU: ~1-2 minutes (a 2.8B model at 8 layers)
    python bench/gpu_plan.py --tiny                            # anywhere: a tiny Qwen3, so a CPU can run the script
    torchrun --nproc_per_node 1 bench/gpu_plan.py --sharded --layers 2   # FSDP2: saved, then fsdp.load_sharded

Why Qwen3-8B's width with fewer layers: the plan's parts are per layer (activations) or per parameter (masters,
gradients, AdamW, bf16 copies), so 8 of 36 layers at the real width and vocabulary checks every term the 8B plan has,
on one GPU, in one process (no FSDP: the planned "copies" are autocast's bf16 weight cache). The reference and vLLM
are left out (engine "none", kl 0): their bytes are counted, not computed. Printed last: measured / planned.
"""

import argparse
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root

from plumbing import memory_plan as models  # noqa: E402
import muarl  # noqa: E402


def episodes(n: int, length: int, vocab: int, seed: int = 0) -> tuple[list, list]:
    """n episodes of `length` tokens: a 64-token prompt (mask 0), then alternating 32-token agent / customer spans."""
    g = torch.Generator().manual_seed(seed)
    eps = []
    for k in range(n):
        ids = torch.randint(0, vocab, (length,), generator=g).tolist()
        mask = [0] * 64 + [int((t // 32) % 2 == 0) for t in range(length - 64)]
        eps.append(SimpleNamespace(ids=ids, mask=mask, logprobs=[-1.5 * m for m in mask]))
    return eps, [(-1.0) ** k * (0.5 + 0.1 * k) for k in range(n)]  # advantages of mixed sign


def build(cfg: dict, dev: torch.device, dtype: torch.dtype, seed: int = 0):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    with dev:  # built and initialised on the device (a 2.8B model's init on the host takes minutes)
        return Qwen3ForCausalLM(Qwen3Config(**cfg)).to(dtype)


def settings(tokens: int, world_size: int = 1) -> dict:
    """update()'s config and ranks: bf16 compute (over whatever the weights are), no KL, the paper's grad clip."""
    c = muarl.Config(micro_batch_tokens=tokens, logprob_chunk=1024, kl_coef=0.0, grad_clip=1.0, dtype="bfloat16")
    return dict(cfg=c, world_size=world_size)


def second_update(model, eps, adv, dev: torch.device, **kw) -> dict:
    """Peak bytes allocated during a second update (the first made AdamW's moments; nan off a GPU), its seconds."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.01)
    muarl.update(model, None, eps, adv, opt, **kw)
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.time()
    st = muarl.update(model, None, eps, adv, opt, **kw)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() if dev.type == "cuda" else float("nan")
    return {"peak": peak, "s": time.time() - t0, "loss": st["loss"], "skipped": st["skipped"]}


def measure(cfg: dict, dev: torch.device, tokens: int, checkpointing: bool) -> dict:
    """One process: fp32 weights under autocast, activation checkpointing on or off."""
    model = build(cfg, dev, torch.float32)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    eps, adv = episodes(tokens // 2048, 2048, cfg["vocab_size"])
    return second_update(model, eps, adv, dev, **settings(tokens))


def sharded(cfg: dict, tokens: int, checkpointing: bool) -> None:
    """Under torchrun: the model saved as a hub folder, loaded back by fsdp.load_sharded (meta device, this rank's
    rows, FSDP2 with bf16 all-gathers), checked equal to what was saved, then the plan against a second update."""
    import shutil
    import tempfile

    from plumbing.fsdp import barrier, dist_setup, dist_teardown, full_state_dict, load_sharded, rank_device

    rank, world_size = dist_setup()
    dev = rank_device()
    folder = Path(tempfile.gettempdir()) / "muarl-gpu-plan"  # one folder every rank reads (one machine)
    if rank == 0:
        build(cfg, dev, torch.float32).save_pretrained(folder)
    barrier(world_size)
    saved = None
    model = load_sharded(str(folder), torch.float32, checkpointing, bf16=True)
    barrier(world_size)
    if rank == 0:
        from safetensors.torch import load_file

        saved = {}
        for f in sorted(folder.glob("*.safetensors")):
            saved.update(load_file(f))
        shutil.rmtree(folder)
    loaded = full_state_dict(model, world_size, keep=rank == 0)
    if rank == 0:
        same = sum(torch.equal(loaded[k].cpu(), saved[k]) for k in saved if k in loaded)
        print(f"[gpu_plan] load_sharded on {world_size} rank(s), {dev}: {same} of {len(saved)} saved tensors "
              f"equal after loading (entries {sum(v.numel() for v in saved.values()) / 1e9:.2f}B)")
    del loaded, saved
    eps, adv = episodes(tokens // 2048, 2048, cfg["vocab_size"])
    mine = slice(rank * len(eps) // world_size, (rank + 1) * len(eps) // world_size)
    m = second_update(model, eps[mine], adv[mine], dev, **settings(tokens, world_size))
    planned = models.plan(cfg, world_size, tokens=tokens // world_size, checkpointing=checkpointing, reference=False,
                          bf16=True, chunk=1024, engine="none", sharded=True)
    if rank == 0:
        print(f"[gpu_plan] FSDP2, activation checkpointing {checkpointing}: planned update "
              f"{planned['update'] / models.GIB:.1f} GiB (copies {planned['copies'] / models.GIB:.1f}, acts "
              f"{planned['acts'] / models.GIB:.1f}); measured peak {m['peak'] / models.GIB:.1f} GiB; update "
              f"{m['s']:.2f} s, loss {m['loss']:+.4f}, skipped {m['skipped']}")
        print(f"[gpu_plan] measured / planned peak (FSDP2): {m['peak'] / planned['update']:.3f}")
    dist_teardown(world_size)


def moved(cfg: dict, dev: torch.device, tokens: int, weights: torch.dtype) -> float:
    """Share of weight entries one AdamW step at lr 1e-6 changes: fp32 masters (bf16 compute) or bf16 weights."""
    model = build(cfg, dev, weights)
    before = [p.detach().clone() for p in model.parameters()]
    eps, adv = episodes(max(1, tokens // 2048), 2048, cfg["vocab_size"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.01)
    muarl.update(model, None, eps, adv, opt, **settings(tokens))
    changed = sum(int((p.detach() != b).sum()) for p, b in zip(model.parameters(), before))
    return changed / sum(b.numel() for b in before)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=8, help="decoder layers at Qwen3-8B's width (it has 36)")
    ap.add_argument("--tokens", type=int, default=16384, help="tokens in the step's one packed row")
    ap.add_argument("--tiny", action="store_true", help="a tiny Qwen3 instead, so the script runs on a CPU")
    ap.add_argument("--sharded", action="store_true", help="under torchrun: FSDP2 from a saved folder (load_sharded)")
    ap.add_argument("--no_checkpointing", action="store_true", help="with --sharded: keep every layer's activations")
    a = ap.parse_args(argv)
    cfg = {k: v for k, v in models.load_config("Qwen/Qwen3-8B").items()
           if k in ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                    "head_dim", "tie_word_embeddings", "rms_norm_eps", "rope_theta")}
    cfg.update(num_hidden_layers=a.layers, max_position_embeddings=max(4096, a.tokens))
    if a.tiny:
        cfg.update(vocab_size=320, hidden_size=64, intermediate_size=128, num_attention_heads=2, num_key_value_heads=1,
                   head_dim=64, num_hidden_layers=2)
        a.tokens = min(a.tokens, 4096)
    if a.sharded:
        return sharded(cfg, a.tokens, not a.no_checkpointing)
    dev = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    P = models.param_counts(cfg)[0]
    name = torch.cuda.get_device_name() if dev.type == "cuda" else "CPU (no peak is measured)"
    shape = "a tiny Qwen3" if a.tiny else "Qwen3-8B's width"
    print(f"[gpu_plan] torch {torch.__version__}, {name}; {shape}, {cfg['num_hidden_layers']} layers, "
          f"{P / 1e9:.2f}B parameters, one row of {a.tokens} tokens, bf16 compute over fp32 masters, one process")
    for weights in (torch.float32, torch.bfloat16):
        share = moved(cfg, dev, 2048, weights)
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        print(f"[gpu_plan] one AdamW step at lr 1e-6, {str(weights)[6:]} weights: {100 * share:.2f} % of entries moved")
    ratios = []
    for ckpt in (True, False):
        planned = models.plan(cfg, 1, tokens=a.tokens, checkpointing=ckpt, reference=False, bf16=True, chunk=1024,
                              engine="none", sharded=False)
        try:
            m = measure(cfg, dev, a.tokens, ckpt)
        except torch.OutOfMemoryError as e:
            print(f"[gpu_plan] activation checkpointing {ckpt}: out of memory ({str(e).splitlines()[0]})")
            continue
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        parts = ", ".join(f"{k} {planned[k] / models.GIB:.1f}" for k in ("masters", "grads", "adamw", "copies", "acts",
                                                                        "logits"))
        ratios.append((ckpt, m["peak"] / planned["update"]))
        print(f"[gpu_plan] activation checkpointing {ckpt}: planned update {planned['update'] / models.GIB:.1f} GiB "
              f"({parts}); measured peak {m['peak'] / models.GIB:.1f} GiB; update {m['s']:.2f} s "
              f"({a.tokens / m['s']:.0f} tokens/s), loss {m['loss']:+.4f}, skipped {m['skipped']}")
    print("[gpu_plan] measured / planned peak: " + ", ".join(f"checkpointing {c}: {r:.3f}" for c, r in ratios))


if __name__ == "__main__":
    main()
