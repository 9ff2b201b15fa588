"""The memory plan of a GPU run, from config.json alone: what each GPU holds in both phases of a
GRPO step, and whether vLLM would start at all.

    python -m plumbing.memory_plan                     # Qwen3-8B on 1 and 8 GPUs, Qwen3-32B on 8 (configs/)
    python muarl.py --model Qwen/Qwen3-8B --plan 8     # this run's flags, on 8 GPUs, then exit

A GRPO step has two phases that share each GPU: the rollout (vLLM awake and holding its whole share;
the trainer's masters, AdamW moments and reference resident) and the update (vLLM asleep, level 1:
its weights copied to host memory, its KV cache freed; gradients, activations and the bf16 compute
copies of the weights come and go). Between them the new weights are pushed into vLLM, its weights
woken and its KV cache still asleep, one gathered tensor at a time. The plan is the largest, per GPU:

    masters   4 P / W      fp32 weights, sharded over W GPUs by FSDP2 (one process: W = 1, nothing sharded)
    grads     4 P / W      fp32, reduce-scattered
    adamw     8 P / W      two fp32 moments; the step's foreach temporaries add another 4 P / W while it runs
    copies    bf16 weights the forward computes with: under FSDP2 the root (embeddings, head; and its unsharded
              gradient) + 2 gathered layers; one process under autocast: every matrix, cached for the backward
    acts      T tokens in the longest row x bytes per token (below); with checkpointing one hidden state per
              layer plus one layer recomputed at a time
    logits    one chunk of fp32 log-softmax, (chunk, V), three live copies
    reference the frozen KL policy in bf16, sharded like the masters (none at kl_coef 0). It is resharded after
              its forward (fsdp.reshard), so its shards are all it keeps; a configuration that kept it gathered
              would add its root (reference_resharded=False)
    vllm      its share, --engine_memory x the GPU's memory, held whole while awake (its budget, below);
              asleep it keeps its CUDA graphs and non-torch memory
    customer  --user_serve on a GPU: the customer's own vLLM server on GPU 0, --user_memory x its memory plus
              its process's CUDA context, in both phases (it never sleeps); the plan is then GPU 0's

The longest row: rows are packed to --micro_batch_tokens, but an episode longer than a row is trained in
a row of its own, and one episode can reach --max_context tokens: the update's activations are planned
for T = max(micro_batch_tokens, max_context) tokens.

vLLM's budget, as vLLM 0.32 computes it (v1/worker/gpu_worker.py determine_available_memory, v1/worker/
utils.py request_memory, v1/core/kv_cache_utils.py check_enough_kv_cache_memory). It asks for share x
the GPU's total memory (and stops unless that much is free as it starts); its KV cache is what is left
of that after its non-KV memory:

    KV = share x GPU - weights - activation peak - CUDA graphs - non-torch
    weights     2 P / TP, bf16 (the trainer's vLLM runs TP 1: engine.py passes no tensor_parallel_size)
    activation  the peak of its profiling run: a forward of N = max_num_batched_tokens tokens (attention
                skipped), largest in the MLP, 2 N (2 D + 3 I / TP) bytes (hidden and residual, gate_up, the
                activation); or the sampler's, on S = max_num_seqs rows of logits, 2 N D + 6 S V (bf16 logits
                and an fp32 copy), whichever is larger
    graphs      CUDA graphs: a fixed 1 GiB (vLLM measures it by capturing them; 0 with --enforce-eager)
    non-torch   a fixed 0.5 GiB: cuBLAS and attention workspaces, persistent input buffers
    N, S        vLLM's defaults for an offline LLM (arg_utils.py get_batch_defaults): 16,384 and 1,024 on a
                GPU of >= 70 GiB, else 8,192 and 256 (an A100 of 80 GiB gets these too: the plan does not
                know the GPU's name); the customer's server (an API server, run unchunked with
                --enforce-eager) N = max(max_model_len, 8192), S 1,024 (>= 70 GiB) or 256

It refuses to start ("To serve at least one request with the model's max seq len ...") when KV is
less than one request of max_model_len tokens (the run passes --max_context; the customer's server
the smaller of it and its model's max_position_embeddings): ceil(max_model_len / 16) blocks of 16
tokens plus the null block, 2 L K hd / TP x 2 bytes a token (bf16 keys and values).

Symbols: P parameters, W GPUs (world size), T tokens in the longest row, L layers, D hidden, I
intermediate, H / K attention / key-value heads of hd dims, V vocabulary, TP vLLM's tensor parallelism.

Bytes saved for the backward per token and layer were counted on a CPU (saved-tensor hooks, Qwen3,
transformers 5.19, sdpa): fp32 24D + 16I + 16(H + K)hd + 8H + 4K + 8; bf16 under autocast 26D + 8I +
10(H + K)hd + 8H + 4K + 8 (RMSNorm keeps fp32 copies). tests/test_gpu_path.py checks the update
against measured peaks (CPU: tiny and 100M models, 1 and 4 ranks) to 15 %; bench/gpu_check.py checks
it on a GPU. Fits: both phases within 90 % of the GPU (CUDA's context, NCCL buffers and fragmentation
are not counted), vLLM starts, and so does the customer's server where its weights are known.

Departures: 1. No allocator model: the peak is a sum of what is live, not what the caching allocator
   reserved.
2. vLLM's activation peak is a formula, its CUDA graphs and non-torch memory fixed sizes, not
   measurements (vLLM logs its own: "Available KV cache memory"); at run time its sampler's processed
   log-probs may exceed what the profiling run saw (inside the 10 %).
3. The hf engine under FSDP2 loads its own whole bf16 copy (counted); its KV cache grows with the
   conversation (not counted)."""

