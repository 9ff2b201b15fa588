"""The GPU path, checked on a CPU: what a GPU run relies on that the CPU demo never needed.

  bf16        --dtype bfloat16 computes in bf16 and updates fp32 masters: at lr 1e-6 the weights move as the fp32
              run's do (same sign on >= 99 % of the entries fp32 moves), on one process and on 2 gloo ranks
  memplan     Qwen3-8B / 32B parameter counts from the shipped configs; the plan against what CPU runs use (the
              profiler's peak of allocated bytes during a real update): tiny and 100M models, 1 and 4 ranks, 15 %
  sharded     a 100M Qwen3 loaded over 4 gloo ranks from the meta device: each rank's peak memory below one whole
              copy, and one GRPO step equal to the one-process step
  vLLM        under torchrun the engine joins the trainer's group (external_launcher), one seed per rank
  long rows   an episode longer than the packed row trains in a row of its own, counted (long_rows)
  reference   the frozen reference's root is resharded after its no-grad forward (FSDP2 keeps a root gathered
              otherwise: +2.3 GiB a GPU at 8B), under torchrun on gloo ranks
  gpu_check   bench/gpu_check.py --loop (the training loop end to end) runs on a CPU (gloo), so its script is
              tested before any GPU sees it
"""

import json
import os
import socket
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch

import muarl
from config import Config
from plumbing import fsdp, memory_plan as memplan
from plumbing.flags import ConfigError, parse_config
from config import validate

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from test_muarl import ENV, synthetic_episodes, tiny_qwen3  # noqa: E402


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _on_gloo_ranks(code: str, world_size: int, timeout: int = 600) -> None:
    """Run `code` as `world_size` gloo ranks (torchrun's environment, set by hand); every rank must exit 0."""
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, env={**ENV, "WORLD_SIZE": str(world_size), "RANK": str(r),
                                              "LOCAL_RANK": str(r), "MASTER_ADDR": "127.0.0.1",
                                              "MASTER_PORT": str(port)})
             for r in range(world_size)]
    logs = [p.communicate(timeout=timeout)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * world_size, "\n".join(logs)[-4000:]


def _moves(model, dtype: str, eps, adv, steps: int = 3, world_size: int = 1) -> torch.Tensor:
    """Every weight's change (flattened, fp32) after `steps` real updates at lr 1e-6 (AdamW), computing in `dtype`."""
    before = torch.cat([v.detach().float().flatten().clone() for v in fsdp.full_state_dict(model, world_size).values()])
    cfg = Config(micro_batch_tokens=96, logprob_chunk=32, kl_coef=0.0, dtype=dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.01)
    for _ in range(steps):
        muarl.update(model, None, eps, adv, opt, cfg, world_size=world_size)
    model.moments_dtypes = {s["exp_avg"].dtype for s in opt.state.values()}  # AdamW's moments
    after = torch.cat([v.detach().float().flatten() for v in fsdp.full_state_dict(model, world_size).values()])
    return after - before


def _agreement(bf16: torch.Tensor, fp32: torch.Tensor) -> float:
    moved = fp32 != 0
    return (torch.sign(bf16[moved]) == torch.sign(fp32[moved])).float().mean().item()


def test_bf16_compute_with_fp32_masters_moves_the_weights_like_fp32():
    eps, adv = synthetic_episodes()
    fp32 = _moves(tiny_qwen3(), "float32", eps, adv)
    bf16_model = tiny_qwen3()
    bf16 = _moves(bf16_model, "bfloat16", eps, adv)
    assert all(p.dtype == torch.float32 for p in bf16_model.parameters())  # the masters stay fp32
    assert bf16_model.moments_dtypes == {torch.float32}
    assert (fp32 != 0).float().mean() > 0.99  # at lr 1e-6 fp32 moves (nearly) every entry
    assert (bf16 != fp32).any()  # bf16 compute really ran: not the fp32 numbers
    agree = _agreement(bf16, fp32)
    print(f"one process: {100 * agree:.2f} % of the entries fp32 moves move the same way in bf16")
    assert agree >= 0.99
    # bf16 masters (no fp32 copy) lose most of an update this small
    bad = tiny_qwen3().to(torch.bfloat16)
    lost = _moves(bad, "float32", eps, adv)
    assert (lost != 0).float().mean() < 0.5


# ---------------------------------------------------------------------------------------------------------------
# The memory plan


def test_the_shipped_configs_give_qwen3s_parameter_counts():
    assert memplan.param_counts(memplan.load_config("Qwen/Qwen3-8B"))[0] == pytest.approx(8.19e9, rel=1e-3)
    assert memplan.param_counts(memplan.load_config("Qwen/Qwen3-32B"))[0] == pytest.approx(32.76e9, rel=1e-3)
    p = memplan.plan(memplan.load_config("Qwen/Qwen3-8B"), 1, tokens=16384, checkpointing=True, reference=True)
    assert not p["fits"] and p["masters"] + p["grads"] + p["adamw"] > 120e9  # one 80 GiB GPU: no (the README)


def test_offload_moves_the_trainers_state_to_host_memory_in_the_plan(monkeypatch):
    c8, c32 = memplan.load_config("Qwen/Qwen3-8B"), memplan.load_config("Qwen/Qwen3-32B")
    kw = dict(tokens=16384, checkpointing=True, reference=True)
    one, off = memplan.plan(c8, 1, **kw), memplan.plan(c8, 1, offload=True, **kw)
    assert off["masters"] == off["grads"] == off["adamw"] == off["reference"] == 0  # none of it on the GPU
    host = one["masters"] + one["grads"] + one["adamw"] + one["reference"]
    assert off["host"] == pytest.approx(host + off["vllm_weights"])  # ... all in host memory (and vLLM asleep)
    assert off["fits"] and not one["fits"]  # 8B on one 80 GiB GPU: only with --offload
    # 32B on 8: vLLM's whole bf16 copy (TP 1) needs the GPU the trainer gives up, and beside its weights and its
    # non-KV memory a cache for one request of max_model_len (a row of context), else vLLM does not start
    assert not memplan.plan(c32, 8, **kw)["fits"]
    assert not memplan.plan(c32, 8, offload=True, **kw)["fits"]  # at --engine_memory 0.5: less than its weights
    short = memplan.plan(c32, 8, offload=True, engine_share=0.85, **kw)
    assert not short["fits"] and short["kv_tokens"] < 16384
    assert "less than one request of max_model_len 16384" in " ".join(short["why"])
    big = memplan.plan(c32, 8, offload=True, engine_share=0.9, **kw)
    assert big["fits"] and big["kv_tokens"] >= 16384
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ConfigError, match="--offload shards with FSDP2: use torchrun"):
        validate(parse_config(["--offload"], Config))


