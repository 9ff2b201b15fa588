"""The telecom world as the trainer uses it: tasks and splits, tau2's scoring, the oracle, isolation, bad calls.

  * tau2's 114 base tasks, split 74 train / 40 test (split_tasks.json), each gold action keeping its requestor;
  * replaying a task's gold actions on both sides (World.replay, user actions with requestor="user") scores 1 on
    every task, and the oracle agent scores 1 on the test split through the rollout loop eval.py uses;
  * dropping any gold write action that changes the final state (either database) scores 0, and dropping the
    transfer of a transfer task scores 0 (its action check); a conversation that ran out of turns scores 0;
  * info["completion"] is the share of assertions met (partial credit when one fix is missing);
  * a fresh env with its task's initialisation is fast, isolated, and leaves the template untouched;
  * bad calls come back as tau2's error texts, never as exceptions; both toolkits have complete schemas.
"""

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, TAU2

pytestmark = pytest.mark.skipif(not (TAU2 / "data" / "domains" / "telecom" / "db.toml").is_file(),
                                reason=f"tau2 telecom data not found under {TAU2} (../shared is absent)")


@pytest.fixture(scope="module")
def world():
    from domains.telecom import build_world

    return build_world(TAU2 / "data")


def _final(world, task, actions):
    """Replay actions on a fresh env in the task's initial state; (env, both hashes after tau2's closing sync)."""
    from domains.telecom import agent_db_hash, sync, user_db_hash

    env = world.replay(actions, world.new_env(task))
    sync(env.db)
    return env, (agent_db_hash(env), user_db_hash(env))


# ---------------------------------------------------------------------------------------------------------------
# Tasks and splits


def test_task_counts_and_splits(world):
    tasks = world.tasks()
    assert len(tasks) == 114
    train, test = world.tasks("train"), world.tasks("test")
    assert (len(train), len(test)) == (74, 40)
    assert not {t.id for t in train} & {t.id for t in test}
    split = json.loads((TAU2 / "data" / "domains" / "telecom" / "split_tasks.json").read_text())
    assert {t.id for t in test} == {f"telecom/{i}" for i in split["test"]}
    actions = [a for t in tasks for a in t.actions]
    assert len(actions) == 516
    assert sum(a["requestor"] == "user" for a in actions) == 393  # TELECOM.md section 8
    transfer = [t for t in tasks if "ACTION" in t.raw["evaluation_criteria"]["reward_basis"]]
    assert len(transfer) == 20 and all(t.actions[0]["compare_args"] == [] for t in transfer)


def test_every_gold_replay_scores_one(world):
    for task in world.tasks():
        env, _ = _final(world, task, task.actions)
        assert any(c.requestor == "user" for c in env.calls) or task.actions[0]["requestor"] == "assistant"
        reward, info = world.score(task, env, stop_reason="user_stop")
        assert reward == 1.0 and info["completion"] == 1.0, (task.id, info)
        env.close()


def test_oracle_through_the_rollout_loop(world):
    from evaluation.agents import MessageAgent, OracleAgent
    from user_sim import FixedUser
    from eval import evaluate
    from rollout import RolloutConfig

    metrics, episodes = evaluate(world.tasks("test"), {"telecom": world}, MessageAgent(OracleAgent), FixedUser(),
                                 RolloutConfig(max_turns=30), progress=False)
    assert metrics["pass^1"] == 1.0 and metrics["completion"] == {"telecom": 1.0}
    assert {e.stop_reason for e in episodes} == {"user_stop", "transfer"}
    assert all(e.reward == 1.0 for e in episodes)


def test_dropping_a_gold_write_scores_zero(world):
    from domains.phone import USER_WRITE_TOOLS
    from domains.telecom import WRITE_TOOLS

    writes, changed = 0, 0
    for task in world.tasks():
        gold_env, gold = _final(world, task, task.actions)
        gold_env.close()
        for i, a in enumerate(task.actions):
            if a["name"] not in WRITE_TOOLS | USER_WRITE_TOOLS:
                continue
            writes += 1
            env, state = _final(world, task, task.actions[:i] + task.actions[i + 1:])
            reward, info = world.score(task, env, stop_reason="user_stop")
            if state != gold:
                changed += 1
                assert reward == 0.0, f"{task.id}: dropping action {i} ({a['name']}) still scores 1"
                assert info["completion"] < 1.0 or "ACTION" in info["reward_basis"]
            else:  # a gold write that leaves the final state as it is: dropping it must not cost the reward
                assert reward == 1.0, f"{task.id}: dropping no-op action {i} scored 0"
            env.close()
    assert (writes, changed) == (496, 489)  # the other 7 are undone or made moot by a later gold action