from __future__ import annotations

import itertools
import json
import math
import sys
from pathlib import Path

# --------------------------------------------------------------------------------------------------
# Sizes from config.json

GIB = 2**30
CONFIGS = Path(__file__).resolve().parents[1] / "configs"  # public config.json files, by the hub id's last part
VLLM_GRAPHS = 1.0 * GIB  # CUDA graphs of the trainer's vLLM (the customer's server runs --enforce-eager: none)
VLLM_NON_TORCH = 0.5 * GIB  # vLLM's workspaces and buffers outside its weights, KV cache and activations
CUDA_CONTEXT = 0.5 * GIB  # a process's own CUDA context (the customer's server is a process of its own)
BLOCK = 16  # tokens per KV-cache block (vLLM's default on CUDA)


def load_config(model: str) -> dict:
    """config.json of a local model folder, of a hub id shipped in configs/ (Qwen/Qwen3-8B ->
    configs/Qwen3-8B), or of a hub id already in the Hugging Face cache (no network)."""
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(model, "config.json")
    except Exception:  # noqa: BLE001 - not a hub id, no huggingface_hub: the other places only
        cached = None
    places = [Path(model) / "config.json", CONFIGS / model.split("/")[-1] / "config.json"]
    for path in places + ([Path(cached)] if isinstance(cached, str) else []):
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


# --------------------------------------------------------------------------------------------------
# vLLM's budget: its share, what is not KV cache, and whether one request of max_model_len fits