def measured_update(model, eps, adv, tokens: int, world_size: int = 1) -> dict:
    """What one real update uses on this rank: the resident masters and AdamW moments (their bytes, after a first
    update made the moments), plus the profiler's peak of bytes allocated during a second update."""
    from torch.profiler import ProfilerActivity, profile

    cfg = Config(micro_batch_tokens=tokens, logprob_chunk=64, kl_coef=0.0, dtype="float32", grad_clip=1e9)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    muarl.update(model, None, eps, adv, opt, cfg, world_size=world_size)
    local = [getattr(p, "_local_tensor", p) for p in model.parameters()]
    resident = sum(t.numel() * t.element_size() for t in local)
    resident += sum(getattr(t, "_local_tensor", t).nbytes for s in opt.state.values() for t in s.values())
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        muarl.update(model, None, eps, adv, opt, cfg, world_size=world_size)
    now = peak = 0
    for _, nbytes in sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                            if e.name() == "[memory]"):
        now += nbytes
        peak = max(peak, now)
    return {"resident": resident, "peak": resident + peak}


def _planned(config: dict, world_size: int, tokens: int) -> float:
    return memplan.plan(config, world_size, tokens=tokens, checkpointing=False, reference=False, bf16=False, chunk=64,
                        engine="none", sharded=world_size > 1)["update"]


def test_the_plan_matches_what_a_cpu_update_uses():
    eps, adv = synthetic_episodes(n=8)
    tokens = sum(len(e.ids) for e in eps)  # one packed row holds the step
    model = tiny_qwen3()
    m = measured_update(model, eps, adv, tokens)
    planned = _planned(model.config.to_dict(), 1, tokens)
    print(f"tiny, 1 process: planned {planned / 2**20:.2f} MiB, measured {m['peak'] / 2**20:.2f} MiB")
    assert planned == pytest.approx(m["peak"], rel=0.15)