def test_transfer_tasks_need_the_transfer(world):
    for task in [t for t in world.tasks() if "ACTION" in t.raw["evaluation_criteria"]["reward_basis"]]:
        env = world.new_env(task)
        reward, info = world.score(task, env, stop_reason="user_stop")  # the assertion holds, no transfer was made
        assert reward == 0.0 and info["env_assertions_met"] == [True] and info["action_matches"] == [False]
        env.call("transfer_to_human_agents", {"summary": "anything"})  # compare_args [] : any summary matches
        assert world.score(task, env, stop_reason="transfer")[0] == 1.0
        env.close()


def test_the_ending_counts(world):
    task = world.tasks("test")[0]
    env, _ = _final(world, task, task.actions)
    assert world.score(task, env, stop_reason="user_stop")[0] == 1.0
    reward, info = world.score(task, env, stop_reason="max_turns")
    assert reward == 0.0 and info["completion"] == 1.0 and not info["stop_ok"]
    env.close()


def test_completion_is_partial_credit(world):
    task = world.task("telecom/[mobile_data_issue]data_mode_off|data_usage_exceeded[PERSONA:None]")
    env, _ = _final(world, task, [a for a in task.actions if a["name"] != "refuel_data"])
    reward, info = world.score(task, env, stop_reason="user_stop")
    assert reward == 0.0 and info["env_assertions_met"] == [False, False, False] and info["completion"] == 0.0
    env.close()
    env, _ = _final(world, task, [a for a in task.actions if a["name"] != "toggle_data"])
    reward, info = world.score(task, env, stop_reason="user_stop")  # refuelled, but data stays off
    assert reward == 0.0 and info["env_assertions_met"] == [False, False, True]
    assert info["completion"] == pytest.approx(1 / 3)
    env.close()


# ---------------------------------------------------------------------------------------------------------------
# Environments: initialisation time, isolation, the template


def test_initialisation_is_fast_and_matches_the_slow_path(world):
    from domains.telecom import agent_db_hash, init_actions, user_db_hash

    tasks = world.tasks()
    for task in tasks:  # the cached copy equals running the initialisation functions themselves
        fast, slow = world.new_env(task), world.new_env()
        init_actions(slow, task.raw["initial_state"]["initialization_actions"])
        assert (agent_db_hash(fast), user_db_hash(fast)) == (agent_db_hash(slow), user_db_hash(slow)), task.id
        fast.close(), slow.close()
    t0 = time.perf_counter()
    for _ in range(3):
        for task in tasks:
            world.new_env(task).close()
    per_env_ms = 1000 * (time.perf_counter() - t0) / (3 * len(tasks))
    assert per_env_ms < 20, per_env_ms  # ~0.5 ms here; a loose bound, the machine is shared


