"""Data-parallel training with FSDP2 under torchrun: one process per GPU (NCCL), or gloo processes
on a CPU (the tests run two). Each rank plays its share of a step's tasks; the loss each rank
backpropagates is its share of the step's token mean, so summing gradients over ranks (not
averaging) gives exactly one process's gradient (tests/test_muarl.py checks weights after a step
against one process, to ~1e-7). Contents: the process group's life (dist_setup, barrier,
dist_teardown, exit_now); shard (FSDP2 over every decoder layer, then the root); load_sharded (built
on the meta device, each rank reads only its rows of the safetensors files); full_tensors (the
unsharded weights, one tensor at a time); even_rows (as many forwards on every rank); a step's
numbers over the ranks (all_reduce, all_sum, reduce_stats, all_gather_episodes).

Precision, as every large-model trainer keeps it: the parameters AdamW updates (the "masters") and
its moments are fp32; the forward and backward compute in bf16. Under FSDP2 `MixedPrecisionPolicy`
all-gathers bf16 copies of the fp32 shards and reduce-scatters fp32 gradients; on one process
muarl.update runs under torch.autocast. bf16 masters would not train: an update of lr 1e-6 is below
bf16's resolution for a weight of 0.02 (PLATFORM.md: 1.9 % of the entries moved in 10 steps).
"""

from __future__ import annotations

import atexit
import datetime
import os
import sys
import types

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor



def dist_setup(offload: bool = False) -> tuple[int, int]:
    """(rank, world_size): (0, 1) for a plain `python muarl.py`; under torchrun, joins the process
    group (NCCL on GPUs, gloo on a CPU) and picks this rank's GPU."""
    if "WORLD_SIZE" not in os.environ:  # torchrun sets it (even to 1: one rank still trains with FSDP2)
        return 0, 1
    if dist.is_initialized():  # (the CPU demo joins before muarl.train does)
        return dist.get_rank(), dist.get_world_size()
    # Rank 0 evaluates alone (muarl.run_eval) while the other ranks wait in their next collective; a
    # held-out evaluation with an LLM user can outlast the default timeout (10 min for NCCL), so
    # allow hours. --offload on GPUs: CUDA tensors travel by NCCL, CPU ones by gloo (the shards live
    # in host memory, and a checkpoint's gather or the gradient norm reduces them where they are),
    # as torchtitan does for its CPU offload
    backend = ("cpu:gloo,cuda:nccl" if offload else "nccl") if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, timeout=datetime.timedelta(hours=4))
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    return dist.get_rank(), dist.get_world_size()


def from_rank0(value, world_size: int):
    """Rank 0's `value` on every rank. A decision read from a disk or a device (which checkpoint to
    resume, where the reference comes from, whether the plan fits) is made once, on rank 0, and sent:
    on node-local disks each rank reading its own could decide differently and hang the next
    collective."""
    if world_size == 1 or not dist.is_initialized():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def decide_on_rank0(decide, world_size: int):
    """`decide()` run on rank 0 alone, and its answer on every rank; a one-line error it raises
    (ValueError, OSError) is raised on every rank, so none is left waiting in a collective."""
    if world_size == 1 or not dist.is_initialized():
        return decide()
    said = None
    if dist.get_rank() == 0:
        try:
            said = ("ok", decide())
        except (ValueError, OSError) as e:
            said = ("error", e)
    kind, value = from_rank0(said, world_size)
    if kind == "error":
        raise value
    return value


def on_every_node(path, world_size: int, what: str) -> None:
    """ValueError on every rank unless every rank sees `path` (rank 0's choice) on its own disk: a
    folder on node-local disks is one line, not a hang or a mix of two models."""
    if world_size == 1 or not dist.is_initialized():
        return
    if not all_reduce([float(os.path.exists(path))], world_size, "min")[0]:
        raise ValueError(f"{what} {path}, as rank 0 found it, is missing on another node's disk: give every node "
                         f"the same folder (a shared --out_dir, the model on a shared disk)")


# What a CPU run is for: the demo's tiny models and the tests' 100M one. Anything larger without a
# usable GPU is a GPU run whose CUDA is broken, not a run to start on the CPU for days.
CPU_MAX_PARAMS = 1e9