def vllm_defaults(gpu_gib: float, server: bool) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) vLLM 0.32 picks by the GPU's memory: an offline LLM
    (the trainer's engine) or an API server (the customer's)."""
    if gpu_gib >= 160:
        return 16384, 1024
    if gpu_gib >= 70:
        return (8192 if server else 16384), 1024
    return (2048 if server else 8192), 256


def vllm_budget(c: dict, share: float, gpu_gib: float, max_model_len: int, batched: int, seqs: int,
                graphs: bool, tp: int = 1) -> dict:
    """Bytes of one vLLM instance (per GPU of its TP group): its share, weights, non-KV memory and
    the KV cache left, the tokens that cache holds, what one request of max_model_len needs, and
    `starts` (False: vLLM stops at start-up)."""
    D, I, L, V = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["vocab_size"]
    hd = c.get("head_dim") or D // c["num_attention_heads"]
    S = min(seqs, batched)
    b = {"share": share * gpu_gib * GIB, "weights": 2 * param_counts(c)[0] / tp,
         "activation": max(2 * batched * (2 * D + 3 * I / tp), 2 * batched * D + 6 * S * V),
         "graphs": VLLM_GRAPHS if graphs else 0.0, "non_torch": VLLM_NON_TORCH}
    b["non_kv"] = b["weights"] + b["activation"] + b["graphs"] + b["non_torch"]
    b["kv"] = b["share"] - b["non_kv"]
    token = 2 * L * max(1, c["num_key_value_heads"] // tp) * hd * 2  # bf16 keys and values, all layers
    b["kv_tokens"] = max(0.0, b["kv"]) / token
    b["need"] = (math.ceil(max_model_len / BLOCK) + 1) * BLOCK * token  # + the null block the pool holds back
    b.update(max_model_len=max_model_len, batched=batched, seqs=seqs, starts=b["kv"] >= b["need"])
    return b


def why_vllm_stops(b: dict, who: str) -> str:
    """One sentence: why this vLLM would not start, in its own terms."""
    if b["share"] <= b["weights"]:
        return f"{who} would not start: its share, {b['share'] / GIB:.1f} GiB, is less than its weights " \
               f"({b['weights'] / GIB:.1f} GiB)"
    return f"{who} would not start: its KV cache, {b['kv'] / GIB:.1f} GiB ({b['share'] / GIB:.1f} share - " \
           f"{b['weights'] / GIB:.1f} weights - {(b['non_kv'] - b['weights']) / GIB:.1f} non-KV), holds " \
           f"{b['kv_tokens'] / 1e3:.0f}k tokens, less than one request of max_model_len {b['max_model_len']} " \
           f"({b['need'] / GIB:.1f} GiB)"


# --------------------------------------------------------------------------------------------------
# The memory plan: bytes per GPU of each part, for both phases of a step


def plan(c: dict, gpus: int, tokens: int, checkpointing: bool, reference: bool, bf16: bool = True,
         chunk: int = 1024, engine: str = "vllm", engine_tp: int = 1, engine_share: float = 0.5,
         gpu_gib: float = 80.0, sharded: bool | None = None, offload: bool = False, max_context: int | None = None,
         customer: dict | None = None, customer_share: float = 0.0, reference_resharded: bool = True,
         customer_concurrency: int = 0, customer_reply: int = 0, host_gib: float | None = None,
         local_gpus: int | None = None) -> dict:
    """Bytes per GPU of each part, both phases and the peak, for a run on `gpus` GPUs (FSDP2 when
    sharded: by default when gpus > 1). `tokens`: a packed row; `max_context` (None: `tokens`) the
    longest episode, trained in a row of its own and the max_model_len vLLM reserves for. engine:
    "vllm" (its own bf16 copy, engine_share of the GPU), "hf" (shares the policy on one process;
    under FSDP2 its own whole copy) or "none". `offload` (FSDP2 CPU offload, always sharded):
    masters, gradients, AdamW and the reference live in host memory ("host": per GPU, with vLLM's
    weights while it sleeps). `customer_share` > 0: this GPU also holds the customer's vLLM server
    (GPU 0), of the model `customer` (its config.json; None: unknown, its share counted, its start
    not checked); `customer_concurrency` requests in flight from each of the `gpus` ranks, each
    with a reply of `customer_reply` tokens. `host_gib`: one node's memory, with `local_gpus` of
    the GPUs (None: the host is not checked). `fits` is False with the reasons in `why`."""
    P, layer, root = param_counts(c)
    W, b = gpus, 2 if bf16 else 4
    sharded = gpus > 1 or offload if sharded is None else sharded or offload
    L, D, V = c["num_hidden_layers"], c["hidden_size"], c["vocab_size"]
    context = max_context or tokens
    T = max(tokens, context)  # the longest row: one episode of max_context tokens, alone
    per_layer, outside = act_bytes_per_token(c, bf16)
    if sharded:  # FSDP2 gathers the root for the whole forward and backward, and a layer at a time (+1 prefetched);
        copies = b * (2 * root + 2 * layer)  # the root's gradient is whole until its reduce-scatter, at the very end
    else:  # autocast caches a bf16 copy of every matrix it casts (the embedding is looked up, not cast)
        copies = 2 * (P - V * D) if bf16 else 0
    full = T * (L * per_layer + outside)  # every layer's saved tensors
    ckpt = T * (L * b * D + outside + per_layer)  # one hidden state per layer boundary + one layer recomputed
    p = {"masters": 4 * P / W, "grads": 4 * P / W, "adamw": 8 * P / W, "copies": copies,
         "acts": ckpt if checkpointing else full, "acts_no_ckpt": full, "acts_ckpt": ckpt,
         "logits": 3 * 4 * min(chunk, T) * V, "reference": b * P / W if reference else 0,
         "reference_root": b * root if reference and sharded and not reference_resharded else 0}
    p["hf_copy"] = b * P if engine == "hf" and sharded else 0  # the hf engine's own model under FSDP2
    vllm = engine == "vllm"
    batched, seqs = vllm_defaults(gpu_gib, server=False)
    p["engine"] = vllm_budget(c, engine_share, gpu_gib, context, batched, seqs, graphs=True, tp=engine_tp) \
        if vllm else None
    p["vllm_share"] = p["engine"]["share"] if vllm else 0
    p["vllm_weights"] = p["engine"]["weights"] if vllm else 0
    p["vllm_non_kv"] = p["engine"]["non_kv"] - p["vllm_weights"] if vllm else 0
    p["vllm_kv"] = max(0.0, p["engine"]["kv"]) if vllm else 0
    p["kv_tokens"] = p["engine"]["kv_tokens"] if vllm else 0  # tokens of context its cache holds (all sequences)
    p["vllm_asleep"] = p["engine"]["graphs"] + p["engine"]["non_torch"] if vllm else 0
    # the customer's server on this GPU: its share and its process's CUDA context, awake in both phases
    p["customer"] = customer_share * gpu_gib * GIB + CUDA_CONTEXT if customer_share > 0 else 0
    p["customer_engine"] = None
    if customer_share > 0 and customer is not None:
        limit = customer.get("max_position_embeddings") or context
        n = min(context, limit)
        p["customer_engine"] = vllm_budget(customer, customer_share, gpu_gib, n, max(n, 8192),
                                           vllm_defaults(gpu_gib, server=True)[1], graphs=False)
        # every rank sends up to --user_concurrency requests at once; each holds its prompt and its
        # reply in the server's KV cache (the replies alone are the floor checked below)
        p["customer_engine"].update(in_flight=customer_concurrency * W, replies=customer_concurrency * W
                                    * customer_reply)
    # host memory: vLLM's weights while it sleeps (level 1) through the update, and what --offload keeps there (on the
    # GPU it is then only the gathered copies, and their gradients until reduced and copied out)
    offloaded = ("masters", "grads", "adamw", "reference") if offload else ()
    p["host"] = p["vllm_weights"] + sum(p[k] for k in offloaded)
    p.update(dict.fromkeys(offloaded, 0))
    # one node: each of its GPUs' host share, and on rank 0's node a checkpoint's whole fp32 weights
    # and AdamW moments, gathered there to be written (checkpoint.save_checkpoint)
    p["local_gpus"] = min(local_gpus or W, W)
    p["checkpoint_host"] = 12 * P
    p["host_node"] = p["host"] * p["local_gpus"] + p["checkpoint_host"]
    resident = p["masters"] + p["adamw"] + p["reference"] + p["reference_root"] + p["hf_copy"] + p["customer"]
    p["rollout"] = resident + p["vllm_share"]
    step = 0 if offload else 4 * P / W  # AdamW's temporaries (on the CPU with offload)
    p["update"] = resident + p["vllm_asleep"] + p["grads"] + max(p["copies"] + p["acts"] + p["logits"], step)
    # the weight sync and a checkpoint: the resident state plus one whole tensor at a time (the largest,
    # V x D): fp32 gathered (a shard in host memory is first copied to the GPU) and its bf16 cast
    p["largest"] = V * D
    p["load"] = p["masters"] + p["reference"] + p["hf_copy"] + (0 if offload else 2 * V * D)
    # The push into vLLM (first and every step alike): vLLM asleep but its weights woken to receive the
    # new ones, its KV cache still asleep (engine.VLLMEngine.wake_up), so the push never meets a full share
    p["sync"] = resident + p["vllm_asleep"] + p["vllm_weights"] + (8 if offload else 6) * V * D
    p["gather"] = resident + 8 * V * D
    p["peak"] = max(p["rollout"], p["update"], p["sync"])
    p.update(P=P, gpus=W, gpu_gib=gpu_gib, tokens=tokens, max_context=context, row=T, offload=offload)
    limit, why = 0.9 * gpu_gib * GIB, []
    if vllm and not p["engine"]["starts"]:
        why.append(why_vllm_stops(p["engine"], "vLLM"))
    if p["customer_engine"] and not p["customer_engine"]["starts"]:
        why.append(why_vllm_stops(p["customer_engine"], "the customer's server"))
    elif p["customer_engine"] and p["customer_engine"]["kv_tokens"] < p["customer_engine"]["replies"]:
        e = p["customer_engine"]  # it starts, but its requests in flight would queue past their deadline
        why.append(f"the customer's server holds {e['kv_tokens'] / 1e3:.0f}k tokens of KV cache, fewer than the "
                   f"replies alone of its {e['in_flight']} requests in flight ({e['replies'] / 1e3:.0f}k: "
                   f"--user_concurrency x {W} ranks x --user_max_tokens)")
    if host_gib is not None and p["host_node"] > 0.9 * host_gib * GIB:
        why.append(f"host memory: a node needs {p['host_node'] / GIB:.0f} GiB of {0.9 * host_gib:.0f} GiB (90 % of "
                   f"{host_gib:.0f}): {p['host'] / GIB:.1f} per GPU x {p['local_gpus']} GPUs + "
                   f"{p['checkpoint_host'] / GIB:.0f} for rank 0's checkpoint gather")
    if vllm and context > c.get("max_position_embeddings", context):
        why.append(f"vLLM would not start: max_model_len {context} is above the model's max_position_embeddings "
                   f"{c['max_position_embeddings']}")
    for phase in ("rollout", "update", "sync"):
        if p[phase] > limit:
            why.append(f"the {phase} phase needs {p[phase] / GIB:.1f} GiB of {limit / GIB:.0f} GiB (90 % of "
                       f"{gpu_gib:.0f})")
    p.update(why=why, fits=not why)
    return p


ROWS = [("masters fp32", "masters"), ("grads fp32", "grads"), ("AdamW fp32", "adamw"), ("bf16 copies", "copies"),
        ("acts, no ckpt (longest row)", "acts_no_ckpt"), ("acts, ckpt (longest row)", "acts_ckpt"),
        ("logits chunk", "logits"), ("reference bf16", "reference"),
        ("reference root, kept gathered", "reference_root"),
        ("hf engine's own copy", "hf_copy"), ("vLLM share (awake)", "vllm_share"), ("  of it weights", "vllm_weights"),
        ("  of it non-KV", "vllm_non_kv"), ("  of it KV cache", "vllm_kv"), ("vLLM asleep", "vllm_asleep"),
        ("customer's server (GPU 0)", "customer"), ("= rollout phase", "rollout"), ("= update phase", "update"),
        ("= weight push (KV asleep)", "sync"),
        ("= peak", "peak"), ("host memory", "host")]


def format_plan(name: str, p: list) -> str:
    """One Markdown row per part (GiB per GPU) for the plans in `p` (a list of (label, plan)); the
    vLLM rows without vLLM, and a kept root, the hf engine's copy or a customer none has, left out."""
    vllm, optional = any(q["engine"] for _, q in p), ("reference_root", "hf_copy", "customer")
    rows = [(label, k) for label, k in ROWS if any(q[k] for _, q in p) or k not in optional
            and (vllm or not k.startswith("vllm"))]
    out = [f"{name} | " + " | ".join(label for label, _ in p), "---|" * (len(p) + 1)]
    out += [f"{label} | " + " | ".join(f"{q[k] / GIB:.1f}" for _, q in p) for label, k in rows]
    out.append("longest row, tokens | " + " | ".join(f"{q['row']}" + (" (max_context)" if q["row"] > q["tokens"]
                                                                       else "") for _, q in p))
    if vllm:
        out.append("vLLM KV cache, tokens | " + " | ".join(f"{q['kv_tokens'] / 1e3:.0f}k" for _, q in p))
        out.append("vLLM starts | " + " | ".join(("yes" if q["engine"]["starts"] else "NO") if q["engine"] else "-"
                                                 for _, q in p))
    if any(q["customer"] for _, q in p):
        out.append("customer's server starts | " + " | ".join(
            "-" if not q["customer"] else "unknown" if not q["customer_engine"] else
            "yes" if q["customer_engine"]["starts"] else "NO" for _, q in p))
    out.append("fits | " + " | ".join(("yes" if q["fits"] else "NO") + f" ({q['gpu_gib']:.0f} GiB)" for _, q in p))
    return "\n".join(out)


