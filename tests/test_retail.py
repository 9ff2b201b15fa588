"""The retail world as the trainer uses it: tasks, rewards, env isolation, tool schemas, bad calls.

  * every one of tau2's 114 retail tasks scores 1.0 when its gold actions are replayed;
  * dropping any gold write action that changes the final database makes the reward 0 (the reward really
    looks at the database, and the delta-based comparison agrees with the whole-DB hash);
  * envs are isolated from each other and the template file is never written;
  * the 17 tool schemas derived from the docstrings are complete and mark the right arguments required;
  * malformed calls come back as "Error: ..." observations, never as exceptions.
"""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, TAU2, needs_tau2

pytestmark = needs_tau2


@pytest.fixture(scope="module")
def world():
    from domains.retail import build_world

    return build_world(TAU2 / "data")


# ---------------------------------------------------------------------------------------------------------------
# A whole-DB fingerprint that is cheap enough to take 300 times: the sha256 of json.dumps(db, sort_keys=True),
# built from cached per-record texts of the template plus the rows an env wrote. test_fast_hash_is_db_hash pins
# it to env.db_hash() (~80 ms each, which is why it is not used directly for every removal).


@pytest.fixture(scope="module")
def base_texts(world):
    env = world.new_env()
    texts = {c: {rid: json.dumps(rec, sort_keys=True) for rid, rec in env.db.scan(c)} for c in world.collections}
    env.close()
    return texts


def fast_hash(base_texts, env) -> str:
    parts = []
    for coll in sorted(base_texts):
        recs = dict(base_texts[coll])
        recs.update({rid: json.dumps(json.loads(doc), sort_keys=True) for rid, doc in env.db.written(coll).items()})
        body = ", ".join(f"{json.dumps(rid)}: {recs[rid]}" for rid in sorted(recs))
        parts.append(f"{json.dumps(coll)}: {{{body}}}")
    return hashlib.sha256(("{" + ", ".join(parts) + "}").encode()).hexdigest()


# ---------------------------------------------------------------------------------------------------------------
# Tasks and rewards


def test_task_counts(world):
    assert len(world.tasks()) == 114
    assert len(world.tasks("train")) == 74
    assert len(world.tasks("test")) == 40


def test_every_gold_replay_scores_one(world):
    failed = []
    for task in world.tasks():
        env = world.replay(task.actions)
        reward, info = world.score(task, env)
        if reward != 1.0 or not info["db_match"]:
            failed.append((task.id, info["db_diff"]))
        env.close()
    assert not failed


def test_fast_hash_is_db_hash(world, base_texts):
    for task in world.tasks()[:6]:
        env = world.replay(task.actions)
        assert fast_hash(base_texts, env) == env.db_hash()
        env.close()


def _removal_cases(world, base_texts):
    """(task, index of a gold write action, does removing it change the final DB hash) for every write action."""
    from domains.retail import WRITE_TOOLS

    cases = []
    for task in world.tasks():
        env = world.replay(task.actions)
        gold_hash = fast_hash(base_texts, env)
        env.close()
        for i, a in enumerate(task.actions):
            if a["name"] in WRITE_TOOLS:
                env = world.replay(task.actions[:i] + task.actions[i + 1 :])
                cases.append((task, i, env, fast_hash(base_texts, env) != gold_hash))
    return cases


def test_dropping_a_gold_write_scores_zero(world, base_texts):
    cases = _removal_cases(world, base_texts)
    assert len(cases) == 176  # gold write actions in tau2's 114 retail tasks
    changed = 0
    for task, i, env, changes_db in cases:
        reward, info = world.score(task, env)
        if changes_db:
            changed += 1
            assert reward == 0.0 and not info["db_match"], f"{task.id}: dropping action {i} still scores 1"
        else:  # a gold write that fails on purpose (or changes nothing): dropping it must not cost the reward
            assert reward == 1.0, f"{task.id}: dropping no-op action {i} scored 0 ({info['db_diff']})"
        env.close()
    assert changed == 172  # the other 4 fail on purpose or are overwritten by a later gold call


@pytest.mark.slow
def test_dropping_a_gold_write_scores_zero_with_real_hash(world):
    """The same check with env.db_hash() itself deciding whether a removal changes the DB (~30 s)."""
    from domains.retail import WRITE_TOOLS

    for task in world.tasks():
        env = world.replay(task.actions)
        gold_hash = env.db_hash()
        env.close()
        for i, a in enumerate(task.actions):
            if a["name"] in WRITE_TOOLS:
                env = world.replay(task.actions[:i] + task.actions[i + 1 :])
                reward, _ = world.score(task, env)
                assert reward == (0.0 if env.db_hash() != gold_hash else 1.0), f"{task.id} without action {i}"
                env.close()


# ---------------------------------------------------------------------------------------------------------------
# Isolation and the read-only template


def test_envs_are_isolated(world):
    a, b = world.new_env(), world.new_env()
    before = b.call("get_order_details", {"order_id": "#W2611340"})
    out = a.call("modify_pending_order_address", {"order_id": "#W5918442", "address1": "1 Test St", "address2": "",
                                                  "city": "Austin", "state": "TX", "country": "USA", "zip": "78701"})
    assert not a.calls[-1].error, out
    assert json.loads(a.call("get_order_details", {"order_id": "#W5918442"}))["address"]["address1"] == "1 Test St"
    assert json.loads(b.call("get_order_details", {"order_id": "#W5918442"}))["address"]["address1"] != "1 Test St"
    assert b.call("get_order_details", {"order_id": "#W2611340"}) == before
    assert a.db.written("orders") and not b.db.written("orders")
    assert a.db_hash() != b.db_hash()
    a.close(), b.close()


