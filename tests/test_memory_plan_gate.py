"""The memory plan is a gate, and a GPU model never runs quietly on the CPU (plumbing/fsdp.place).

  gate        a GPU run whose plan does not fit (a phase over the GPU, vLLM or the customer's server that would not
              start, a node's host memory, the customer's requests in flight) stops on rank 0 before anything is
              loaded: ValueError, one line naming what does not fit and the flags that would, exit 2 through
              run_cli; --plan_override runs it anyway, and says so (the other ranks: tests/test_several_nodes.py)
  the card    the plan reads the card's own total memory (torch.cuda.get_device_properties), not 80 GiB
  no CUDA     a model the plan sizes above what a CPU run is for is refused in one line saying what torch sees;
              a small model (the demo's, the tests' gloo ranks) runs, and several CPU ranks say so

CUDA is faked by patching torch.cuda: nothing here needs a GPU.
"""

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import muarl
from config import Config
from plumbing import fsdp, memory_plan as mp
from plumbing.flags import run_cli

REPO = Path(__file__).resolve().parents[1]
GIB = mp.GIB


@pytest.fixture
def cuda(monkeypatch):
    """A fake card of `cuda.gib` GiB (80 by default): what place() asks of torch.cuda."""
    card = SimpleNamespace(gib=80.0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device=None: SimpleNamespace(total_memory=int(card.gib * GIB)))
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    monkeypatch.setattr(fsdp, "host_memory", lambda: 2048 * GIB)  # an 8-GPU node's 2 TiB
    return card


def run_cfg(model="Qwen/Qwen3-32B", **kw):
    return dataclasses.replace(Config(model=model, user_model="gpt-4o"), **kw)


# --------------------------------------------------------------------------------------------------
# The gate


def test_a_plan_that_does_not_fit_stops_the_run_in_one_line_naming_the_fix(cuda):
    with pytest.raises(ValueError) as e:
        fsdp.place(run_cfg(), 0, 8)  # 32B with the paper's flags on 8 x 80 GiB
    line = str(e.value)
    assert "\n" not in line and line.startswith("the memory plan does not fit on 8 x 80 GiB")
    assert "vLLM would not start" in line and "it would fit with --" in line and "--plan_override" in line


def test_plan_override_runs_it_anyway_and_says_so(cuda, capsys):
    cfg, device, engine, on_gpu, sharded = fsdp.place(run_cfg(plan_override=True), 0, 8)
    assert (device, engine, on_gpu, cfg.dtype) == ("cuda:0", "vllm", True, "bfloat16")
    assert "[plan] --plan_override: running although the memory plan does not fit" in capsys.readouterr().out


def test_a_plan_that_fits_passes(cuda, capsys):
    fsdp.place(run_cfg("Qwen/Qwen3-8B"), 0, 8)  # 8B on 8 x 80 GiB with the defaults fits
    assert "DOES NOT FIT" not in capsys.readouterr().out


def test_the_plan_reads_the_cards_own_memory(cuda, capsys):
    cuda.gib = 139.8  # an H200: 8B on one GPU fits there with offload, the plan says so from its size
    fsdp.place(run_cfg("Qwen/Qwen3-8B", plan_override=True), 0, 1)
    assert "1 GPU(s), 140 GiB" in capsys.readouterr().out


def test_the_run_stops_before_loading_anything_exit_2_one_line(cuda, tmp_path, monkeypatch, capsys):
    loaded = []
    monkeypatch.setattr(muarl, "build_or_load_model", lambda *a, **k: loaded.append("policy"))
    out = tmp_path / "run"
    cfg = run_cfg(out_dir=str(out))
    with pytest.raises(SystemExit) as e:
        run_cli(lambda: muarl.train(cfg), "muarl")
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and "\n" not in err and err.startswith("muarl: the memory plan does not")
    assert not loaded and not out.exists()  # nothing loaded, nothing written


# --------------------------------------------------------------------------------------------------
# Host memory and the customer's requests in flight