# --------------------------------------------------------------------------------------------------
# A run's plan (muarl --plan N), and what to change when it does not fit


def _settings(cfg, engine: str, gpu_gib: float) -> tuple[dict, list[str]]:
    """plan()'s keywords for the run `cfg` (the customer's config.json read where --user_serve names a
    folder that has one), and notes on what the plan assumed."""
    tokens, context = cfg.micro_batch_tokens, getattr(cfg, "max_context", 0) or cfg.micro_batch_tokens
    kw = dict(tokens=tokens, max_context=context, checkpointing=bool(cfg.activation_checkpointing),
              reference=cfg.kl_coef > 0, bf16=cfg.dtype == "bfloat16", chunk=cfg.logprob_chunk, engine=engine,
              engine_share=cfg.engine_memory, gpu_gib=gpu_gib, offload=bool(cfg.offload))
    notes = [f"the update's activations are for the longest row, {max(tokens, context)} tokens = max(--micro_batch"
             f"_tokens {tokens}, --max_context {context}): an episode longer than a row is trained in a row of its "
             f"own, and one can reach --max_context"]
    serve = getattr(cfg, "user_serve", "")
    if serve:
        kw["customer_share"] = share = getattr(cfg, "user_memory", 0.2)
        kw.update(customer_concurrency=getattr(cfg, "user_concurrency", 0), customer_reply=getattr(
            cfg, "user_max_tokens", 0))
        own = Path(serve) / "config.json"
        try:
            kw["customer"] = json.loads(own.read_text())
            param_counts(kw["customer"])  # a config the plan can size
            notes.append(f"GPU 0 also serves the customer (--user_serve {serve}): --user_memory {share} of it, "
                         f"plus its process's CUDA context; the other GPUs hold less")
        except (OSError, ValueError, KeyError, TypeError):
            kw["customer"] = None
            notes.append(f"GPU 0 also serves the customer (--user_serve {serve}): --user_memory {share} of it "
                         f"counted; its weights unknown (no usable {own}), so whether its server starts is not "
                         f"checked")
    return kw, notes


