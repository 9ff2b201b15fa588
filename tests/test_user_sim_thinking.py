"""A thinking customer never hands the agent its reasoning.

A Qwen3 customer thinks by default. Each request asks its template not to (chat_template_kwargs
enable_thinking false), except where the endpoint is OpenAI's own, which refuses fields it does not
know; a served customer gets its model's reasoning parser; and a reply left inside an open <think>,
or empty once a closed one is cut, is a failed request (retried, then the episode aborts), never a
message. The preflight says which of these it saw. Against tests/fake_openai.py's stand-in server.
"""

import json
from types import SimpleNamespace

import pytest

from config import Config
from fake_openai import FakeServer
from plumbing.chat_client import Garbage, reply_text, reply_turn, thinking_switch
from plumbing.flags import parse_config
from plumbing.preflight import PreflightError
from plumbing.serve import customer_settings, reasoning_parser, server_command
from user_sim import LLMUser, UserError

TASK = SimpleNamespace(id="demo/0", spec=None, domain="demo", instructions="You want a refund for the lamp.")
HISTORY = [{"role": "user", "content": "Hi, a refund please."}, {"role": "assistant", "content": "Which order?"}]


def customer(srv, **kw):
    return LLMUser("tiny", base_url=srv.url, api_key="EMPTY", max_retries=1, backoff=0.01, prompt="muarl", **kw)


def said(text):
    return SimpleNamespace(choices=[SimpleNamespace(message=SimpleNamespace(content=text, tool_calls=None))])


# --------------------------------------------------------------------------------------------------
# The request: thinking off, where the endpoint takes the switch


def test_every_request_asks_the_template_not_to_think():
    with FakeServer(thinking=True, reply="It's order #W1.") as srv:
        assert customer(srv).reply(TASK, HISTORY) == "It's order #W1."
    assert srv.requests[-1]["chat_template_kwargs"] == {"enable_thinking": False}


def test_user_thinking_sends_no_switch_and_a_reply_cut_while_thinking_fails():
    with FakeServer(thinking=True) as srv:
        with pytest.raises(UserError, match="opened <think> and never closed it"):
            customer(srv, thinking=True).reply(TASK, HISTORY)
    assert len(srv.requests) == 2  # retried once, then the episode aborts
    assert all("chat_template_kwargs" not in body for body in srv.requests)


def test_a_reply_the_reasoning_parser_emptied_fails():
    with FakeServer(thinking=True, reasoning_parser=True) as srv, pytest.raises(UserError, match="garbage"):
        customer(srv, thinking=True).reply(TASK, HISTORY)


def test_openais_own_api_is_sent_no_switch():
    # OpenAI answers HTTP 400 to a field it does not know; any other endpoint (vLLM drops names its
    # template does not use) gets the switch, unless --user_thinking asks for the model's default.
    assert thinking_switch("https://api.openai.com/v1") == {}
    assert thinking_switch("http://127.0.0.1:8000/v1") == {"extra_body": {"chat_template_kwargs":
                                                                          {"enable_thinking": False}}}
    assert thinking_switch("http://127.0.0.1:8000/v1", thinking=True) == {}


# --------------------------------------------------------------------------------------------------
# The reply: a closed block cut, an open one refused


@pytest.mark.parametrize("text", ["<think>I should ask.", "  <think>\nstill thinking about the lamp",
                                  "<think>hmm</think>\n\n  ", "reasoning opened by the prompt</think>\n"])
def test_a_reply_left_in_or_emptied_by_its_reasoning_is_garbage(text):
    with pytest.raises(Garbage):
        reply_text(said(text))


def test_a_closed_leading_block_is_cut_from_the_message():
    assert reply_text(said("<think>ask about the lamp</think>\n\nThe desk lamp.")) == "The desk lamp."
    assert reply_text(said("the prompt opened it</think>\nThe desk lamp.")) == "The desk lamp."
    assert reply_text(said("I said <think> once, oddly.</think> ok")) == "I said <think> once, oddly.</think> ok"
    with pytest.raises(Garbage):  # even a benchmark's verbatim reply is not an unfinished thought
        reply_text(said("<think>cut"), verbatim=True)
    # beside tool calls the text stays private to the customer: an unclosed block is just dropped
    call = SimpleNamespace(function=SimpleNamespace(name="check_status_bar", arguments="{}"))
    msg = SimpleNamespace(content="<think>which tool", tool_calls=[call])
    assert reply_turn(SimpleNamespace(choices=[SimpleNamespace(message=msg)])) == ("", [("check_status_bar", {})])


# --------------------------------------------------------------------------------------------------
# The preflight says what it saw


def test_the_preflight_reports_thinking_off(capsys):
    with FakeServer(thinking=True) as srv:
        customer(srv).check([TASK])
    line = capsys.readouterr().out
    assert "'thinking': 'off'" in line and "<think>" not in line


def test_the_preflight_reports_a_reply_that_opened_think(capsys):
    with FakeServer(thinking=True) as srv:
        customer(srv, thinking=True).check([TASK])
    line = capsys.readouterr().out
    assert "'thinking': \"the model's default\"" in line and "'reply': 'opened <think>'" in line


def test_the_preflight_reports_a_reasoning_parser(capsys):
    with FakeServer(thinking=True, reasoning_parser=True) as srv:
        customer(srv, thinking=True).check([TASK])
    assert "reasoning parser" in capsys.readouterr().out


def test_an_endpoint_refusing_the_switch_is_named_in_one_line():
    with FakeServer(strict=True) as srv, pytest.raises(PreflightError, match="--user_thinking true"):
        customer(srv).check([TASK])


# --------------------------------------------------------------------------------------------------
# The flag, and a served customer's reasoning parser


def test_the_flag_reaches_the_customer():
    assert customer_settings(Config())["thinking"] is False
    cfg = parse_config(["--user_thinking"], Config)
    assert cfg.user_thinking is True and customer_settings(cfg)["thinking"] is True


@pytest.mark.parametrize("model_type, parser", [("qwen3", "qwen3"), ("qwen3_moe", "qwen3"), ("llama", None)])
def test_a_served_thinking_model_gets_its_reasoning_parser(tmp_path, model_type, parser):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
    cmd = server_command(str(tmp_path), "customer", 8000, 4096)
    assert reasoning_parser(tmp_path) == parser
    assert (cmd[cmd.index("--reasoning-parser") + 1] if "--reasoning-parser" in cmd else None) == parser
    assert reasoning_parser(tmp_path / "absent") is None


def test_a_customer_model_trained_here_is_sent_no_switch_and_served_without_a_parser(tmp_path):
    # The CPU demo's customer (Qwen3-shaped, never thinking) learned from prompts with no switch: its
    # prompts stay those, and no parser reads its replies as reasoning.
    from demo import SHIPPED
    from plumbing.serve import ServedUser

    assert reasoning_parser(SHIPPED) is None and customer_settings(Config())["thinking"] is False
    served = ServedUser(SHIPPED, tmp_path, **customer_settings(Config()))
    assert served.llm_settings["thinking"] is True
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    assert ServedUser(tmp_path, tmp_path, **customer_settings(Config())).llm_settings["thinking"] is False
