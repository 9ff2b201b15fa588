"""Smoke runs of the benchmarks: each script, with its quickest flags, in a subprocess, must exit 0 and end with
its ratio lines. The numbers themselves are not checked (they depend on the machine and its load); that the
scripts run end to end and report what they measured is."""

import json
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


def test_probe_decision_reads_p_refuse_per_request_and_status(tmp_path):
    # A run folder as the store's evaluation writes it: a model folder and transcripts (here the held-out tasks'
    # correct conversations, the thought included, and a random tiny model): one p(refuse) per conversation that
    # looked an order up, a probability, grouped by (request, status); a run without them is one line, exit 1.
    import json

    from plumbing.tiny_model import build_tiny
    from domains import store

    world = store.build_world(0, n_orders=60, n_test_orders=20, n_train=10, n_test=12)
    build_tiny(tmp_path / "cold-start", texts=[world.rules] + [json.dumps(t.expert) for t in world.tasks()],
               hidden=32, layers=1, heads=1, kv_heads=1, intermediate=64, vocab_size=300)
    with open(tmp_path / "episodes-rank0.jsonl", "w") as f:
        for t in world.tasks("test"):
            msgs = [{"role": "system", "content": world.rules}] + t.expert
            f.write(json.dumps({"phase": "eval", "name": "cold start", "task_id": t.id, "messages": msgs}) + "\n")
    sys.path.insert(0, str(REPO / "bench"))
    from probe_decision import probe

    res = probe(tmp_path, "cold-start", "cold start")
    spoke = [t for t in world.tasks("test") if any(m["role"] == "assistant" and not m.get("tool_calls")
                                                  for m in t.expert[2:])]
    assert sum(map(len, res.values())) == len(spoke) > 0
    assert set(res) == {(t.spec["request"], t.spec["status"]) for t in spoke}
    assert all(0.0 <= p <= 1.0 for ps in res.values() for p in ps)
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "probe_decision.py"), str(tmp_path / "none")],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "has no cold-start/" in proc.stderr and "Traceback" not in proc.stderr


def test_compare_customers_cells_are_eval_commands_of_each_runs_own_world(tmp_path):
    # the comparison of customers: each cell is eval.py on the run's final model, its world and limits, against a
    # customer; each cell's command line is one eval.py takes (its flags are muarl's: --domains, --eval_trials)
    sys.path.insert(0, str(REPO / "bench"))
    import compare_customers as cc

    from demo import SHIPPED
    from plumbing.eval_flags import parse_args

    run, other = tmp_path / "llm-1", tmp_path / "B"
    for model in (run / "final", other):  # model folders, as eval.py's parse sees them
        model.mkdir(parents=True)
        (model / "config.json").write_text("{}")
    # a demo run's saved settings: its customer served from the shipped model's folder, 2 trials an evaluation
    saved = {"domains": "store", "user": "llm", "user_serve": str(SHIPPED), "seed": 1, "synthetic_seed": 1,
             "tools_in_prompt": False, "max_turns": 10, "max_new_tokens": 64, "max_context": 1024, "eval_trials": 2}
    (run / "config.json").write_text(json.dumps(saved))
    script, own, held = (cc.cell_argv(run, c, str(other)) for c in cc.COLUMNS)
    for argv in (script, own, held):
        assert argv[argv.index("--model") + 1] == str(run / "final") and argv[argv.index("--synthetic_seed") + 1] == "1"
        a = parse_args(argv)
        assert (a.model, a.domains, a.synthetic_seed, a.seed, a.max_turns, a.max_new_tokens, a.max_context,
                bool(a.tools_in_prompt), a.temperature) == (str(run / "final"), "store", 1, 1, 10, 64, 1024, False, 0.0)
    assert (parse_args(script).user, parse_args(script).eval_trials) == ("scripted", 1)  # a script: one trial
    assert own[-2:] == ["--user_serve", str(SHIPPED)] and held[-2:] == ["--user_serve", str(other)]
    for argv in (own, held):  # a served customer samples: 2 trials
        a = parse_args(argv)
        assert (a.user, a.user_temperature, a.eval_trials) == ("llm", 0.7, 2) and "--eval_trials" in argv
    (run / "config.json").write_text(json.dumps({**saved, "user": "sampled"}))
    sampled = cc.cell_argv(run, "its training customer", str(other))
    assert sampled[-4:] == ["--user", "sampled", "--eval_trials", "2"] and parse_args(sampled).eval_trials == 2
    text = cc.table({("the script", "the script"): [(0, 0.5, 1.0), (1, 0.7, 0.99)],
                     ("the LLM customer", "a held-out customer"): [(0, 0.8, 0.97)]})
    assert "| the script | 60.0 +- 14.1 (n=2; fidelity 99.0-100.0 %) | not run | not run |" in text
    assert "| the LLM customer | not run | not run | 80.0 (n=1; fidelity 97.0-97.0 %) |" in text
    diff = cc.paired({("the script", "a held-out customer"): [(0, 0.5, 1.0), (1, 0.7, 0.9), (2, 0.6, 1.0)],
                      ("the LLM customer", "a held-out customer"): [(0, 0.8, 0.97), (1, 0.6, 0.9)]})
    assert "| the LLM customer - the script | no seed in both | no seed in both | +30.0, -10.0 (seeds 0, 1; mean " \
           "+10.0) |" in diff  # seed by seed, only the seeds both rows ran
    shares = cc.broken({("the sampled script", "a held-out customer"): [0.1, 0.2, 0.3]})
    assert "| the sampled script | not run | not run | 20.0 % (10.0-30.0) |" in shares