def no_cuda_refusal(model: str, world_size: int) -> str | None:
    """One line refusing a run of `model` without a usable GPU when the plan sizes it above what a
    CPU run is for; None for a small model, or one the plan cannot size (the demo's, built later)."""
    from plumbing.memory_plan import load_config, param_counts

    try:
        P = param_counts(load_config(model))[0]
    except (ValueError, OSError, KeyError, TypeError):
        return None
    if P <= CPU_MAX_PARAMS:
        return None
    ranks = f" on {world_size} gloo ranks" if world_size > 1 else ""
    return (f"no usable CUDA: torch {torch.__version__} (built for CUDA {torch.version.cuda or 'none: a CPU wheel'}) "
            f"sees {torch.cuda.device_count()} GPU(s) and torch.cuda.is_available() is False, so {model} "
            f"({P / 1e9:.1f}B parameters) would train in fp32 on the CPU{ranks}; vLLM 0.32's wheel needs a CUDA 13 "
            f"build of torch 2.13 and a driver that runs it (nvidia-smi; CUDA_VISIBLE_DEVICES)")


def host_memory() -> int:
    """This node's memory in bytes (the plan checks a node's share against it)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def place(cfg, rank: int, world_size: int):
    """Where and how the run computes: (cfg with dtype, micro_batch_tokens and threads resolved, its
    device, the rollout engine's kind, on_gpu, sharded). GPUs: bf16 compute, vLLM, 16,384 tokens a
    packed row; a CPU: fp32, the transformers engine, 7,000 (44 s and 2.1 GB an update on the demo's
    machine). Under torchrun the policy is sharded with FSDP2, even on one rank. `--plan N` plans a
    GPU run wherever it is asked: it prints the memory plan (plumbing/memory_plan.py) and exits. A
    GPU run prints it on rank 0 before any work and is a gate: a plan that does not fit stops every
    rank (a ValueError on rank 0, one line, exit 2) unless --plan_override. Without a usable GPU a
    model larger than a CPU run is for is refused (no_cuda_refusal), and so are several ranks unless
    $MUARL_CPU_RANKS asks for them (the tests' gloo runs)."""
    import dataclasses

    from plumbing.memory_plan import GIB, assess

    on_gpu, sharded = torch.cuda.is_available(), dist.is_initialized()
    device = f"cuda:{torch.cuda.current_device()}" if on_gpu else "cpu"
    if not on_gpu and not cfg.plan and (why := no_cuda_refusal(cfg.model, world_size)):
        raise ValueError(why)  # every rank sees the same: each stops with the same line (run_cli: exit 2)
    if not on_gpu and world_size > 1 and not cfg.plan and not os.environ.get("MUARL_CPU_RANKS"):
        if rank == 0:  # several ranks and no GPU: a GPU run whose CUDA is broken, unless asked for on purpose
            raise ValueError(f"no usable CUDA: torchrun started {world_size} ranks, and torch {torch.__version__} "
                             f"(CUDA build: {torch.version.cuda or 'none, a CPU wheel'}) sees "
                             f"{torch.cuda.device_count()} GPU(s), so they would train on the CPU over gloo; fix the "
                             "GPUs (nvidia-smi, CUDA_VISIBLE_DEVICES; vLLM 0.32 needs a CUDA 13 build of torch 2.13), "
                             "or set MUARL_CPU_RANKS=1 to run CPU ranks on purpose (the tests, the FSDP check)")
        raise SystemExit(2)  # (the other ranks quietly: rank 0 says why)
    if not on_gpu and world_size > 1 and rank == 0:  # CPU ranks asked for: said
        print(f"[place] no CUDA: {world_size} gloo processes on the CPU (fp32, the transformers engine)", flush=True)
    on_gpu = on_gpu or cfg.plan > 0
    # compute; masters fp32
    dtype = ("bfloat16" if on_gpu else "float32") if cfg.dtype == "auto" else cfg.dtype
    engine = ("vllm" if on_gpu else "hf") if cfg.engine == "auto" else cfg.engine
    cfg = dataclasses.replace(cfg, micro_batch_tokens=cfg.micro_batch_tokens or (16384 if on_gpu else 7000),
                              # 0: torch's own
                              dtype=dtype, threads=cfg.threads or torch.get_num_threads())
    torch.set_num_threads(cfg.threads)
    refusal = None
    if cfg.plan or (on_gpu and rank == 0):
        # the card's own total (an 80 GB H100 reports about 79 GiB), 80 where there is none
        gib = torch.cuda.get_device_properties(rank_device()).total_memory / GIB if torch.cuda.is_available() \
            else 80.0
        host = None if cfg.plan else host_memory() / GIB
        text, refusal = assess(cfg, cfg.plan or world_size, engine, gib, sharded, host_gib=host,
                               local_gpus=int(os.environ.get("LOCAL_WORLD_SIZE", world_size)))
        print(text, flush=True)
        if cfg.plan:
            raise SystemExit(0)
    # rank 0's verdict on every rank, before anything is loaded: all stop, or none does
    refusal = from_rank0(refusal, world_size) if on_gpu else None
    if refusal and not cfg.plan_override:
        if rank == 0:
            raise ValueError(refusal)  # (run_cli: one line, exit 2)
        raise SystemExit(2)  # (the other ranks quietly: rank 0 says why)
    if refusal and rank == 0:
        print(f"[plan] --plan_override: running although {refusal.split('; or pass')[0]}", flush=True)
    return cfg, device, engine, on_gpu, sharded


def barrier(world_size: int) -> None:
    """Wait until every rank gets here (rank 0 wrote files the others read next); nothing on one
    process."""
    if world_size > 1:
        dist.barrier()


def dist_teardown(world_size: int, engine=None) -> None:
    """End of a run: wait for every rank, shut the rollout engine down (vLLM closes the groups it
    made, and the default one, while they still exist), then close the process group if it is still
    open (a rank that exits while another still talks to it can abort that rank, and torch warns
    about a group never destroyed)."""
    if dist.is_initialized():  # a one-rank torchrun run has a process group to close too
        barrier(world_size)
    if getattr(engine, "close", None) is not None:  # (an engine without one holds nothing to close)
        engine.close()
    if dist.is_initialized():
        dist.destroy_process_group()


def exit_now(world_size: int, code: int = 0) -> None:
    """End the process with `code`. Under torchrun: the exit handlers run (a served customer's server is
    stopped), then the process ends at once, skipping Python's own teardown, during which gloo can abort a
    rank ("terminate called without an active exception", exit -6, seen in CI) and turn a clean exit 0, 2
    or 3 into a crash. Elsewhere: sys.exit(code), or nothing for 0."""
    if "WORLD_SIZE" in os.environ:
        atexit._run_exitfuncs()  # (what the interpreter would run at exit; os._exit skips it)
        sys.stdout.flush()  # os._exit skips Python's own flushing
        sys.stderr.flush()
        os._exit(code)
    if code:
        sys.exit(code)


def shard(model, activation_checkpointing: bool, bf16: bool, offload: bool = False):
    """FSDP2: shard every decoder layer, then the root. Parameters stay fp32 shards (so AdamW's
    state is fp32); with bf16, each layer computes in bf16 and gradients are reduced in fp32. With
    `offload` the shards, their gradients and so AdamW's state live in host memory: a layer is
    copied to the GPU as it is gathered, its gradient shard copied back, and AdamW steps on the CPU
    (slower; what lets 8B train on one GPU, models.plan)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16
          else MixedPrecisionPolicy())  # the default: no casts, all fp32
    layers = model.get_decoder().layers
    if activation_checkpointing:  # sets each layer's flag *and* its checkpoint function (the flag alone crashes)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    # Sum gradients over ranks, not average (see the top), by a plain SUM: gloo lacks premul_sum, FSDP's op for factors
    for m in [*layers, model]:  # every layer, then the root: it takes the parameters no layer holds
        fully_shard(m, mp_policy=mp, offload_policy=CPUOffloadPolicy(pin_memory=torch.cuda.is_available()) if offload
                    else OffloadPolicy())
        m.set_gradient_divide_factor(1.0)
        m.set_force_sum_reduction_for_comms(True)
    return model


def sharded_call(fn):
    """`fn(model, ...)` for a sharded model: run as the model's registered forward method (registered
    on first use). grpo.token_logprobs runs the decoder body and lm_head, never model.forward, so the
    root's hooks (gather embeddings, norm and lm_head before; reduce their gradients after) would not
    fire; registered as a forward method, they do."""
    from torch.distributed.fsdp import register_fsdp_forward_method

    def call(model, *args, **kwargs):
        if not hasattr(model, fn.__name__):
            setattr(model, fn.__name__, types.MethodType(fn, model))
            register_fsdp_forward_method(model, fn.__name__)
        return getattr(model, fn.__name__)(*args, **kwargs)

    return call


def even_rows(rows: list[dict], world_size: int, empty: dict) -> list[dict]:
    """`rows` padded to the most any rank has. Under FSDP every forward and backward gathers /
    reduce-scatters the weights with the other ranks, so every rank must run as many rows: one with
    fewer (or none: all its groups aborted) runs empty ones, two tokens with mask 0 (the fewest
    token_logprobs scores) with mask 0, `empty` (grpo.pack_sequences'): loss and gradient 0."""
    if world_size == 1:
        return rows
    n_rows = int(all_reduce([len(rows)], world_size, "max")[0])
    return rows + [empty] * (n_rows - len(rows))


def is_sharded(model) -> bool:
    """True once fully_shard has wrapped the model (its class becomes an FSDPModule): under
    torchrun, even on 1 rank."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def reshard(model) -> None:
    """Free the gathered weights a sharded model kept after a forward with no backward (the frozen
    reference):
    FSDP2 never reshards the root module after its forward (reshard_after_forward is off there), and
    no backward follows to do it, so the root's whole weights (embeddings, lm_head: 2.3 GiB for 8B)
    would stay on every GPU."""
    if is_sharded(model):
        model.reshard()


def bf16_compute(model, bf16: bool):
    """The context a forward runs in: bf16 matmuls over fp32 masters. On one process that is
    torch.autocast (it casts each weight to bf16 where it is used; gradients reach the fp32
    parameters); under FSDP2 the MixedPrecisionPolicy of shard() already gathers bf16 weights, so
    nothing more is needed. Backward runs outside it, as autocast wants."""
    import contextlib

    on = bf16 and not is_sharded(model)
    return torch.autocast(compute_device(model).type, dtype=torch.bfloat16) if on else contextlib.nullcontext()


def rank_device() -> torch.device:
    """This rank's GPU (dist_setup chose it), or the CPU (gloo)."""
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def compute_device(model) -> torch.device:
    """Where the model's forward runs, so where its inputs (and every tensor they meet: advantages,
    masks) must be:
    this rank's GPU under FSDP2, else the device of its parameters. FSDP2 moves the forward's own
    arguments only."""
    return rank_device() if is_sharded(model) else next(model.parameters()).device


def full_tensors(model, dtype: torch.dtype | None = None, cpu: bool = False):
    """(name, whole tensor) pairs, one at a time, for the rollout engine and for checkpoints. Under
    FSDP2 each is all-gathered on its own (a collective: every rank must draw every pair, in the
    same order), so at most one whole parameter is ever on a GPU beside the shards; `cpu` moves it
    off the GPU before the next one is gathered, `dtype` casts it (bf16 for vLLM). Never the whole
    model gathered on every GPU at once."""
    for name, t in model.state_dict().items():
        if isinstance(t, DTensor) and t.to_local().device != rank_device():  # --offload: its shard in host memory
            t = moved(t, rank_device())  # gathered on the GPU by NCCL, not over gloo
        t = t.full_tensor() if isinstance(t, DTensor) else t.detach()  # (the whole tensor's shape)
        t = t.to(dtype) if dtype is not None else t
        yield name, (t.cpu() if cpu else t)


def moved(t: DTensor, device: torch.device) -> DTensor:
    """This rank's shard moved to `device`, the same DTensor (shape given: FSDP2's last shards may
    be shorter)."""
    return DTensor.from_local(t.to_local().to(device), t.device_mesh, t.placements, run_check=False, shape=t.shape,
                              stride=t.stride())


def full_state_dict(model, world_size: int = 1, dtype: torch.dtype | None = None, keep: bool = True) -> dict:
    """The unsharded weights as one dict on the CPU (collective under FSDP2: every rank calls it;
    only those with `keep`, e.g. rank 0 that writes the checkpoint, hold the result): what a
    checkpoint or save_pretrained writes. On one process the dict holds the model's own tensors (no
    copy)."""
    return {n: t for n, t in full_tensors(model, dtype, cpu=is_sharded(model) and keep) if keep}


# --------------------------------------------------------------------------------------------------
# Loading without a whole copy anywhere: the model is built on the meta device (shapes, no memory),
# sharded, given empty storage on the device, and each rank copies in only its own rows, read from
# the safetensors files.


def load_sharded(path: str, dtype: torch.dtype, activation_checkpointing: bool = False, bf16: bool = False,
                 offload: bool = False, frozen: bool = False):
    """A Hugging Face model folder loaded straight into FSDP2 shards: rank r of W reads rows [r*c,
    r*c + n_r) of each tensor (c = ceil(rows / W), FSDP2's dim-0 chunks), cast to `dtype` (fp32
    masters; the reference may stay bf16). Peak memory per rank: its shards plus one tensor's slice
    (tests/test_gpu_path.py measures it on 4 ranks)."""
    import json
    from pathlib import Path

    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForCausalLM

    folder, device = Path(path), rank_device()
    config = AutoConfig.from_pretrained(folder)
    with torch.device("meta"):  # parameters with shapes and no storage: nothing is read or allocated yet
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    if frozen:
        model.eval().requires_grad_(False)
    model = shard(model, activation_checkpointing, bf16, offload)
    model.to_empty(device="cpu" if offload else device)  # each rank's shards get storage; the whole never exists
    index = folder / "model.safetensors.index.json"  # big models: tensor name -> file; small ones: one file
    where = json.loads(index.read_text())["weight_map"] if index.exists() else None
    handles = {}
    with torch.no_grad():
        for name, p in model.named_parameters():  # tied weights appear once
            file = folder / (where[name] if where else "model.safetensors")
            f = handles.setdefault(file, safe_open(file, framework="pt", device="cpu"))
            local = p.to_local() if isinstance(p, DTensor) else p  # (n_r, ...): this rank's rows
            start = min(dist.get_rank() * -(-p.shape[0] // dist.get_world_size()), p.shape[0])
            local.copy_(f.get_slice(name)[start : start + local.shape[0]])  # reads these rows only; casts, moves
    body = model.get_decoder()  # non-persistent buffers (RoPE's inverse frequencies) are not in the files: rebuild
    body.rotary_emb = type(body.rotary_emb)(config=config).to(device)
    return model


def all_reduce(values: list[float], world_size: int, op: str = "sum") -> list[float]:
    """Sum (or "min" / "max") each value over the ranks; the values themselves on one process."""
    if world_size == 1:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=rank_device())  # NCCL reduces CUDA tensors only
    dist.all_reduce(t, op={"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}[op])
    return t.tolist()


def all_sum(x: float, world_size: int) -> float:
    return all_reduce([x], world_size)[0]


def reduce_stats(stats: list[dict], world_size: int) -> dict:
    """A GRPO step's statistics from every rank's packed rows (grpo_loss's, plus "loss" and
    "logp_gap", a sum over the row's trained tokens): loss summed (each row's is its share of the
    step's mean), clip_frac / kl / entropy / logp_gap as means weighted by trained tokens, ratio_min
    / ratio_max the extremes over rows that trained any."""
    # (the importance weights' keys when the loss corrects for the sampler: every rank has them or none)
    keys = ("clip_frac", "kl", "entropy") + (("sampler_kl", "is_mean", "is_truncated") if "is_max" in stats[0] else ())
    sums = [sum(s["loss"] for s in stats), sum(s["logp_gap"] for s in stats), sum(s["tokens"] for s in stats)]
    sums += [sum(s.get(k, 0.0) * s["tokens"] for s in stats) for k in keys]  # token-weighted sums
    loss, gap, tokens, *weighted = all_reduce(sums, world_size)
    live = [s for s in stats if s["tokens"] > 0]  # an empty row's ratios are meaningless
    rmin = all_reduce([min((s["ratio_min"] for s in live), default=float("inf"))], world_size, "min")[0]
    rmax = all_reduce([max((s["ratio_max"] for s in live), default=float("-inf"))], world_size, "max")[0]
    n = max(tokens, 1.0)
    most = {"is_max": all_reduce([max((s["is_max"] for s in live), default=1.0)], world_size, "max")[0]} \
        if "is_max" in stats[0] else {}
    return {"loss": loss, **{k: w / n for k, w in zip(keys, weighted)}, "logp_gap": gap / n,
            "ratio_min": rmin, "ratio_max": rmax, **most}


def all_gather_episodes(records: list[dict], world_size: int) -> list[dict]:
    """Every rank's records (small dicts, one per episode), in rank order, on every rank."""
    if world_size == 1:
        return list(records)
    gathered = [None] * world_size
    dist.all_gather_object(gathered, records)  # pickled: fine for a few hundred small dicts
    return [r for part in gathered for r in part]


# --------------------------------------------------------------------------------------------------
# Demo: torchrun --nproc_per_node 2 fsdp.py — two gloo processes on a CPU shard a tiny model and gather it back

if __name__ == "__main__":
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.set_num_threads(1)
    rank, world_size = dist_setup()
    torch.manual_seed(0)  # the same random model on every rank
    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=2, num_key_value_heads=1, head_dim=64)).float()
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if world_size > 1:
        model = shard(model, activation_checkpointing=False, bf16=False)
    after = full_state_dict(model, world_size)
    same = all(torch.equal(before[k], after[k].cpu()) for k in before)
    print(f"rank {rank} of {world_size}: {len(after)} tensors gathered back, identical to the unsharded model: {same}; "
          f"ranks counted by all_sum: {all_sum(1.0, world_size):.0f}")
    dist_teardown(world_size)  # no rank tears down its connections while another still uses them
    exit_now(world_size)
