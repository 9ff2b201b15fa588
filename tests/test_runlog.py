"""Watching a run: one global step across phases, eval records keyed by the step they measured, strictly
valid JSON, the optional TensorBoard / wandb hook (imported only when asked for), and `logp_gap` as a real check of
weight sync (engine and trainer log-probs on the same distribution)."""

import json
import sys
import types

import pytest
import torch

import grpo
from plumbing.runlog import RunLog, finite


def strict(line: str) -> dict:
    """json.loads that refuses NaN / Infinity, as jq and most JSON readers do."""
    return json.loads(line, parse_constant=lambda c: pytest.fail(f"not JSON: {c}"))


def test_one_global_step_across_phases_and_strict_json(tmp_path):
    log = RunLog(tmp_path / "log.jsonl")
    log({"phase": "eval", "name": "untrained", "step": 0, "pass^1": float("nan")})
    for phase in ("copy_warmup", "copy_warmup", "sft", "grpo"):
        log({"phase": phase, "step": 0, "loss": 0.5, "ratio_min": float("inf"), "mix": {"a": float("-inf")}})
    log({"phase": "eval", "name": "GRPO step 1", "step": 1, "pass^1": 0.5})
    recs = [strict(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [r["global_step"] for r in recs] == [0, 1, 2, 3, 4, 4]  # phases restart `step`; global_step never does
    assert recs[1]["ratio_min"] is None and recs[1]["nonfinite"] == ["ratio_min", "mix"] and recs[1]["mix"] == {"a": None}
    assert recs[0]["pass^1"] is None and recs[-1]["step"] == 1
    assert finite({"x": 1.0, "y": [1]}) == {"x": 1.0, "y": [1]}


def _fake_module(monkeypatch, name: str, **attrs):
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    monkeypatch.setitem(sys.modules, name, mod)


def test_logger_hooks_are_imported_only_when_asked_for(tmp_path, monkeypatch):
    monkeypatch.delitem(sys.modules, "wandb", raising=False)
    RunLog(tmp_path / "a.jsonl")({"phase": "sft", "loss": 1.0})
    assert "wandb" not in sys.modules  # the default imports nothing
    scalars, logged = [], []

    class SummaryWriter:  # stands in for torch.utils.tensorboard.SummaryWriter (the package is optional)
        def __init__(self, logdir):
            self.logdir = logdir

        def add_scalar(self, name, value, step):
            scalars.append((name, value, step))

    _fake_module(monkeypatch, "torch.utils.tensorboard", SummaryWriter=SummaryWriter)
    _fake_module(monkeypatch, "wandb", init=lambda **k: logged.append(("init", k["project"])),
                 log=lambda d, step: logged.append((d, step)))
    for kind in ("tensorboard", "wandb"):
        log = RunLog(tmp_path / f"{kind}.jsonl", logger=kind, config={"lr": 1e-6})
        log({"phase": "sft", "loss": 0.25, "skipped": False, "stop_reasons": {"user_stop": 2}})
        log({"phase": "eval", "name": "cold start", "pass^1": 0.5})
    assert scalars == [("sft/loss", 0.25, 1), ("eval/pass^1", 0.5, 1)]  # numbers only, keyed by the global step
    assert logged == [("init", "muarl"), ({"sft/loss": 0.25}, 1), ({"eval/pass^1": 0.5}, 1)]


def test_a_missing_logger_package_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb -> ImportError
    with pytest.raises(ValueError, match="--logger wandb needs the wandb package"):
        RunLog(tmp_path / "log.jsonl", logger="wandb")


def test_real_tensorboard_writes_event_files(tmp_path):
    pytest.importorskip("tensorboard", reason="the tensorboard package is not installed (optional)")
    log = RunLog(tmp_path / "log.jsonl", logger="tensorboard")
    log({"phase": "grpo", "reward": 0.5})
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))


def test_logp_gap_compares_like_with_like():
    # The engine reports the log-prob of each sampled token under the distribution it drew from (temperature, then
    # the top-p nucleus renormalised). The trainer's full-softmax log-probs differ from those even with identical
    # weights (by ~0.1 at top-p 0.9), so a gap against them cannot show a weight-sync bug; the trainer's
    # log-probs under the sampler's distribution (token_logprobs(..., sampler=...)) match to float precision.
    from plumbing.hf_engine import HFEngine
    from test_muarl import tiny_qwen3

    class Tok:
        eos_token_id, pad_token_id = 1, 0

    model = tiny_qwen3(seed=3)
    prompt = torch.randint(2, 320, (12,), generator=torch.Generator().manual_seed(0)).tolist()
    (s,) = HFEngine(model, Tok()).generate([prompt], max_new_tokens=24, temperature=1.0, top_p=0.9,
                                           stop_token_ids=[], seed=5)
    ids = torch.tensor([prompt + s.token_ids])  # (1, T)
    with torch.no_grad():
        full, _, seen = grpo.token_logprobs(model, ids, return_entropy=True, sampler=(1.0, 0.9))  # (1, T) each
    engine = torch.tensor(s.logprobs)  # (n,)
    gap_seen = (engine - seen[0, len(prompt):]).abs().max().item()
    gap_full = (engine - full[0, len(prompt):]).abs().mean().item()
    print(f"engine vs trainer: same distribution {gap_seen:.1e}, full softmax {gap_full:.3f}")
    assert gap_seen < 1e-4 and gap_full > 1e-2
    # a stale engine (other weights) shows up in the like-for-like gap
    _, _, other = grpo.token_logprobs(tiny_qwen3(seed=4), ids, return_entropy=True, sampler=(1.0, 0.9))
    assert (engine - other[0, len(prompt):]).abs().mean().item() > 1e-2