def _engine_note(p: dict) -> str:
    e = p["engine"]
    non_kv = (e["non_kv"] - e["weights"]) / GIB
    return (f"vLLM: gpu_memory_utilization {e['share'] / (p['gpu_gib'] * GIB):.2f} x {p['gpu_gib']:.0f} GiB = "
            f"{e['share'] / GIB:.1f} GiB: weights {e['weights'] / GIB:.1f}, non-KV {non_kv:.1f}"
            f" (its profiling forward of {e['batched']} tokens / sampler of {e['seqs']} rows "
            f"{e['activation'] / GIB:.1f}, CUDA graphs {e['graphs'] / GIB:.1f}, other {e['non_torch'] / GIB:.1f}), "
            f"KV cache {e['kv'] / GIB:.1f} GiB = {e['kv_tokens'] / 1e3:.0f}k tokens; one request of max_model_len "
            f"{e['max_model_len']} (--max_context) needs {e['need'] / GIB:.1f} GiB")


# each axis: (what muarl's flag reads, the plan keyword or "gpus", the values to try, nearest first)
def _axes(kw: dict, gpus: int) -> list[tuple]:
    share, ctx, tokens = kw["engine_share"], kw["max_context"], kw["tokens"]
    axes = [("--activation_checkpointing true", "checkpointing", [True] if not kw["checkpointing"] else []),
            ("--offload (under torchrun)", "offload", [True] if not kw["offload"] else []),
            ("--engine_memory {}", "engine_share", _nearest(share, [s / 100 for s in range(30, 96, 5)])
             if kw["engine"] == "vllm" else []),
            ("--max_context {}", "max_context", [n for n in (24576, 16384, 12288, 8192, 4096) if n < ctx]),
            ("--micro_batch_tokens {}", "tokens", [n for n in (8192, 4096) if n < tokens]),
            ("--kl_coef 0", "reference", [False] if kw["reference"] else []),
            ("on {} GPUs", "gpus", [g for g in (2, 4, 8, 16, 32, 64) if g > gpus])]
    if kw.get("customer_share"):
        axes.append(("--user_memory {}", "customer_share", _nearest(kw["customer_share"],
                                                                     [s / 100 for s in range(10, 55, 5)])))
        axes.append(("--user_concurrency {}", "customer_concurrency",
                     [n for n in (8, 4, 2, 1) if n < kw.get("customer_concurrency", 0)]))
    return [a for a in axes if a[2]]