def test_fidelity_split_separates_conversations_with_other_agent_text(tmp_path):
    # bench/fidelity_split.py: the in-loop fidelity of a run's evaluations, split by whether every agent text was a
    # policy line (any id, any status) or not; an episode that is not an evaluation's is left out.
    sys.path.insert(0, str(REPO / "bench"))
    from fidelity_split import policy_line

    from domains import shop, store

    refuse = shop.REFUSE["return"].format("#W113", "pending")
    assert policy_line(store.ASK_ID) and policy_line(refuse) and policy_line(shop.DONE["cancel"].format("#W7"))
    assert not policy_line('I am sorry, but the policy do thir", "arguments": {"sum') and not policy_line(refuse + " x")

    def episode(texts, mistakes, phase="eval", name="GRPO step 10"):
        msgs = [{"role": "user", "content": "Hi, return #W113."}, {"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "get_order_details", "arguments": {"order_id": "#W113"}}}]}]
        msgs += [{"role": "assistant", "content": t} for t in texts]
        return {"phase": phase, "name": name, "info": {"customer_mistakes": mistakes}, "messages": msgs}

    run = tmp_path / "run"
    run.mkdir()
    rows = [episode([refuse], []), episode([refuse, store.REFUSE_AGAIN], ["no_human"]),
            episode([refuse, 'I am sorry, but the policy do thir", "arg'], ["extra_insist"]),
            episode(["Sorry, order #W1 is is is"], []), episode(["garbled"], ["gibberish"], phase="step")]
    (run / "episodes-rank0.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = subprocess.run([sys.executable, str(REPO / "bench" / "fidelity_split.py"), str(run)], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "| GRPO step 10 | 50.0 % of 4 | 50.0 % of 2 | 50.0 % of 2 |" in out.stdout, out.stdout
    assert out.stdout.strip().splitlines()[-1].startswith("lowest in-loop fidelity: 50.0 %")
    missing = subprocess.run([sys.executable, str(REPO / "bench" / "fidelity_split.py"), str(tmp_path / "none")],
                             cwd=REPO, capture_output=True, text=True, timeout=120)
    assert missing.returncode == 1 and "not found" in missing.stderr and "Traceback" not in missing.stderr


def test_gate_worlds_plays_each_runs_own_gate_tasks(tmp_path):
    # bench/gate_worlds.py: README command 1's world for each seed, and the held-out tasks its gate plays
    sys.path.insert(0, str(REPO / "bench"))
    from gate_worlds import run_tasks, seeds_of

    assert seeds_of("0-3,9") == [0, 1, 2, 3, 9] and seeds_of("5") == [5]
    cfg, tasks = run_tasks(3)
    from demo import SHIPPED

    # the demo's run for seed 3 (python -m demo --seed 3): its world is seed 3's, its customer the shipped model
    assert (cfg.seed, cfg.synthetic_seed, cfg.user_serve, cfg.user_gate) == (3, 3, str(SHIPPED), 0.95)
    assert len(tasks) == 200 and all(t.split == "test" and t.spec["behaviour"] for t in tasks)
    other = run_tasks(4)[1]
    assert [t.spec["order_id"] for t in tasks] != [t.spec["order_id"] for t in other]  # a seed is its own world
    out = subprocess.run([sys.executable, str(REPO / "bench" / "gate_worlds.py"), str(tmp_path), "--seeds", "0"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "no model in" in out.stderr and "Traceback" not in out.stderr
