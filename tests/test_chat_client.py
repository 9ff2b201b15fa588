"""The customer endpoint's budget: a whole-request deadline, retries and backoff as flags, and the customer's
health per step in log.jsonl; eval.py's failures as one line.

The servers here are real loopback sockets (127.0.0.1), each bounded in time. The deadline bounds the whole
request, not each read: a server that trickles a byte a second would otherwise hold a request indefinitely
(120 s with a per-read timeout of 2)."""

import json
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from conftest import REPO
from user_sim import LLMUser, UserError

TASK = SimpleNamespace(id="t/1", spec=None, instructions="Return the lamp.")


@pytest.fixture
def trickler():
    """A server that answers 200 and then trickles its body one byte every 0.2 s, for at most 8 s per request."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    srv.settimeout(0.2)
    state = {"stop": False, "requests": 0}

    def serve(conn):
        with conn:
            conn.settimeout(8)
            try:
                conn.recv(65536)
                state["requests"] += 1
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n")
                for _ in range(40):  # 40 x 0.2 s = 8 s, then the server gives up
                    if state["stop"]:
                        return
                    conn.sendall(b" ")
                    time.sleep(0.2)
            except OSError:
                return

    def accept():
        while not state["stop"]:
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield f"http://127.0.0.1:{srv.getsockname()[1]}/v1", state
    state["stop"] = True
    srv.close()


def test_a_trickling_server_costs_at_most_the_deadline_per_attempt(trickler):
    url, state = trickler
    user = LLMUser("m", base_url=url, api_key="EMPTY", timeout=1.0, max_retries=1, backoff=0.05)
    t0 = time.monotonic()
    with pytest.raises(UserError, match="deadline"):
        user.reply(TASK, [{"role": "user", "content": "hi"}])
    took = time.monotonic() - t0
    assert took < 3.5, took  # 2 attempts x 1 s + backoff (not the server's 8 s per attempt)
    assert state["requests"] == 2
    stats = user.take_stats()
    assert stats["calls"] == 2 and stats["retries"] == 1 and stats["failures"] == 1 and stats["deadlines"] == 2
    assert 0.9 < stats["latency_p50"] < 2.0 and stats["latency_max"] < 2.0
    assert user.take_stats()["calls"] == 0  # per step: counted since the last take


class Customer(BaseHTTPRequestHandler):
    """An OpenAI-compatible customer that always says it is done."""

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": [
            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "Thanks! ###STOP###"}}]})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args):
        pass


class Server(ThreadingHTTPServer):
    daemon_threads, request_queue_size = True, 128  # 16 customer threads at once: a backlog of 5 would refuse some


def test_customer_statistics_are_in_the_step_log(tmp_path):
    from demo import train as demo_train
    from test_muarl import TINY, grpo_records

    srv = Server(("127.0.0.1", 0), Customer)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        demo_train.main(TINY + ["--out_dir", str(tmp_path / "run"), "--steps", "1", "--user", "llm",
                           "--user_model", "m", "--user_base_url", f"http://127.0.0.1:{srv.server_address[1]}/v1",
                           "--user_timeout", "5", "--user_retries", "1", "--user_backoff", "0.1",
                           "--preflight", "false"])  # (this stub answers chat completions only, no /models)
    finally:
        srv.shutdown()
        srv.server_close()
    (rec,) = grpo_records(tmp_path / "run")
    user = rec["user"]
    assert 2 <= user["calls"] <= 2 + 4 * 6  # the step's own: 2 openings + at most 4 episodes x 6 turns
    assert user["retries"] == 0 and user["failures"] == 0 and user["deadlines"] == 0
    evals = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [e["user"]["calls"] >= 1 for e in evals if e["phase"] == "eval"] == [True, True]  # evaluations: their own
    assert 0 < user["latency_p50"] <= user["latency_p90"] <= user["latency_p99"] <= user["latency_max"] < 5
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert (config["user_timeout"], config["user_retries"], config["user_backoff"]) == (5.0, 1, 0.1)


def run_eval(args):
    # generated tasks: no tau2 data needed
    return subprocess.run([sys.executable, "eval.py", "--domains", "synthetic", *args, "--out", os.devnull], cwd=REPO,
                          capture_output=True, text=True,
                          timeout=240)  # (--out: never the default runs/eval inside the checkout)


@pytest.mark.parametrize("args,says", [
    (["--agent", "oracle", "--split", "nope"], "--split must be test, train or all, got 'nope'"),
    # an empty split (a generated world's evaluation builds its held-out tasks only): never a table of pass^1 nan
    # and exit 0
    (["--agent", "oracle", "--split", "train"], "no tasks in split 'train' of synthetic"),
    (["--model", "/nonexistent"], "no such model folder"),  # (never a transformers traceback)
    (["--agent", "openai", "--agent_model", "m", "--agent_base_url", "http://127.0.0.1:9/v1", "--agent_api_key", "k",
      "--user", "scripted", "--eval_tasks", "2"], "is unreachable"),  # a dead endpoint, found by preflight
])
def test_eval_failures_are_one_line_and_exit_2(args, says):
    r = run_eval(args)
    lines = [line for line in r.stderr.splitlines() if "eval:" in line and "%|" not in line]
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert len(lines) == 1 and says in lines[0], r.stderr[-2000:]


def test_step_statistics_count_scored_episodes_only():
    # honest logs: aborted episodes (a failed customer) are never scored, so they are not zeros in the step's
    # reward or its group shares; they are counted on their own key
    from plumbing.runlog import step_stats

    def ep(reward, stop):
        return SimpleNamespace(reward=reward, turns=2, mask=[1], ids=[1, 2], tool_calls=[], stop_reason=stop,
                               aborted=stop == "user_error", info={})

    eps = [ep(1.0, "user_stop"), ep(1.0, "user_stop"), ep(1.0, "user_stop"), ep(0.0, "user_error"),  # group 2: aborted
           ep(0.0, "user_stop"), ep(0.0, "max_turns"), ep(0.0, "user_error"), ep(0.0, "user_error")]
    st = step_stats(eps, kept_groups=1, group_size=2)
    assert st["reward"] == pytest.approx(3 / 5) and st["aborted"] == 3 and st["episodes"] == 8
    assert st["all_correct_groups"] == 0.5 and st["all_wrong_groups"] == 0.5  # over the 2 groups with no abort