def _nearest(now: float, values: list[float]) -> list[float]:
    """`values` other than `now`, nearest first (a share may help going up or down)."""
    return sorted((v for v in values if abs(v - now) > 1e-9), key=lambda v: (abs(v - now), v))


def remedies(c: dict, gpus: int, kw: dict, most: int = 3) -> list[str]:
    """Up to `most` changes of the run's flags under which `plan` fits, the fewest flags first (each
    value the nearest that fits)."""
    kw = dict(kw)
    base_sharded = kw.pop("sharded", False)
    axes, found = _axes(kw, gpus), []
    for n in range(1, 5):
        for combo in itertools.combinations(axes, n):
            # the nearest values first: by the sum of their places in each axis's list
            for at in sorted(itertools.product(*(range(len(a[2])) for a in combo)), key=sum):
                values = [a[2][i] for a, i in zip(combo, at)]
                change = {key: v for (_, key, _), v in zip(combo, values)}
                w = change.pop("gpus", gpus)
                if plan(c, w, sharded=w > 1 or base_sharded, **{**kw, **change})["fits"]:
                    found.append(" ".join(flag.format(v) for (flag, _, _), v in zip(combo, values)))
                    break
            if len(found) >= most:
                return found
        if found:
            return found
    return found


def describe(cfg, gpus: int, engine: str, gpu_gib: float, sharded: bool) -> str:
    """muarl's plan of the run `cfg` on `gpus` GPUs, as a table with notes; when it does not fit,
    why (vLLM would not start, a phase over the GPU) and which flags would make it fit."""
    return assess(cfg, gpus, engine, gpu_gib, sharded)[0]