def test_a_nodes_host_memory_is_checked_with_rank_0s_checkpoint_gather():
    c8 = mp.load_config("Qwen/Qwen3-8B")
    kw = dict(tokens=16384, max_context=32768, checkpointing=True, reference=True, offload=True,
              engine_share=0.85)
    p = mp.plan(c8, 8, host_gib=2048, local_gpus=8, **kw)
    assert p["checkpoint_host"] == 12 * p["P"]  # fp32 weights + two AdamW moments, gathered on rank 0
    assert p["host_node"] == pytest.approx(8 * p["host"] + 12 * p["P"])
    assert not any("host memory" in w for w in p["why"])
    small = mp.plan(c8, 8, host_gib=256, local_gpus=8, **kw)
    assert any(w.startswith("host memory: a node needs") for w in small["why"]) and not small["fits"]
    assert mp.plan(c8, 8, host_gib=None, **kw)["fits"] == p["fits"]  # --plan N leaves the host out


def test_the_served_customers_kv_cache_is_weighed_against_its_requests_in_flight():
    serve = str(REPO / "configs" / "Qwen3-8B")
    crowded = mp.describe(run_cfg("Qwen/Qwen3-8B", user_serve=serve, user_memory=0.3, micro_batch_tokens=16384,
                                  dtype="bfloat16"), 8, "vllm", 80.0, False)
    assert "fewer than the replies alone of its 128 requests in flight (66k" in crowded
    assert "--user_concurrency" in crowded.split("Would fit with: ")[1]
    calm = mp.describe(run_cfg("Qwen/Qwen3-8B", user_serve=serve, user_memory=0.3, user_concurrency=4,
                               micro_batch_tokens=16384, dtype="bfloat16"), 8, "vllm", 80.0, False)
    assert "requests in flight (" not in calm and "up to 32 requests in flight" in calm


# --------------------------------------------------------------------------------------------------
# No usable CUDA


def test_a_gpu_model_without_cuda_is_refused_in_one_line(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError) as e:
        fsdp.place(run_cfg("Qwen/Qwen3-8B"), 0, 8)
    line = str(e.value)
    assert "\n" not in line and line.startswith("no usable CUDA: torch ")
    assert "torch.cuda.is_available() is False" in line and "8.2B parameters" in line and "8 gloo ranks" in line
    assert "CUDA 13" in line


def test_several_ranks_without_cuda_are_refused_unless_asked_for(monkeypatch, tmp_path, capsys):
    from demo.tiny_model import build_tiny

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    build_tiny(tmp_path, hidden=32, layers=1, heads=2, kv_heads=1, intermediate=64)
    monkeypatch.delenv("MUARL_CPU_RANKS", raising=False)
    # torchrun with 2 ranks and no GPU, even of a small model: a GPU run whose CUDA is broken, said on rank 0
    with pytest.raises(ValueError) as e:
        fsdp.place(run_cfg(str(tmp_path)), 0, 2)
    line = str(e.value)
    assert "\n" not in line and "no usable CUDA: torchrun started 2 ranks" in line and "MUARL_CPU_RANKS=1" in line
    with pytest.raises(SystemExit) as quiet:  # rank 1 stops quietly: rank 0 says why
        fsdp.place(run_cfg(str(tmp_path)), 1, 2)
    assert quiet.value.code == 2 and capsys.readouterr().out == ""
    fsdp.place(run_cfg(str(tmp_path)), 0, 1)  # one process on the CPU: the demo's way, never refused
    # asked for on purpose (the tests' gloo ranks): it runs, and says so
    monkeypatch.setenv("MUARL_CPU_RANKS", "1")
    cfg, device, engine, on_gpu, _ = fsdp.place(run_cfg(str(tmp_path)), 0, 2)
    assert (device, engine, on_gpu) == ("cpu", "hf", False)
    assert "[place] no CUDA: 2 gloo processes on the CPU" in capsys.readouterr().out
    assert fsdp.no_cuda_refusal("tiny", 1) is None  # the demo's, built later: not sized, not refused


def test_the_plan_alone_is_asked_anywhere(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as e:
        fsdp.place(run_cfg("Qwen/Qwen3-8B", plan=8), 0, 1)  # --plan 8 on a laptop: printed, exit 0
    assert e.value.code == 0
