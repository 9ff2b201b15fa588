"""Smoke runs of the benchmarks: each script, with its quickest flags, in a subprocess, must exit 0 and end with
its ratio lines. The numbers themselves are not checked (they depend on the machine and its load); that the
scripts run end to end and report what they measured is."""

import os
import subprocess
import sys

import pytest
from conftest import REPO, needs_tau2


def run_bench(script: str, *args: str, timeout: int = 600) -> list[str]:
    env = dict(os.environ)  # carries MUARL_CACHE (conftest's private cache) to the child
    proc = subprocess.run([sys.executable, str(REPO / "bench" / script), *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{script} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout.strip().splitlines()


@needs_tau2
def test_bench_domains_quick():
    lines = run_bench("bench_domains.py", "--quick")
    last = lines[-4:]  # creation + scoring ratio for each of the two domains, printed last
    assert [line.split(":")[0] for line in last] == [
        "ratio retail creation", "ratio retail scoring", "ratio airline creation", "ratio airline scoring"], last
    assert "json.load+deepcopy / new_env = " in last[0] and "x (goal >= 100x)" in last[0]
    assert "median cold" in last[1] and "warm" in last[1]
    assert not any(line.startswith("WARNING") for line in lines), "a gold replay did not score 1"


def test_bench_domains_without_data_says_so(tmp_path):
    # A data folder without tau2's files: a clear message and exit code 2, not a traceback.
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "bench_domains.py"), "--quick", "--data-dir", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "tau2 data for 'retail' is missing" in proc.stderr and "Traceback" not in proc.stderr


def test_bench_rollout_quick_hf():
    lines = run_bench("bench_rollout.py", "--quick", "--engine", "hf")
    assert lines[-1].startswith("ratio hf: batched / sequential episodes per second = "), lines[-3:]
    # one repetition of each variant, the same 4 tasks x G=2 episodes, each reporting the tokens it sampled
    reps = [line for line in lines if line.startswith("[hf] rep 0") and " episodes in " in line]
    assert [r.split()[3] for r in reps] == ["batched", "sequential"], reps
    assert all("8 episodes in" in r and " sampled, " in r for r in reps), reps
    # both variants sampled the same tokens (per-episode seeds), so the ratio compares the same work
    assert "[hf] rep 0 same work: 8/8 episodes have identical token streams in both variants" in lines, lines
    assert reps[0].split(" sampled,")[0].split()[-1] == reps[1].split(" sampled,")[0].split()[-1]
    assert any(line.startswith("[hf] rep 0 decode: one-row step ") and " gains " in line for line in lines), lines


@pytest.mark.slow
@pytest.mark.vllm
def test_bench_rollout_quick_vllm():
    pytest.importorskip("vllm")
    lines = run_bench("bench_rollout.py", "--quick", "--engine", "vllm")
    assert lines[-1].startswith("ratio vllm: batched / sequential episodes per second = "), lines[-3:]


def test_bench_decode_attention_quick():
    lines = run_bench("bench_decode_attention.py", "--rows", "1", "2", "--context", "64", "--rounds", "3")
    assert sum("GB/s of keys/values" in line for line in lines) == 2 * 3 * 2  # rows x dtypes x masks
    assert lines[-1].startswith("ratio at 2 rows, time / fp32 time: bf16 ")