def assess(cfg, gpus: int, engine: str, gpu_gib: float, sharded: bool, host_gib: float | None = None,
           local_gpus: int | None = None) -> tuple[str, str | None]:
    """(describe's text, None when the plan fits, else one line for a run to stop with: what does
    not fit, by how much, and the flags that would fit). `host_gib`: one node's memory, checked
    with its `local_gpus` GPUs (a GPU run's own; --plan N, asked anywhere, leaves it out)."""
    try:
        c = load_config(cfg.model)
    except (ValueError, OSError) as e:
        return f"memory plan: none ({e})", None
    kw, notes = _settings(cfg, engine, gpu_gib)
    kw.update(host_gib=host_gib, local_gpus=local_gpus)
    p = plan(c, gpus, sharded=sharded or gpus > 1, **kw)
    label = f"{gpus} GPU(s), {gpu_gib:.0f} GiB" + (", GPU 0" if kw.get("customer_share") else "")
    out = [format_plan(f"{cfg.model}: GiB per GPU", [(label, p)]), ""]
    out += [f"- {n}" for n in notes + ([_engine_note(p)] if p["engine"] else [])]
    if p["customer_engine"]:
        e = p["customer_engine"]
        out.append(f"- the customer's server: weights {e['weights'] / GIB:.1f} GiB, KV cache {e['kv'] / GIB:.1f} GiB "
                   f"= {e['kv_tokens'] / 1e3:.0f}k tokens; one request of its max_model_len {e['max_model_len']} "
                   f"needs {e['need'] / GIB:.1f} GiB; up to {e['in_flight']} requests in flight")
    out.append(f"- host memory of a node: {p['host_node'] / GIB:.0f} GiB ({p['host'] / GIB:.1f} per GPU x "
               f"{p['local_gpus']} + {p['checkpoint_host'] / GIB:.0f} for rank 0's checkpoint gather)"
               + (f" of {host_gib:.0f} GiB" if host_gib else " (not checked here)"))
    if p["fits"]:
        return "\n".join(out), None
    fixes = remedies(c, gpus, dict(kw, sharded=sharded))
    out.append("DOES NOT FIT: " + "; ".join(p["why"]) + ".")
    out.append("Would fit with: " + " | ".join(fixes) if fixes else
               "No change of --activation_checkpointing, --offload, --engine_memory, --max_context, "
               "--micro_batch_tokens, --kl_coef, --user_memory, --user_concurrency or the GPUs (up to 4 at once) "
               "makes it fit.")
    line = (f"the memory plan does not fit on {gpus} x {gpu_gib:.0f} GiB: " + "; ".join(p["why"]) + "; "
            + (f"it would fit with {' | '.join(fixes)}" if fixes else "no flag change makes it fit")
            + "; or pass --plan_override to run anyway")
    return "\n".join(out), line


