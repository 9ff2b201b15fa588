"""Loading the policy, its frozen reference and its tokenizer (a hub id or a local Hugging Face
folder).

MUA-RL starts from Qwen3 (8B/14B/32B, non-thinking mode) and keeps a frozen copy of the starting
policy as the KL reference (the paper, arXiv:2508.18669). `load_policy("Qwen/Qwen3-8B")` and
`load_reference(...)` are all a GPU run needs; under torchrun each rank reads only its shards
instead (fsdp.load_sharded).
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch


def n_params(model) -> int:
    """Parameter count, shared (tied) tensors counted once."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


# --------------------------------------------------------------------------------------------------
# 1. Loading a policy and its frozen reference


def _from_pretrained(name_or_path: str, dtype, device):
    from transformers import AutoModelForCausalLM

    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype  # "bfloat16" -> torch.bfloat16
    return AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype).to(device)


def load_tokenizer(name_or_path: str):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"tokenizer of {name_or_path!r} has no chat template: muarl renders every turn with it")
    return tokenizer


def model_folder(name_or_path: str) -> str:
    """A local folder holding the model: the path itself, or the hub's cached download of an id
    (sharded loading, vLLM and the memory plan read the files, not a loaded model). A hub that
    cannot be reached is one line."""
    if Path(name_or_path).is_dir():
        return name_or_path
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(name_or_path, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.jinja",
                                                               "*.model"])
    except Exception as e:  # noqa: BLE001 - no network, no such repo, no token: the same advice
        first = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
        raise ValueError(f"--model {name_or_path}: cannot fetch it from the Hugging Face hub ({first}); download it "
                         f"where the hub can be reached (huggingface-cli download {name_or_path} --local-dir DIR) "
                         "and pass the local folder: --model DIR") from None


def load_policy(name_or_path: str, dtype="float32", device="cpu"):
    """(model, tokenizer) from a hub id or a local directory (e.g. one written by build_tiny)."""
    tokenizer = load_tokenizer(name_or_path)  # first: fail fast, before loading gigabytes of weights
    return _from_pretrained(name_or_path, dtype, device), tokenizer


def freeze(model):
    """Eval mode and no gradients: what a KL reference needs, and nothing the optimizer can touch."""
    return model.eval().requires_grad_(False)


def load_reference(name_or_path: str | None = None, dtype="float32", device="cpu", model=None):
    """The frozen reference policy: loaded from `name_or_path`, or a deep copy of an in-memory
    `model` (e.g. the policy right after SFT, before any RL step)."""
    return freeze(copy.deepcopy(model) if model is not None else _from_pretrained(name_or_path, dtype, device))


# --------------------------------------------------------------------------------------------------
# 2. The run's policy: loaded whole, or sharded under torchrun


def build_or_load_model(cfg, device: str, dtype: str, rank=0, world_size=1, sharded: bool = False, build=None):
    """(policy, tokenizer, model_path): fp32 weights, AdamW's masters (`dtype`: the forward's).
    Under torchrun (`sharded`) each rank reads only its own shards (fsdp.load_sharded). `build`: a
    function () -> folder that makes the model when it is not there yet (the CPU demo's tiny one);
    rank 0 alone calls it (or fetches a hub id), and every rank reads the folder it names."""
    from plumbing.fsdp import decide_on_rank0, load_sharded, on_every_node  # (fsdp needs none of this file)

    # rank 0 alone decides whether the model must be fetched (or built), and where it is; every rank
    # then reads that folder, which must be on its own disk too
    path = str(decide_on_rank0(build or (lambda: model_folder(cfg.model)), world_size))
    on_every_node(path, world_size, "the model folder")
    if sharded:
        policy = load_sharded(path, torch.float32, cfg.activation_checkpointing, dtype == "bfloat16", cfg.offload)
        return policy, load_tokenizer(path), path
    return (*load_policy(path, dtype="float32", device=device), path)


def reference_for(cfg, out: Path, model_path: str, device: str, sharded: bool):
    """The frozen KL reference: the policy as RL starts (out/cold-start after a cold start, else the
    model itself), as in the paper, read from disk in the compute dtype (bf16 on a GPU: it never
    trains); under FSDP2 each rank reads its shards. None when the KL term is off (--kl_coef 0)."""
    if cfg.kl_coef <= 0:
        return None
    from plumbing.fsdp import decide_on_rank0, load_sharded, on_every_node

    # decided on rank 0: ranks that chose from their own disks could read two models' shards
    world_size = torch.distributed.get_world_size() if sharded else 1
    start = decide_on_rank0(lambda: str(out / "cold-start" if (out / "cold-start").exists() else model_path),
                            world_size)
    on_every_node(start, world_size, "the KL reference")
    if sharded:
        return load_sharded(start, getattr(torch, cfg.dtype), bf16=cfg.dtype == "bfloat16", frozen=True,
                            offload=cfg.offload)
    return load_reference(start, dtype=cfg.dtype, device=device)