def test_template_is_never_modified(world):
    import sqlite3

    path = Path(world.template_path)
    digest, mtime = hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns
    for task in world.tasks()[:20]:  # plenty of writes, through the tools
        world.replay(task.actions).close()
    env = world.new_env()
    with pytest.raises(sqlite3.Error):  # and a write aimed at the template directly is refused
        env.con.execute("UPDATE base.orders SET doc = '{}' WHERE id = '#W2611340'")
    with pytest.raises(sqlite3.Error):
        env.con.execute("DELETE FROM base.users")
    env.close()
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest
    assert path.stat().st_mtime_ns == mtime


# ---------------------------------------------------------------------------------------------------------------
# Tool schemas

REQUIRED = {
    "calculate": ["expression"],
    "cancel_pending_order": ["order_id", "reason"],
    "exchange_delivered_order_items": ["order_id", "item_ids", "new_item_ids", "payment_method_id"],
    "find_user_id_by_email": ["email"],
    "find_user_id_by_name_zip": ["first_name", "last_name", "zip"],
    "get_item_details": ["item_id"],
    "get_order_details": ["order_id"],
    "get_product_details": ["product_id"],
    "get_user_details": ["user_id"],
    "list_all_product_types": [],
    "modify_pending_order_address": ["order_id", "address1", "address2", "city", "state", "country", "zip"],
    "modify_pending_order_items": ["order_id", "item_ids", "new_item_ids", "payment_method_id"],
    "modify_pending_order_payment": ["order_id", "payment_method_id"],
    "modify_user_address": ["user_id", "address1", "address2", "city", "state", "country", "zip"],
    "return_delivered_order_items": ["order_id", "item_ids", "payment_method_id"],
    "transfer_to_human_agents": ["summary"],
    "think": ["thought"],
}


def test_tool_schemas(world):
    schemas = world.tool_schemas()
    assert len(schemas) == 17
    by_name = {s["function"]["name"]: s["function"] for s in schemas}
    assert set(by_name) == set(REQUIRED)
    for name, fn in by_name.items():
        assert fn["description"], name
        params = fn["parameters"]
        assert params["type"] == "object"
        assert params["required"] == REQUIRED[name], name
        assert list(params["properties"]) == REQUIRED[name], name  # no optional arguments anywhere
        for arg, prop in params["properties"].items():
            assert prop.get("description"), f"{name}.{arg} has no description"
    assert by_name["modify_pending_order_items"]["parameters"]["properties"]["item_ids"]["type"] == "array"
    assert by_name["modify_pending_order_items"]["parameters"]["properties"]["item_ids"]["items"] == {"type": "string"}
    assert by_name["find_user_id_by_name_zip"]["parameters"]["properties"]["zip"]["type"] == "string"
    assert "#W" in by_name["get_order_details"]["parameters"]["properties"]["order_id"]["description"]
    json.dumps(schemas)  # JSON-able, as chat templates need


# ---------------------------------------------------------------------------------------------------------------
# Bad calls become observations

BAD_CALLS = [
    ("get_order_details", {"order_id": 2611340}, "Error: Order not found"),
    ("get_order_details", {"order_id": ["#W2611340"]}, "Error: unhashable type: 'list'"),
    ("get_order_details", {}, "Error: bad arguments for get_order_details: missing order_id"),
    ("get_order_details", {"order_id": "#W2611340", "verbose": True}, "Error: bad arguments"),
    ("no_such_tool", {}, "Error: Tool 'no_such_tool' not found."),
    ("get_order_details", ["#W2611340"], "Error: arguments of get_order_details must be a JSON object"),
    ("get_order_details", "#W2611340", "Error: arguments of get_order_details must be a JSON object"),
    ("find_user_id_by_email", {"email": 5}, "Error: 'int' object has no attribute 'lower'"),
    ("find_user_id_by_name_zip", {"first_name": "Yusuf", "last_name": "Rossi", "zip": 19122}, "Error: User not found"),
    ("get_item_details", {"item_id": 1008292230}, "Error: Item not found"),
    ("cancel_pending_order", {"order_id": "#W5918442", "reason": ["no longer needed"]}, "Error: unhashable type"),
    ("return_delivered_order_items", {"order_id": "#W2378156", "item_ids": "1151293680",
                                      "payment_method_id": "credit_card_9513926"}, "Error: item_ids must be a list"),
    ("modify_pending_order_items", {"order_id": "#W5918442", "item_ids": None, "new_item_ids": [],
                                    "payment_method_id": "x"}, "Error: item_ids must be a list"),
    ("modify_user_address", {"user_id": "yusuf_rossi_9620", "address1": "1 Main St", "address2": "", "city": "A",
                             "state": "TX", "country": "USA", "zip": 78701},
     "Error: 1 validation error for UserAddress\nzip\n  Input should be a valid string"),
]


@pytest.mark.parametrize("name,arguments,prefix", BAD_CALLS, ids=[f"{i}-{c[0]}" for i, c in enumerate(BAD_CALLS)])
def test_bad_calls_are_error_strings(world, name, arguments, prefix):
    env = world.new_env()
    out = env.call(name, arguments)
    assert out.startswith(prefix), out
    assert env.calls[-1].error
    assert not env.db.written("orders") and not env.db.written("users")  # a refused call writes nothing
    env.close()


# ---------------------------------------------------------------------------------------------------------------
# The demo entry point


def test_module_demo_replays_a_task():
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-m", "domains.retail", "--task", "5"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "retail/5" in out.stdout and "reward = 1.0" in out.stdout