# ---------------------------------------------------------------------------------------------------------------
# Sharded loading: a 100M Qwen3 over 4 gloo ranks

SHARDED_WORKER = textwrap.dedent("""
    import json, os, sys, torch
    torch.set_num_threads(1)
    sys.path[:0] = [{repo!r}, {tests!r}]
    import muarl
    from config import Config
    from plumbing import fsdp
    from plumbing.fsdp import load_sharded
    from test_gpu_path import measured_update, rss
    from test_muarl import synthetic_episodes, tiny_qwen3
    from transformers import AutoModelForCausalLM, Qwen3ForCausalLM  # imported before the measurement: not its memory
    rank, world_size = fsdp.dist_setup()
    before = rss(reset_peak=True)
    model = load_sharded({folder!r}, torch.float32)  # built on meta; this rank reads its rows only
    out = {{"load_peak": rss()["peak"] - before["now"]}}
    eps, adv = synthetic_episodes(n=8, vocab=1000)
    mine = slice(2 * rank, 2 * rank + 2)
    cfg = Config(micro_batch_tokens=4096, logprob_chunk=64, kl_coef=0.0, grad_clip=1e9)
    muarl.update(model, None, eps[mine], adv[mine], torch.optim.SGD(model.parameters(), lr=1.0),
                 cfg, world_size=world_size)
    weights = fsdp.full_state_dict(model, world_size, keep=rank == 0)
    if rank == 0:
        torch.save(weights, os.path.join({out!r}, "step.pt"))
    del model, weights
    for name, make in (("100M", lambda: load_sharded({folder!r}, torch.float32)),
                       ("tiny", lambda: fsdp.shard(tiny_qwen3(), False, False))):
        eps, adv = synthetic_episodes(n=8, vocab=300)
        m = measured_update(make(), eps[mine], adv[mine], 4096, world_size)
        out[name] = dict(m, tokens=sum(len(e.ids) for e in eps[mine]))
    with open(os.path.join({out!r}, f"rank{{rank}}.json"), "w") as f:
        json.dump(out, f)
    fsdp.dist_teardown(world_size)
    fsdp.exit_now(world_size)
""")


def rss(reset_peak: bool = False) -> dict:
    """This process's resident memory now and its peak since the last reset (Linux /proc: VmRSS, VmHWM), bytes."""
    if reset_peak:
        Path("/proc/self/clear_refs").write_text("5")  # 5: reset the peak resident set size
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return {"now": int(status["VmRSS"].split()[0]) * 1024, "peak": int(status["VmHWM"].split()[0]) * 1024}


