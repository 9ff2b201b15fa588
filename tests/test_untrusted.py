"""Untrusted text stays data (issue 14): tools run under a time and size budget, text the tokenizer cannot carry is
escaped, and the agent's calls pass one parser whether they come as <tool_call> text or an endpoint's native calls.

Each test here fails on the code before issue 14's second pass: calculate("9**9**8") ran for minutes, a lone
surrogate echoed by a tool reached the tokenizer and raised, a slow tool held the round, and MessageAgent parsed
an endpoint's calls with its own code (a call without "function" raised KeyError out of rollout())."""

import random
import subprocess
import sys
import time

import pytest

import chat
from agents import MessageAgent
from conftest import REPO, needs_tau2
from domains import load_world
from models import train_tokenizer
from rollout import RolloutConfig, rollout, score
from tools import calculate, check_call, clean, parse_tool_calls
from user_sim import ScriptedUser


@pytest.fixture(scope="module")
def shop():
    return load_world("shop", seed=0, n_train=0, n_test=4)


# ---------------------------------------------------------------------------------------------------------------
# calculate: bounded by construction, tau2's answers below the bound


def test_runaway_power_is_an_error_at_once():
    # in a subprocess: on the old code this computes a 136M-bit integer for minutes, and the timeout fails the test
    code = "from tools import calculate\ntry:\n    calculate(None, '9**9**8')\nexcept OverflowError as e:\n    print(e)"
    t0 = time.time()
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "int too large to convert to float", r.stderr
    assert time.time() - t0 < 30


def test_calculate_matches_tau2_eval_on_random_expressions():
    # tau2's calculate is eval() after the whitelist; the tree walk must give the same text or the same error
    rng = random.Random(0)
    atoms = ["0", "1", "2", "7", "10", "0.5", "3.25", "99", "-4", "(2)", "()", "..."]
    ops = [" + ", " - ", " * ", " / ", " // ", " ** ", ""]
    bounded = 0
    for _ in range(3_000):
        expr = "".join(rng.choice(atoms) + rng.choice(ops) for _ in range(rng.randint(1, 5))) + rng.choice(atoms)
        expr = f"({expr})" if rng.random() < 0.2 else expr

        def run(f):
            try:
                return f()
            except Exception as e:  # noqa: BLE001 - the error text is what the agent sees
                return f"Error: {e}"

        got = run(lambda: calculate(None, expr))
        if got == "Error: int too large to convert to float":  # past the bound: eval would take minutes to agree
            bounded += 1
            continue
        assert got == run(lambda: str(round(float(eval(expr, {"__builtins__": None}, {})), 2))), expr
    assert bounded < 300  # nearly every expression is compared with eval


# ---------------------------------------------------------------------------------------------------------------
# Env.call: the time and size budget


def test_a_slow_tool_is_an_error_within_its_budget(shop, monkeypatch):
    def slow_tool(db, seconds: float) -> str:
        """A tool that takes its time.

        Args:
            seconds: how long.
        """
        end = time.time() + seconds
        while time.time() < end:
            pass
        return "finally"

    monkeypatch.setitem(shop.tools, "slow_tool", slow_tool)
    monkeypatch.setattr(shop, "tool_seconds", 0.3)
    env = shop.new_env()
    t0 = time.time()
    out = env.call("slow_tool", {"seconds": 3.0})
    assert time.time() - t0 < 2.0 and out == "Error: slow_tool did not answer within 0.3 seconds"
    assert env.calls[-1].error
    assert env.call("slow_tool", {"seconds": 0.0}) == "finally"  # within the budget: answered as usual


def test_oversized_arguments_and_outputs_are_bounded(shop, monkeypatch):
    def echo(db, text: str) -> str:
        """Say it back.

        Args:
            text: what to say.
        """
        return text * 3

    monkeypatch.setitem(shop.tools, "echo", echo)
    env = shop.new_env()
    assert env.call("echo", {"text": "x" * 200_000}).startswith("Error: arguments of echo too large")
    out = env.call("echo", {"text": "y" * 60_000})  # 180,000 characters back: cut, with a note
    assert len(out) < 100_100 and out.endswith("... [180000 characters]")
    deep = {"text": "a"}
    for _ in range(100_000):
        deep = {"text": deep}  # past what JSON can write back: refused, not a RecursionError
    assert env.call("echo", deep).startswith("Error: arguments of echo too large")


# ---------------------------------------------------------------------------------------------------------------
# Lone surrogates: escaped before they reach the tokenizer or a log


def test_clean_escapes_lone_surrogates_only():
    assert clean("caf\u00e9 \U0001f600") == "caf\u00e9 \U0001f600"  # valid text is unchanged
    assert clean("id \ud800!") == "id \\ud800!"
    assert clean(None) is None
    tok = train_tokenizer(["hello world"], 300)
    assert tok.decode(chat.encode(tok, "order \udfff")) == "order \\udfff"  # old: the encoder raised


@needs_tau2
def test_a_surrogate_echoed_by_an_airline_error_is_carried_as_text():
    world = load_world("airline")
    env = world.new_env()
    parsed = parse_tool_calls('<tool_call>{"name": "get_reservation_details", "arguments": '
                              '{"reservation_id": "\\ud800"}}</tool_call>', set(world.tools))
    out = env.call(parsed.calls[0]["name"], parsed.calls[0]["arguments"])
    assert "\\ud800" in out and out.encode("utf-8")  # old: the raw surrogate, which utf-8 cannot encode
    tok = train_tokenizer([world.rules[:2000]], 300)
    assert chat.delta_ids(tok, [{"role": "tool", "name": "x", "content": out}])


# ---------------------------------------------------------------------------------------------------------------
# One parser for every agent


def test_endpoint_calls_pass_the_same_parser(shop):
    hostile = [
        {"id": "1"},  # no "function" at all (old: KeyError out of rollout())
        {"function": {"arguments": "{}"}},  # no name
        {"function": {"name": "get_order", "arguments": "[" * 50_000 + "]" * 50_000}},  # nested past the stack
        {"function": {"name": "no_such_tool", "arguments": "{}"}},
        "not a dict",
    ]
    known = set(shop.tools)
    for call in hostile:  # each is a parse error, never a call or an exception
        assert isinstance(check_call(call.get("function") if isinstance(call, dict) else None, known), str)

    def make_act(task):
        turns = iter([{"content": "\ud800 checking", "tool_calls": hostile}])
        return lambda messages, tools: next(turns, {"content": "bye", "tool_calls": []})

    cfg = RolloutConfig(malformed="observe", max_turns=6)
    eps = score(rollout(shop.tasks("test")[:2], 1, {"shop": shop}, MessageAgent(make_act), ScriptedUser(), cfg),
                {"shop": shop})
    for e in eps:
        assert e.stop_reason != "agent_error" and e.messages[2]["malformed"]  # a parse error the agent saw
        assert e.messages[2]["content"] == "\\ud800 checking"
    # the same text through the <tool_call> path gives the same verdict
    text_verdict = parse_tool_calls('<tool_call>{"name": "no_such_tool", "arguments": {}}</tool_call>', known).errors
    assert text_verdict == [check_call({"name": "no_such_tool", "arguments": {}}, known)]