def min_gpus(c: dict, **kw) -> int | None:
    """The fewest GPUs (a power of 2, up to 64) on which `plan` fits; None if none does."""
    return next((w for w in (1, 2, 4, 8, 16, 32, 64) if plan(c, w, **kw)["fits"]), None)


def demo_plans(tokens: int = 16384, context: int = 32768) -> str:
    """The README's table: the paper's settings (16,384 tokens per row, episodes up to 32,768,
    reference on), 80 GiB H100s."""
    c8, c32 = load_config("Qwen/Qwen3-8B"), load_config("Qwen/Qwen3-32B")
    kw = {"tokens": tokens, "max_context": context, "reference": True, "checkpointing": True}
    off = {"offload": True, "engine_share": 0.85}  # the trainer holds nothing on the GPU while vLLM generates
    off32 = {"offload": True, "engine_share": 0.9, "max_context": 16384}  # vLLM's 61 GiB of weights leave little
    cols = [("8B, 1 GPU", plan(c8, 1, **kw)), ("8B, 1 GPU, offload", plan(c8, 1, **{**kw, **off})),
            ("8B, 8 GPUs", plan(c8, 8, **kw)), ("32B, 8 GPUs", plan(c32, 8, **kw)),
            ("32B, 8 GPUs, offload, 16k", plan(c32, 8, **{**kw, **off32}))]
    need = {name: min_gpus(c, **{**kw, **o}) for name, c, o in
            (("8B", c8, {}), ("8B offload", c8, off), ("32B", c32, {}), ("32B offload 16k", c32, off32))}
    return format_plan("GiB per GPU (vLLM TP 1)", cols) + "\n\nfewest 80 GiB GPUs that fit: " + ", ".join(
        f"{k} {v}" for k, v in need.items())


if __name__ == "__main__":
    P8, P32 = param_counts(load_config("Qwen/Qwen3-8B"))[0], param_counts(load_config("Qwen/Qwen3-32B"))[0]
    print(f"Qwen3-8B: {P8 / 1e9:.2f}B parameters; Qwen3-32B: {P32 / 1e9:.2f}B\n")
    print(demo_plans(int(sys.argv[1]) if sys.argv[1:] else 16384))