def qwen3_100m(folder: Path):
    """A random Qwen3 of ~106M parameters (untied embeddings, as Qwen3-8B), saved like a hub model."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=9,
                      num_attention_heads=12, num_key_value_heads=4, head_dim=64, tie_word_embeddings=False,
                      max_position_embeddings=4096)
    model = Qwen3ForCausalLM(cfg).float()
    model.save_pretrained(folder)
    return model


@pytest.mark.slow
def test_a_100m_model_loads_sharded_over_4_ranks_and_steps_like_one_process(tmp_path):
    from plumbing.models import n_params

    model = qwen3_100m(tmp_path / "model")
    whole = 4 * n_params(model)
    assert n_params(model) >= 100e6
    _on_gloo_ranks(SHARDED_WORKER.format(repo=str(REPO), tests=str(REPO / "tests"), folder=str(tmp_path / "model"),
                                         out=str(tmp_path)), 4, timeout=900)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4)]
    for r, got in enumerate(ranks):  # each rank's peak while loading: its quarter and a slice, not the whole
        print(f"rank {r}: peak memory while loading +{got['load_peak'] / 2**20:.0f} MiB (whole copy "
              f"{whole / 2**20:.0f} MiB)")
        assert got["load_peak"] < whole  # (measured: ~0.64 of it, its shard ~0.25; the rest: imports, mmap pages)
    # one GRPO step (SGD, lr 1: the weights move by the gradient) equals the one-process step
    eps, adv = synthetic_episodes(n=8, vocab=1000)
    cfg = Config(micro_batch_tokens=4096, logprob_chunk=64, kl_coef=0.0, grad_clip=1e9)
    muarl.update(model, None, eps, adv, torch.optim.SGD(model.parameters(), lr=1.0), cfg,
                 world_size=1)
    sharded = torch.load(tmp_path / "step.pt", weights_only=True)
    diff = max((sharded[k] - v).abs().max().item() for k, v in model.state_dict().items())
    print(f"4 ranks vs one process after one step: max weight difference {diff:.1e}")
    assert diff < 1e-5
    # the memory plan against what the updates used: 1 process (here) and 4 ranks (each rank's own)
    for name, make in (("100M", lambda: model), ("tiny", tiny_qwen3)):
        eps, adv = synthetic_episodes(n=8, vocab=300)
        m, config = make(), make().config.to_dict()
        one = measured_update(m, eps, adv, 4096)
        checks = [(1, one["peak"], _planned(config, 1, sum(len(e.ids) for e in eps)))]
        checks += [(4, got[name]["peak"], _planned(config, 4, got[name]["tokens"])) for got in ranks]
        for w, measured, planned in checks:
            print(f"{name}, {w} rank(s): planned {planned / 2**20:.1f} MiB, measured {measured / 2**20:.1f} MiB")
            assert planned == pytest.approx(measured, rel=0.15), (name, w)


# ---------------------------------------------------------------------------------------------------------------
# bf16 on 2 gloo ranks, vLLM under torchrun, the GPU check script

BF16_WORKER = textwrap.dedent("""
    import os, sys, torch
    torch.set_num_threads(1)
    sys.path[:0] = [{repo!r}, {tests!r}]
    from plumbing import fsdp
    from test_gpu_path import _moves
    from test_muarl import synthetic_episodes, tiny_qwen3
    rank, world_size = fsdp.dist_setup()
    eps, adv = synthetic_episodes()
    mine = slice(4 * rank, 4 * rank + 4)
    out = {{}}
    for dtype in ("float32", "bfloat16"):  # FSDP2: fp32 shards; bf16 all-gathers, fp32 gradient reduction
        model = fsdp.shard(tiny_qwen3(), False, bf16=dtype == "bfloat16")
        out[dtype] = _moves(model, dtype, eps[mine], adv[mine], world_size=world_size)
        out[dtype + "_params"] = {{str(p.dtype) for p in model.parameters()}}
    if rank == 0:
        torch.save(out, os.path.join({out!r}, "bf16.pt"))
    fsdp.dist_teardown(world_size)
    fsdp.exit_now(world_size)
""")


OFFLOAD_WORKER = textwrap.dedent("""
    import os, sys, torch
    torch.set_num_threads(1)
    sys.path[:0] = [{repo!r}, {tests!r}]
    from plumbing import fsdp
    from plumbing.fsdp import load_sharded
    from test_gpu_path import _moves
    from test_muarl import synthetic_episodes, tiny_qwen3
    rank, world_size = fsdp.dist_setup(offload=True)
    eps, adv = synthetic_episodes()
    mine = slice(4 * rank, 4 * rank + 4)
    out = {{}}
    for offload in (False, True):  # the same AdamW steps, the shards on the device or in host memory
        torch.manual_seed(0)
        model = fsdp.shard(tiny_qwen3(), False, bf16=False, offload=offload)
        out[offload] = _moves(model, "float32", eps[mine], adv[mine], world_size=world_size)
    groups = [m._get_fsdp_state()._fsdp_param_group for m in [*model.get_decoder().layers, model]]
    out["offloaded"] = {{p.offload_to_cpu for g in groups if g for p in g.fsdp_params}}  # FSDP2 took the policy
    if rank == 0:
        tiny_qwen3().save_pretrained({out!r} + "/tiny")
    fsdp.barrier(world_size)
    from plumbing.fsdp import moved
    sd = model.state_dict()  # a shard rebuilt elsewhere gathers to the same whole (what a GPU does with offload)
    out["moved_diff"] = max((moved(t, torch.device("cpu")).full_tensor() - t.full_tensor()).abs().max().item()
                            for t in sd.values())
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.distributed.device_mesh import init_device_mesh
    odd = distribute_tensor(torch.arange(15.0).view(5, 3), init_device_mesh("cpu", (world_size,)), [Shard(0)])
    out["moved_diff"] += (moved(odd, torch.device("cpu")).full_tensor() - odd.full_tensor()).abs().max().item()
    out["uneven"] = tuple(odd.to_local().shape)
    loaded = load_sharded({out!r} + "/tiny", torch.float32, offload=True)  # meta -> host memory -> its rows
    whole = fsdp.full_state_dict(loaded, world_size, keep=rank == 0)
    if rank == 0:
        ref = tiny_qwen3().state_dict()
        out["load_diff"] = max((whole[k] - ref[k]).abs().max().item() for k in ref if k in whole)
        torch.save(out, os.path.join({out!r}, "offload.pt"))
    fsdp.dist_teardown(world_size)
    fsdp.exit_now(world_size)
