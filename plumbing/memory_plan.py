"""The memory plan of a GPU run, from config.json alone: what each GPU holds in both phases of a
GRPO step.

    python -m plumbing.memory_plan                     # Qwen3-8B on 1 and 8 GPUs, Qwen3-32B on 8 (configs/)
    python muarl.py --model Qwen/Qwen3-8B --plan 8     # this run's flags, on 8 GPUs, then exit


A GRPO step has two phases that share each GPU: the rollout (vLLM awake; the trainer's weights and
AdamW moments resident) and the update (vLLM asleep, level 1: its weights copied to host memory, its
KV cache freed; gradients, activations and the bf16 compute copies of the weights come and go). The
plan is the larger of the two, per GPU:

    masters   4 P / W      fp32 weights, sharded over W GPUs by FSDP2 (one process: W = 1, nothing sharded)
    grads     4 P / W      fp32, reduce-scattered
    adamw     8 P / W      two fp32 moments; the step's foreach temporaries add another 4 P / W while it runs
    copies    bf16 weights the forward computes with: under FSDP2 the root (embeddings, head; and its unsharded
              gradient) + 2 gathered layers;
              one process under autocast: every matrix, cached for the backward
    acts      T tokens per packed row x bytes per token (below); with checkpointing one hidden state per layer
              plus one layer recomputed at a time
    logits    one chunk of fp32 log-softmax, (chunk, V), three live copies
    reference the frozen KL policy in bf16, sharded like the masters (none at kl_coef 0)
    vllm      its bf16 weights / tensor-parallel size, and the KV cache it reserves (its share of the GPU minus them)

Symbols: P parameters, W GPUs (world size), T tokens per packed row (--micro_batch_tokens), L
layers, D hidden, I intermediate, H / K attention / key-value heads of hd dims, V vocabulary.

Bytes saved for the backward per token and layer were counted on a CPU (saved-tensor hooks, Qwen3,
transformers 5.19, sdpa): fp32 24D + 16I + 16(H + K)hd + 8H + 4K + 8; bf16 under autocast 26D + 8I +
10(H + K)hd + 8H + 4K + 8 (RMSNorm keeps fp32 copies). tests/test_gpu_path.py checks the plan
against measured peaks (CPU: tiny and 100M models, 1 and 4 ranks) to 15 %. On a GPU: flash attention
saves what sdpa does here; CUDA's context, NCCL buffers and fragmentation are not counted: keep ~10
% free.

Departures: 1. No allocator model: the peak is a sum of what is live, not what the caching allocator
reserved.
2. vLLM's own activations and CUDA graphs are inside its share; its sleep leaves ~1 GiB that we do
   not count."""

from __future__ import annotations

import json
import sys
from pathlib import Path

# --------------------------------------------------------------------------------------------------
# 3. The memory plan: bytes per GPU of each part, for both phases of a step

GIB = 2**30
CONFIGS = Path(__file__).resolve().parents[1] / "configs"  # public config.json files, by the hub id's last part


def load_config(model: str) -> dict:
    """config.json of a local model folder, or of a hub id shipped in configs/ (Qwen/Qwen3-8B ->
    configs/Qwen3-8B)."""
    for path in (Path(model) / "config.json", CONFIGS / model.split("/")[-1] / "config.json"):
        if path.is_file():
            return json.loads(path.read_text())
    raise ValueError(f"no config.json for {model!r}: pass a model folder, or add configs/{model.split('/')[-1]}/")


def param_counts(c: dict) -> tuple[int, int, int]:
    """(P, one decoder layer's parameters, the root's: embeddings, lm_head unless tied, final norm)
    of a Qwen3/Llama."""
    D, I, L, V = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["vocab_size"]
    hd = c.get("head_dim") or D // c["num_attention_heads"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    layer = D * q + 2 * D * kv + q * D + 3 * D * I + 2 * D + 2 * hd  # q, k, v, o; gate, up, down; 2 norms, q/k norms
    root = V * D * (1 if c.get("tie_word_embeddings") else 2) + D
    return L * layer + root, layer, root


def act_bytes_per_token(c: dict, bf16: bool) -> tuple[float, float]:
    """(bytes one decoder layer saves per token for the backward, bytes outside the layers per
    token)."""
    D, I, H, K = c["hidden_size"], c["intermediate_size"], c["num_attention_heads"], c["num_key_value_heads"]
    hd = c.get("head_dim") or D // H
    if bf16:
        return 26 * D + 8 * I + 10 * (H + K) * hd + 8 * H + 4 * K + 8, 14 * D + 4 * hd
    return 24 * D + 16 * I + 16 * (H + K) * hd + 8 * H + 4 * K + 8, 12 * D + 8 * hd + 12