def test_envs_are_isolated_and_the_template_is_read_only(world):
    import sqlite3

    path = Path(world.template_path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    task = world.tasks()[0]
    a, b = world.new_env(task), world.new_env(task)
    before = b.call("check_network_status", {}, requestor="user")
    a.call("toggle_airplane_mode", {}, requestor="user")
    a.call("refuel_data", {"customer_id": "C1001", "line_id": "L1002", "gb_amount": 2.0})
    assert a.call("check_network_status", {}, requestor="user") != before
    assert b.call("check_network_status", {}, requestor="user") == before
    assert json.loads(b.call("get_data_usage", {"customer_id": "C1001", "line_id": "L1002"}))["data_refueling_gb"] == "0.0"
    with pytest.raises(sqlite3.Error):
        a.con.execute("UPDATE base.phone SET doc = '{}'")
    a.close(), b.close()
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest


def test_sync_moves_facts_and_payments(world):
    from domains.telecom import init_actions

    env = world.new_env()  # only the overdue bill and the suspended line, as the payment tasks set them up
    init_actions(env, [{"env_type": "user", "func_name": "set_user_info",
                        "arguments": {"name": "John Smith", "phone_number": "555-123-2002"}},
                       {"env_type": "assistant", "func_name": "suspend_line_for_overdue_bill",
                        "arguments": {"customer_id": "C1001", "line_id": "L1002", "new_bill_id": "B1234321",
                                      "contract_ended": False}},
                       {"env_type": "user", "func_name": "simulate_network_search", "arguments": {}}])
    assert "No payment request" in env.call("check_payment_request", {}, requestor="user")
    assert env.call("send_payment_request", {"customer_id": "C1001", "bill_id": "B1234321"}).startswith("Payment")
    assert env.call("check_payment_request", {}, requestor="user") == \
        "You have a payment request for bill B1234321 of 65.0 USD."
    env.call("make_payment", {}, requestor="user")
    assert json.loads(env.call("get_details_by_id", {"id": "B1234321"}))["status"] == "Paid"
    assert "Suspended" in env.call("get_details_by_id", {"id": "L1002"})
    env.call("resume_line", {"customer_id": "C1001", "line_id": "L1002"})
    assert "No Signal" in env.call("check_status_bar", {}, requestor="user")  # the phone sees it at the next search
    assert "Excellent" in env.call("reboot_device", {}, requestor="user")
    env.close()


# ---------------------------------------------------------------------------------------------------------------
# Bad calls and schemas

BAD_CALLS = [
    ("assistant", "toggle_data", {}, "Error: Tool 'toggle_data' not found."),  # the other side's tool
    ("user", "refuel_data", {}, "Error: Tool 'refuel_data' not found."),
    ("user", "break_vpn", {}, "Error: Tool 'break_vpn' not found."),  # an initialisation helper is no tool
    ("assistant", "refuel_data", {"customer_id": "C1001", "line_id": "L1002"},
     "Error: TelecomTools.refuel_data() missing 1 required positional argument: 'gb_amount'"),
    ("user", "toggle_data", {"on": True}, "Error: TelecomUserTools.toggle_data() got an unexpected keyword argument 'on'"),
    ("assistant", "refuel_data", {"customer_id": "C1001", "line_id": "L1002", "gb_amount": "2"},
     "Error: '<=' not supported between instances of 'str' and 'int'"),
    ("assistant", "get_details_by_id", {"id": 1001}, "Error: 'int' object has no attribute 'startswith'"),
    ("assistant", "get_bills_for_customer", {"customer_id": "C1001", "limit": "3"},
     "Error: slice indices must be integers or None or have an __index__ method"),
    ("user", "set_network_mode_preference", {"mode": 4}, "Error: 'int' object has no attribute 'value'"),
    ("user", "grant_app_permission", {"app_name": ["messaging"], "permission": "sms"}, "Error: unhashable type: 'list'"),
    ("user", "set_apn_settings", {"apn_settings": {"apn_name": "Internet"}},
     "Error: 1 validation error for APNSettings\napn_name\n  Input should be 'internet' or 'broken' [type=enum"),
    ("user", "toggle_data", ["x"], "Error: arguments of toggle_data must be a JSON object"),
]


@pytest.mark.parametrize("side,name,arguments,prefix", BAD_CALLS, ids=[f"{i}-{c[1]}" for i, c in enumerate(BAD_CALLS)])
def test_bad_calls_are_error_strings(world, side, name, arguments, prefix):
    env = world.new_env(world.tasks()[0])
    out = env.call(name, arguments, requestor=side)
    assert out.startswith(prefix), out
    assert env.calls[-1].error and env.calls[-1].requestor == side
    env.close()


def test_tool_schemas(world):
    agent, user = world.tool_schemas(), world.user_tool_schemas()
    assert len(agent) == 13 and len(user) == 30
    by_name = {s["function"]["name"]: s["function"] for s in agent + user}
    for name, fn in by_name.items():
        assert fn["description"], name
        for arg, prop in fn["parameters"]["properties"].items():
            assert prop.get("description"), f"{name}.{arg} has no description"
    assert by_name["refuel_data"]["parameters"]["required"] == ["customer_id", "line_id", "gb_amount"]
    assert by_name["get_bills_for_customer"]["parameters"]["required"] == ["customer_id"]
    assert by_name["grant_app_permission"]["parameters"]["required"] == ["app_name", "permission"]
    assert by_name["toggle_airplane_mode"]["parameters"]["properties"] == {}
    json.dumps(agent + user)


def test_registered_and_module_demo_runs():
    from domains import DOMAINS

    assert "telecom" in DOMAINS
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-m", "domains.telecom"], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert "reward = 1.0" in out.stdout and "fresh env + task initialisation" in out.stdout


def test_a_failing_sync_turns_the_call_into_an_error(world):
    # tau2 runs sync_tools inside the same try as the tool: if it raises, the caller gets its error instead of the
    # tool's output (and the tool's change stays). Only a phone number with no line can make it raise.
    env = world.new_env()
    sur = env.db.get("phone", "surroundings")
    env.db.put("phone", "surroundings", sur | {"phone_number": "555-000-0000"})
    out = env.call("toggle_data", {}, requestor="user")
    assert out == "Error: Line with phone number 555-000-0000 not found" and env.calls[-1].error
    assert env.db.get("phone", "device")["data_enabled"] is False
    env.close()