""")


@pytest.mark.slow
def test_cpu_offload_steps_like_the_shards_on_the_device(tmp_path):
    # --offload (FSDP2 CPUOffloadPolicy) on 2 gloo ranks: on a CPU "host" and "device" are one memory, so this checks
    # the plumbing (sharding with the policy, meta-device loading into host memory, gathers, AdamW on the shards),
    # not the copies to and from a GPU (bench/gpu_check.py does that on CUDA)
    _on_gloo_ranks(OFFLOAD_WORKER.format(repo=str(REPO), tests=str(REPO / "tests"), out=str(tmp_path)), 2)
    out = torch.load(tmp_path / "offload.pt", weights_only=False)
    assert out[False].abs().max() > 0 and out["offloaded"] == {True}
    diff = (out[True] - out[False]).abs().max().item()
    print(f"offload vs not, 3 AdamW steps on 2 ranks: max difference of the weights' changes {diff:.1e}")
    assert diff < 1e-9
    assert out["load_diff"] == 0.0 and out["moved_diff"] == 0.0 and out["uneven"] == (3, 3)  # rank 0 of 5 rows


@pytest.mark.slow
def test_bf16_compute_under_fsdp2_on_two_ranks_moves_the_weights_like_fp32(tmp_path):
    _on_gloo_ranks(BF16_WORKER.format(repo=str(REPO), tests=str(REPO / "tests"), out=str(tmp_path)), 2)
    out = torch.load(tmp_path / "bf16.pt", weights_only=False)
    assert out["bfloat16_params"] == {"torch.float32"}  # the shards AdamW updates stay fp32
    assert (out["bfloat16"] != out["float32"]).any()
    agree = _agreement(out["bfloat16"], out["float32"])
    print(f"2 ranks: {100 * agree:.2f} % of the entries fp32 moves move the same way in bf16")
    assert agree >= 0.99


def test_vllm_joins_the_trainers_process_group_under_torchrun(monkeypatch, tmp_path):
    # no vLLM run: the engine's arguments under torchrun, with vllm.LLM replaced by a recorder
    import types

    import engine

    seen = {}

    class FakeLLM:
        def __init__(self, **kw):
            seen.update(kw)

        def get_tokenizer(self):
            return None

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=FakeLLM))
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 3)
    monkeypatch.setattr(engine, "default_stop_ids", lambda tok: [0])
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 128, "num_attention_heads": 2}))
    (tmp_path / "tokenizer_config.json").write_text("{}")
    engine.VLLMEngine(tmp_path, seed=10)
    assert seen["distributed_executor_backend"] == "external_launcher" and seen["seed"] == 13


@pytest.mark.slow
@pytest.mark.parametrize("offload", [[], ["--offload"]], ids=["", "offload"])
def test_the_gpu_check_runs_on_a_cpu(tmp_path, offload):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1", "--master_port", str(_free_port()),
           "bench/gpu_check.py", "--loop", "--out_dir", str(tmp_path / "run"), *offload]
    r = subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    seen = "\n".join(line for line in r.stdout.splitlines() if line.startswith("[gpu_check]"))
    print(seen)
    assert "params cpu/float32; grads cpu/float32; adamw cpu/float32" in seen  # fp32 masters and moments
    assert "GRPO step 1:" in seen and "resume: started at step 2; steps logged [2]" in seen
    assert "weights moved: 0.0 %" not in seen and f"offload {bool(offload)}" in seen


def test_the_gpu_plan_probe_runs_on_a_cpu(capsys):
    """bench/gpu_plan.py --tiny: the fp32-master step moves (nearly) every weight at lr 1e-6; bf16 weights barely."""
    import importlib

    importlib.import_module("bench.gpu_plan").main(["--tiny", "--tokens", "2048"])
    out = capsys.readouterr().out
    shares = [float(line.split(": ")[1].split(" %")[0]) for line in out.splitlines() if "% of entries moved" in line]
    assert len(shares) == 2 and shares[0] > 99.0 and shares[1] < 20.0, out  # float32 masters, then bfloat16 weights
    assert "update" in out and "skipped False" in out and "measured / planned peak" in out


@pytest.mark.slow
def test_the_gpu_plan_probe_loads_sharded_on_two_gloo_ranks(tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(_free_port()),
           "bench/gpu_plan.py", "--sharded", "--tiny"]
    r = subprocess.run(cmd, cwd=REPO, env={**ENV, "TMPDIR": str(tmp_path)}, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert "load_sharded on 2 rank(s), cpu: 25 of 25 saved tensors equal" in r.stdout, r.stdout[-2000:]
    assert "skipped False" in r.stdout


def _episodes(lengths, vocab=64):
    g = torch.Generator().manual_seed(0)
    out = []
    for T in lengths:
        ids = torch.randint(0, vocab, (T,), generator=g).tolist()
        mask = [0] * 4 + [1] * (T - 4)
        out.append(types.SimpleNamespace(ids=ids, mask=mask, logprobs=[-1.0 * m for m in mask]))
    return out


def _tiny(seed=0):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    return Qwen3ForCausalLM(Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=1, num_key_value_heads=1, head_dim=32)).float()


def test_an_episode_longer_than_the_row_trains_in_a_row_of_its_own_and_is_counted():
    torch.set_num_threads(1)
    model = _tiny()
    eps = _episodes([40, 12, 90])  # rows of 48 tokens: the 90-token episode cannot share one, nor be cut
    cfg = Config(micro_batch_tokens=48, logprob_chunk=16, kl_coef=0.0, dtype="float32")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    st = muarl.update(model, None, eps, [0.5, -0.5, 1.0], opt, cfg)
    assert st["long_rows"] == 1 and not st["skipped"]
    assert st["trained_tokens"] == sum(sum(e.mask) for e in eps)  # every trained token, the long one's too


RESHARD = r'''
import os, sys, torch
torch.set_num_threads(1)
sys.path.insert(0, {repo!r})
import muarl
from config import Config
from plumbing import fsdp
from torch.distributed.tensor import DTensor
fsdp.dist_setup()
torch.manual_seed(0)
from transformers import Qwen3Config, Qwen3ForCausalLM
cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=1,
                  num_key_value_heads=1, head_dim=32)
Qwen3ForCausalLM(cfg).float().save_pretrained({folder!r})
policy = fsdp.load_sharded({folder!r}, torch.float32)
reference = fsdp.load_sharded({folder!r}, torch.float32, frozen=True)
import types
eps = [types.SimpleNamespace(ids=list(range(3, 30)), mask=[0] * 5 + [1] * 22, logprobs=[0.0] * 27)]
opt = torch.optim.AdamW(policy.parameters(), lr=1e-3)
run = Config(micro_batch_tokens=64, logprob_chunk=16, kl_coef=0.1, dtype="float32")
st = muarl.update(policy, reference, eps, [1.0], opt, run, world_size=1)
# after the update, every parameter of the reference is a shard again (a DTensor), its root's too
gathered = [n for n, p in reference.named_parameters() if not isinstance(p, DTensor)]
assert st["kl"] >= 0 and not gathered, gathered
print("resharded")
'''


@pytest.mark.slow
def test_the_frozen_reference_is_resharded_after_its_forward(tmp_path):
    code = RESHARD.format(repo=str(REPO), folder=str(tmp_path / "model"))
    env = {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "HF_HUB_OFFLINE": "1"}
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "resharded" in r.stdout, (r.stdout + r.stderr)[-3000:]
