"""Between the cold start and the first rollout: nothing left over, nothing lost when vLLM refuses to start.

  gradients   the cold start's last fp32 gradients are freed before the engine starts (every p.grad is None)
  first push  the first weights reach the engine as the loop pushes them: asleep, weights woken, then pushed
  checkpoint  the cold start is checkpoint step 0, written before vLLM starts: a run whose vLLM refused to start
              resumes after the cold start (--resume), not before it
  vLLM's say  its refusal is shown whole (its type, its message, what caused it) with what to do next, exit 3
  context     the run's rollout engine asks vLLM for --max_context, not the model's 40,960 positions

On a CPU: the CPU demo's tiny model, and an engine that stands in for vLLM.
"""

import dataclasses
import json
import shutil
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import engine
import muarl
import sft
from config import Config
from demo import train as demo_train
from plumbing.hf_engine import HFEngine
from plumbing.models import load_policy
from plumbing.preflight import RunStopped

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from test_muarl import TINY, _one_thread, tiny_init  # noqa: E402,F401  (fixtures)

ENOUGH_KV = ("To serve at least one request with the models's max seq len (32768), (4.50 GiB KV cache is needed, "
             "which is larger than the available KV cache memory (2.00 GiB).")


def test_the_cold_starts_gradients_are_freed_before_the_engine_starts(tmp_path, monkeypatch):
    from demo.tiny_model import build_tiny
    from domains import load_world

    world = load_world("synthetic", seed=0)
    model, tok = build_tiny(tmp_path / "tiny", hidden=32, layers=1, heads=2, kv_heads=1, intermediate=64)

    def fit(policy, examples, **kw):  # a cold start's last step: a backward with no zero_grad after it
        sum(p.float().sum() for p in policy.parameters()).backward()
        assert all(p.grad is not None for p in policy.parameters())

    monkeypatch.setattr(sft, "train", fit)
    examples = sft.render_examples(tok, sft.conversations("tasks", world.tasks("train")[:4]), {world.name: world})
    sft.cold_start(model, tok, examples, tmp_path / "run" / "cold-start", epochs=1.0)
    assert all(p.grad is None for p in model.parameters())  # 4 bytes a parameter, back before vLLM starts
    assert (tmp_path / "run" / "cold-start" / "config.json").is_file()


def test_vllms_refusal_is_shown_whole_with_what_to_do(monkeypatch, tmp_path):
    class LLM:
        def __init__(self, **kw):
            try:
                raise RuntimeError("CUDA out of memory while profiling")
            except RuntimeError as e:
                raise ValueError(ENOUGH_KV) from e

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=LLM))
    (tmp_path / "config.json").write_text('{"hidden_size": 128, "num_attention_heads": 2}')
    (tmp_path / "tokenizer_config.json").write_text("{}")
    with pytest.raises(RunStopped) as e:
        engine.VLLMEngine(tmp_path)
    text = str(e.value)
    assert f"ValueError: {ENOUGH_KV}" in text and "caused by RuntimeError: CUDA out of memory while profiling" in text
    assert "rerun with --resume" in text


class StandIn(HFEngine):
    """vLLM's place, on a CPU: records the order of its calls."""

    calls: list = []

    def update_weights(self, named_tensors):
        StandIn.calls.append("update_weights")
        super().update_weights(named_tensors)

    def sleep(self):
        StandIn.calls.append("sleep")

    def wake_up(self):
        StandIn.calls.append("wake_up")


def test_a_cold_start_survives_vllm_refusing_to_start(monkeypatch, tmp_path, tiny_init, capsys):
    out = tmp_path / "run"
    args = [*TINY, "--sft_epochs", "0.02",  # (after TINY's 0: the last wins)
            "--sft_batch", "4", "--engine", "vllm", "--steps", "1",
            "--out_dir", str(out)]
    cfg = dataclasses.replace(demo_train.parse(args), model=str(tiny_init))  # muarl's own cold start, on a folder

    def refused(kind, model=None, tokenizer=None, model_path=None, **kw):
        if kind == "vllm":
            raise engine.vllm_refused(ValueError(ENOUGH_KV))
        return HFEngine(model, tokenizer)

    monkeypatch.setattr(engine, "make_engine", refused)
    with pytest.raises(RunStopped, match="vLLM did not start"):
        muarl.train(cfg)
    assert (out / "checkpoints" / "step-000000" / "model.pt").is_file()  # the cold start, saved before vLLM
    after_cold_start = torch.load(out / "checkpoints" / "step-000000" / "model.pt", weights_only=True)

    cold_starts = []
    monkeypatch.setattr(sft, "cold_start", lambda *a, **k: cold_starts.append(1))

    def works(kind, model=None, tokenizer=None, model_path=None, **kw):
        if kind == "vllm":
            return StandIn(load_policy(str(model_path))[0], tokenizer)
        return HFEngine(model, tokenizer)

    monkeypatch.setattr(engine, "make_engine", works)
    StandIn.calls = []
    seen, real_update = {}, muarl.update

    def update(policy, *a, **k):  # the weights the first GRPO update starts from
        seen.setdefault("w", {n: t.detach().clone() for n, t in policy.state_dict().items()})
        return real_update(policy, *a, **k)

    monkeypatch.setattr(muarl, "update", update)
    muarl.train(dataclasses.replace(cfg, resume=True))
    assert not cold_starts  # resumed after it: the cold start ran once
    assert all(torch.equal(seen["w"][n], t) for n, t in after_cold_start.items())  # RL starts from its weights
    # the first push as the loop's: asleep, the weights woken, then pushed (the KV cache wakes after them)
    assert StandIn.calls[:3] == ["sleep", "wake_up", "update_weights"]
    assert "cold start" in (out / "results.md").read_text()  # its evaluation, run by the resumed run


def test_the_rollout_engine_asks_vllm_for_the_runs_context(monkeypatch, tmp_path):
    seen = {}

    class FakeLLM:  # records what vLLM would be started with (no vLLM runs)
        def __init__(self, **kw):
            seen.update(kw)

        def get_tokenizer(self):
            return None

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=FakeLLM))
    monkeypatch.setattr(engine, "default_stop_ids", lambda tok: [0])
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 128, "num_attention_heads": 2,
                                                      "max_position_embeddings": 40960}))
    (tmp_path / "tokenizer_config.json").write_text("{}")
    cfg = Config(max_context=12288, dtype="bfloat16")
    eng, shares = engine.rollout_engine("vllm", None, None, str(tmp_path), cfg, "cpu", sharded=False)
    assert not shares and seen["max_model_len"] == 12288  # the run's context, not the model's 40,960