def plan(c: dict, gpus: int, tokens: int, checkpointing: bool, reference: bool, bf16: bool = True,
         chunk: int = 1024, engine: str = "vllm", engine_tp: int = 1, engine_share: float = 0.5,
         gpu_gib: float = 80.0, sharded: bool | None = None, offload: bool = False) -> dict:
    """Bytes per GPU of each part, both phases and the peak, for a run on `gpus` GPUs (FSDP2 when
    sharded: by default when gpus > 1). engine: "vllm" (its own bf16 copy, engine_share of the GPU),
    "hf" (shares the policy) or "none". `offload` (FSDP2 CPU offload, always sharded): masters,
    gradients, AdamW and the reference live in host memory ("host": per GPU, with vLLM's weights
    while it sleeps); the GPU holds the gathered layers and their gradients."""
    P, layer, root = param_counts(c)
    W, b = gpus, 2 if bf16 else 4
    sharded = gpus > 1 or offload if sharded is None else sharded or offload
    L, D, V = c["num_hidden_layers"], c["hidden_size"], c["vocab_size"]
    per_layer, outside = act_bytes_per_token(c, bf16)
    if sharded:  # FSDP2 gathers the root for the whole forward and backward, and a layer at a time (+1 prefetched);
        copies = b * (2 * root + 2 * layer)  # the root's gradient is whole until its reduce-scatter, at the very end
    else:  # autocast caches a bf16 copy of every matrix it casts (the embedding is looked up, not cast)
        copies = 2 * (P - V * D) if bf16 else 0
    full = tokens * (L * per_layer + outside)  # every layer's saved tensors
    ckpt = tokens * (L * b * D + outside + per_layer)  # one hidden state per layer boundary + one layer recomputed
    p = {"masters": 4 * P / W, "grads": 4 * P / W, "adamw": 8 * P / W, "copies": copies,
         "acts": ckpt if checkpointing else full, "acts_no_ckpt": full, "acts_ckpt": ckpt,
         "logits": 3 * 4 * min(chunk, tokens) * V, "reference": b * P / W if reference else 0}
    p["vllm_weights"] = 2 * P / engine_tp if engine == "vllm" else 0
    # host memory: vLLM's weights while it sleeps (level 1) through the update, and what --offload
    # keeps there (on the GPU it is then only the gathered copies, and their gradients until reduced
    # and copied out)
    offloaded = ("masters", "grads", "adamw", "reference") if offload else ()
    p["host"] = p["vllm_weights"] + sum(p[k] for k in offloaded)
    p.update(dict.fromkeys(offloaded, 0))
    p["vllm_kv"] = max(0.0, engine_share * gpu_gib * GIB - p["vllm_weights"]) if engine == "vllm" else 0
    kv_token = 2 * L * c["num_key_value_heads"] * (c.get("head_dim") or D // c["num_attention_heads"]) * 2
    p["kv_tokens"] = p["vllm_kv"] * engine_tp / kv_token  # tokens of context the cache holds (all sequences)
    resident = p["masters"] + p["adamw"] + p["reference"]
    p["rollout"] = resident + p["vllm_weights"] + p["vllm_kv"]
    step = 0 if offload else 4 * P / W  # AdamW's temporaries (on the CPU with offload)
    p["update"] = resident + p["grads"] + max(p["copies"] + p["acts"] + p["logits"], step)
    p["peak"] = max(p["rollout"], p["update"])
    # ~10 % for the CUDA context and NCCL; vLLM needs a cache for one row of context at least
    kv_ok = engine != "vllm" or p["kv_tokens"] >= tokens
    p.update(P=P, gpus=W, gpu_gib=gpu_gib, fits=p["peak"] <= 0.9 * gpu_gib * GIB and kv_ok)
    return p


def format_plan(name: str, p: dict) -> str:
    """One Markdown row per part (GiB per GPU) for the plans in `p` (a list of (label, plan))."""
    rows = [("masters fp32", "masters"), ("grads fp32", "grads"), ("AdamW fp32", "adamw"), ("bf16 copies", "copies"),
            ("acts, no ckpt", "acts_no_ckpt"), ("acts, ckpt", "acts_ckpt"), ("logits chunk", "logits"),
            ("reference bf16", "reference"), ("vLLM weights", "vllm_weights"), ("vLLM KV cache", "vllm_kv"),
            ("= rollout phase", "rollout"), ("= update phase", "update"), ("= peak", "peak"),
            ("host memory", "host")]
    out = [f"{name} | " + " | ".join(label for label, _ in p), "---|" * (len(p) + 1)]
    out += [f"{label} | " + " | ".join(f"{q[k] / GIB:.1f}" for _, q in p) for label, k in rows]
    out.append("fits | " + " | ".join(("yes" if q["fits"] else "NO") + f" ({q['gpu_gib']:.0f} GiB)" for _, q in p))
    out.append("KV cache, tokens | " + " | ".join(f"{q['kv_tokens'] / 1e3:.0f}k" for _, q in p))
    return "\n".join(out)


def describe(cfg, gpus: int, engine: str, gpu_gib: float, sharded: bool) -> str:
    """muarl's plan of the run `cfg` on `gpus` GPUs, as a table, and the fewest GPUs that fit it
    when these do not; or why there is none."""
    model, tokens, checkpointing, reference = cfg.model, cfg.micro_batch_tokens, cfg.activation_checkpointing, \
        cfg.kl_coef > 0
    bf16, chunk, engine_share, offload = cfg.dtype == "bfloat16", cfg.logprob_chunk, cfg.engine_memory, cfg.offload
    try:
        c = load_config(model)
    except (ValueError, OSError) as e:
        return f"memory plan: none ({e})"
    kw = dict(tokens=tokens, checkpointing=checkpointing, reference=reference, bf16=bf16, chunk=chunk, engine=engine,
              engine_share=engine_share, gpu_gib=gpu_gib, offload=offload)
    p = plan(c, gpus, sharded=sharded or gpus > 1, **kw)
    table = format_plan(f"{model}: GiB per GPU", [(f"{gpus} GPU(s), {gpu_gib:.0f} GiB", p)])
    return table if p["fits"] else f"{table}\nDOES NOT FIT: {min_gpus(c, **kw) or 'no number of'} such GPUs would " \
        "(or --offload under torchrun, --activation_checkpointing true, a smaller --micro_batch_tokens, --kl_coef 0)"


def min_gpus(c: dict, **kw) -> int | None:
    """The fewest GPUs (a power of 2, up to 64) on which `plan` fits; None if none does."""
    return next((w for w in (1, 2, 4, 8, 16, 32, 64) if plan(c, w, **kw)["fits"]), None)


def demo_plans(tokens: int = 16384) -> str:
    """The README's table: the paper's settings (16,384 tokens per row, reference on), 80 GiB H100s."""
    c8, c32 = load_config("Qwen/Qwen3-8B"), load_config("Qwen/Qwen3-32B")
    kw = {"tokens": tokens, "reference": True}
    off = {"offload": True, "engine_share": 0.85}  # the trainer holds nothing on the GPU while vLLM generates
    cols = [("8B, 1 GPU", plan(c8, 1, checkpointing=True, **kw)),
            ("8B, 1 GPU, offload", plan(c8, 1, checkpointing=True, **off, **kw)),
            ("8B, 8 GPUs", plan(c8, 8, checkpointing=True, **kw)),
            ("32B, 8 GPUs", plan(c32, 8, checkpointing=True, **kw)),
            ("32B, 8 GPUs, offload", plan(c32, 8, checkpointing=True, **off, **kw))]
    need = {name: min_gpus(c, checkpointing=True, **o, **kw) for name, c, o in
            (("8B", c8, {}), ("8B offload", c8, off), ("32B", c32, {}), ("32B offload", c32, off))}
    return format_plan("GiB per GPU (vLLM TP 1)", cols) + "\n\nfewest 80 GiB GPUs that fit: " + ", ".join(
        f"{k} {v}" for k, v in need.items())


if __name__ == "__main__":
    P8, P32 = param_counts(load_config("Qwen/Qwen3-8B"))[0], param_counts(load_config("Qwen/Qwen3-32B"))[0]
    print(f"Qwen3-8B: {P8 / 1e9:.2f}B parameters; Qwen3-32B: {P32 / 1e9:.2f}B\n")
    print(demo_plans(int(sys.argv[1]) if sys.argv[1:] else 16384))

