"""curves.py: the training-dynamics picture from a log.jsonl; a run never fails without matplotlib."""

import builtins
import json

import pytest

from plumbing import curves


def _log(tmp_path, n=6):
    recs = [{"phase": "eval", "name": "cold start", "pass^1": 0.4}]
    recs += [{"phase": "grpo", "step": s, "reward": 0.3 + 0.1 * s, "all_correct_groups": 0.1, "all_wrong_groups": 0.5,
              "transfer_rate": 0.2 - 0.03 * s, "think_rate": 0.1, "turns": 6.0} for s in range(n)]
    recs += [{"phase": "eval", "name": f"GRPO ({n} steps)", "pass^1": 0.8}]
    (tmp_path / "log.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n{broken line")
    return tmp_path


def test_reads_steps_and_evaluations(tmp_path):
    steps, evals = curves.read_log(_log(tmp_path) / "log.jsonl")
    assert [r["step"] for r in steps] == list(range(6)) and len(evals) == 2  # the broken last line is skipped
    assert [curves._eval_step(e) for e in evals] == [0, 6]


def test_draws_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    out = curves.draw(_log(tmp_path))
    assert out == tmp_path / "curves.png" and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_matplotlib_one_line_and_no_picture(tmp_path, monkeypatch, capsys):
    real = builtins.__import__
    monkeypatch.setattr(builtins, "__import__", lambda name, *a, **k: (_ for _ in ()).throw(ImportError(name))
                        if name.startswith("matplotlib") else real(name, *a, **k))
    assert curves.draw(_log(tmp_path)) is None and not (tmp_path / "curves.png").exists()
    assert "pip install matplotlib" in capsys.readouterr().out
