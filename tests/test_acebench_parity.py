"""ACEBench Agent parity: every fixture recorded from ACEBench's own code (../shared/acebench/parity.jsonl; another
file with $ACEBENCH_PARITY) replays identically through our executor and through rollout.rollout().

Per fixture, two replays:
1. the executor alone: each agent message's route (multi-turn), decode, per-call outcome (found, where it ran, raised,
   its error text, its return), the observation the agent reads, the end state, the process list, every changed
   app attribute, the console, and ACEBench's verdict (end-to-end, process accuracy, error type and texts);
2. the whole conversation through rollout(): the fixture's agent messages from a scripted AceAgent (then "finish
   conversation"), the fixture's user lines from AceCustomer (benchmarks/acebench_customer.py: user_sim.LLMUser
   with ACEBench's prompt) over a stub client; then
   the transcript the agent last saw, the last two requests (agent and simulated user) byte for byte, and the score.
"""

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from benchmarks import acebench, acebench_agents
from benchmarks.acebench_apps import APPS

PARITY = Path(os.environ.get("ACEBENCH_PARITY") or acebench.DEFAULT_DIR / "parity.jsonl")
HAVE = PARITY.is_file() and (acebench.DEFAULT_DIR / "data" / "data_agent_multi_turn.json").is_file()
pytestmark = pytest.mark.skipif(not HAVE, reason=f"ACEBench fixtures not found at {PARITY} (../shared is absent)")
RECORDS = [json.loads(line) for line in PARITY.read_text().splitlines()] if HAVE else []


@pytest.fixture(scope="module")
def world():
    return acebench_agents.build_world()


def _task(world, rec):
    return next(t for t in world.tasks() if t.raw["task"]["id"] == rec["task_id"])


def _json(x):
    return json.loads(json.dumps(x, default=repr))


def _verdict(world, task, env):
    reward, info = world.score(task, env)
    out = {"end_to_end_accuracy": reward, "process_accuracy": round(info["process_accuracy"], 3)}
    return out | ({} if reward else {"error_type": info["error_type"], "errors": info["errors"]})


@pytest.mark.parametrize("rec", RECORDS, ids=[r["seq_id"] for r in RECORDS])
def test_executor_replays_the_fixture(world, rec):
    task = _task(world, rec)
    env = world.new_env(task)
    for i, step in enumerate(rec["steps"]):
        if rec["category"] == "multi_turn":
            assert acebench.routes_to_execution(step["message"]) == (step["recipient"] == "execution"), i
            if step["recipient"] != "execution":
                continue
        obs = env.execute(step["message"])
        assert str(obs) == str(step["observation"]) and _json(obs) == step["observation"], i
        mine = env.steps[-1]
        assert _json(mine["decoded"]) == step["decoded"] and mine["instance"] == step["result_instance_type"], i
        assert len(mine["calls"]) == len(step.get("calls") or []), i
        for got, want in zip(mine["calls"], step.get("calls") or []):
            keys = ["name", "arguments", "executed"] + (["found", "dispatched_to", "raised", "error"]
                                                          if want["executed"] else [])
            assert {k: _json(got.get(k)) for k in keys} == {k: want[k] for k in keys}, i
            if want["executed"] and "return_repr" not in want:
                assert _json(got.get("return")) == want["return"], i
    assert env.end_state() == rec["end_state"] and env.process == rec["process"]
    assert sorted(env.apps or []) == rec["instances_created"]
    changed = {}
    for name, app in (env.apps or {}).items():  # every app attribute that differs from a freshly loaded app
        fresh = APPS[name]()
        for cfg in (task.raw["task"]["initial_config"].get(name, {}), task.raw["task"]["initial_config"]["BaseApi"]
                    if "BaseApi" in task.raw["task"]["initial_config"] else {}):
            fresh._load_scenario(cfg)
        changed[name] = {k: _json(v) for k, v in vars(app).items()
                         if not k.startswith("_") and _json(v) != _json(vars(fresh).get(k))}
    assert changed == rec["state_changed"]
    assert ("".join(line + "\n" for line in env.console()) or None) == rec.get("stdout")
    assert _verdict(world, task, env) == rec["eval"]


class _StubUser:
    """client.chat.completions.create for LLMUser: the fixture's user lines in order; keeps the last request."""

    def __init__(self, lines):
        self.lines, self.last = list(lines), None
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self.create))

    def create(self, messages, **kwargs):
        self.last = json.loads(json.dumps(messages))
        assert kwargs["temperature"] == 0.001 and kwargs["top_p"] == 1 and kwargs["max_tokens"] == 1000
        return SimpleNamespace(choices=[SimpleNamespace(message=SimpleNamespace(content=self.lines.pop(0)))])


@pytest.mark.parametrize("rec", RECORDS, ids=[r["seq_id"] for r in RECORDS])
def test_the_conversation_replays_through_rollout(world, rec):
    from rollout import RolloutConfig, rollout, score
    from user_sim import make_user

    prompts = []

    def scripted(episodes, msgs):  # the fixture's agent messages, then ACEBench's end marker
        prompts.append(json.loads(json.dumps(msgs[0])))
        k = sum(m["role"] == "assistant" for m in episodes[0].messages)
        return [rec["steps"][k]["message"] if k < len(rec["steps"]) else acebench.FINISH]

    lines = [rec["user_first_message"]] + [s["user_reply"] for s in rec["steps"] if "user_reply" in s]
    stub = _StubUser(lines if rec["category"] == "multi_turn" else [])
    user = make_user("llm", model="acebench-user", base_url="http://127.0.0.1/v1", client=stub)
    task = _task(world, rec)
    ep = rollout([task], 1, {"acebench_agent": world}, acebench_agents.AceAgent(scripted), user,
                 RolloutConfig(max_turns=100))[0]
    loop = len(ep.messages) - 2  # ACEBench's loop messages (after the system prompt and the opening)
    assert ep.stop_reason == ("max_turns" if loop == acebench.MAX_MESSAGES else "finished")
    assert ep.env.process == rec["process"]
    if rec["category"] == "multi_turn":  # every executed message's result, and every user line, in order
        assert stub.lines == [] and [m["content"] for m in ep.messages if m["role"] == "user"] == lines
    assert world.history(task, ep.messages[1:-1]) == rec["agent_history"]
    if "agent_request_last" in rec:
        assert prompts[-1] == rec["agent_request_last"]
    if "user_request_last" in rec:
        assert stub.last == rec["user_request_last"]
    assert ep.env.end_state() == rec["end_state"]
    score([ep], {"acebench_agent": world})
    assert ep.reward == rec["eval"]["end_to_end_accuracy"]
    assert round(ep.info["process_accuracy"], 3) == rec["eval"]["process_accuracy"]
