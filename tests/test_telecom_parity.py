"""Differential test: our telecom domain (both sides) against tau2-bench's own, call by call and byte by byte.

../shared/tau2/parity/telecom.jsonl holds 414 sequences (114 tasks' gold actions on both sides + 300 seeded random
ones; 5,224 calls, 3,766 by the user and 1,458 by the agent) recorded by running tau2's TelecomEnvironment. For each
sequence, on a fresh env:

  1. the initialisation (the task's, through World.new_env(task) and its per-task cache, or the recorded
     init_actions) gives tau2's two initial hashes;
  2. every call, on its requestor's side, gives the recorded output string and error flag (bill ids that tau2 drew
     at random are handed out from the record, env.db.new_bill_ids);
  3. every changed record of the agent's database equals tau2's, no other record differs from the base, the phone's
     device and surroundings equal tau2's, and both databases hash as tau2's do;
  4. the task's env assertions and the six probes return what tau2's returned;
  5. for the 114 gold sequences, world.score on the replayed conversation gives tau2's evaluation (reward, its
     breakdown, each assertion, each action match, db_match and the evaluator's reference hashes).
"""

import json

import pytest

from conftest import TAU2

FIXTURES = TAU2 / "parity" / "telecom.jsonl"
pytestmark = pytest.mark.skipif(not FIXTURES.is_file(), reason=f"{FIXTURES} not found (../shared is absent)")
BASE_HASHES = ("304cf5ef059852e117ea801ab9a5efc24c9713ec887679dc2e30acceb4b6742d",
               "e1f3a8637388808221228ff3f87294444e6b64caf721f5eb243a85d0a9380b28")
PROBES = [("user", "assert_service_status", {"expected_status": "connected"}),
          ("user", "assert_mobile_data_status", {"expected_status": True}),
          ("user", "assert_internet_speed", {"expected_speed": 200, "expected_desc": "excellent"}),
          ("user", "assert_can_send_mms", {"expected_status": True}),
          ("assistant", "assert_data_refueling_amount", {"customer_id": "C1001", "line_id": "L1002",
                                                         "expected_amount": 2.0}),
          ("assistant", "assert_no_overdue_bill", {"overdue_bill_id": "B1234321"})]


def _load():
    if not FIXTURES.is_file():
        return []
    return [json.loads(line) for line in FIXTURES.read_text(encoding="utf-8").splitlines() if line.strip()]


SEQUENCES = _load()


def _canon(rec) -> str:
    return json.dumps(rec, sort_keys=True)


@pytest.fixture(scope="module")
def world():
    from domains.telecom import build_world

    return build_world(TAU2 / "data")


@pytest.fixture(scope="module")
def base(world):
    env = world.new_env()
    recs = {c: {rid: _canon(rec) for rid, rec in env.db.scan(c)} for c in world.collections}
    env.close()
    return recs


def _start(world, seq):
    """A fresh env in the sequence's starting state: the task's own initialisation, or the recorded actions."""
    from domains.telecom import init_actions

    if seq["init"] == "task":
        env = world.new_env(world.task(f"telecom/{seq['task_id']}"))
    else:
        env = world.new_env()
        init_actions(env, seq["init_actions"])
    env.db.new_bill_ids = list(seq["new_bill_ids"])
    return env


def _run_calls(env, seq, problems):
    for i, c in enumerate(seq["calls"]):
        out = env.call(c["name"], json.loads(json.dumps(c["arguments"])), requestor=c["requestor"])
        err = env.calls[-1].error
        if out != c["output"] or err != c["error"]:
            problems.append(f"call {i} [{c['requestor']}] {c['name']}({c['arguments']}):\n  got      {err} {out!r}\n"
                            f"  expected {c['error']} {c['output']!r}")


def test_fixture_file_is_complete():
    assert len(SEQUENCES) == 414
    assert sum(len(s["calls"]) for s in SEQUENCES) == 5224
    assert sum(s["source"].startswith("gold:") for s in SEQUENCES) == 114


def test_base_hashes(world):
    from domains.telecom import agent_db_hash, user_db_hash

    env = world.new_env()
    assert (agent_db_hash(env), user_db_hash(env)) == BASE_HASHES
    env.close()


@pytest.mark.parametrize("seq", SEQUENCES, ids=[s["seq_id"] for s in SEQUENCES])
def test_sequence(world, base, seq):
    from domains.telecom import agent_db_hash, run_function, user_db_hash

    env, problems = _start(world, seq), []
    if (agent_db_hash(env), user_db_hash(env)) != (seq["init_db_sha256"], seq["init_user_db_sha256"]):
        problems.append("initial hashes differ")
    _run_calls(env, seq, problems)
    for coll, recs in seq["changed"]["agent"].items():  # changed records are tau2's, the others the base's
        for rid, expected in recs.items():
            raw = env.db.raw(coll, rid)
            if raw is None or _canon(json.loads(raw)) != _canon(expected):
                problems.append(f"{coll}/{rid}:\n  got      {raw}\n  expected {_canon(expected)}")
        for rid, doc in env.db.written(coll).items():
            if rid not in recs and _canon(json.loads(doc)) != base[coll].get(rid):
                problems.append(f"{coll}/{rid} changed but tau2 left it as in the base DB")
    for rid in ("device", "surroundings"):
        expected = seq["changed"]["user"].get(rid)
        mine = _canon(env.db.get("phone", rid))
        if mine != (base["phone"][rid] if expected is None else _canon(expected)):
            problems.append(f"phone/{rid}:\n  got      {mine}\n  expected {expected}")
    if (agent_db_hash(env), user_db_hash(env)) != (seq["db_sha256"], seq["user_db_sha256"]):
        problems.append("final hashes differ")
    for a in seq.get("env_assertions") or []:
        try:
            met = run_function(env, a["env_type"], a["func_name"], a["arguments"]) == a["assert_value"]
        except Exception as e:  # noqa: BLE001
            met = f"Error: {e}"
        if met != a["met"]:
            problems.append(f"assertion {a['func_name']}: got {met}, expected {a['met']}")
    for (side, name, args), expected in zip(PROBES, seq["probes"]):
        try:
            got = run_function(env, side, name, args)
        except Exception as e:  # noqa: BLE001
            got = f"Error: {e}"
        if got != expected:
            problems.append(f"probe {name}: got {got}, expected {expected}")
    env.close()
    if seq.get("evaluation"):
        _check_evaluation(world, seq, problems)
    assert not problems, f"{seq['seq_id']}:\n" + "\n".join(problems[:10])


def _check_evaluation(world, seq, problems):
    from domains.telecom import agent_db_hash, user_db_hash

    task = world.task(f"telecom/{seq['task_id']}")
    env = _start(world, seq)
    _run_calls(env, seq, problems)
    reward, info = world.score(task, env, stop_reason="user_stop")
    ev = seq["evaluation"]
    got = dict(reward=reward, reward_basis=info["reward_basis"], reward_breakdown=info["reward_breakdown"],
               env_assertions_met=info["env_assertions_met"], action_matches=info["action_matches"],
               db_match=info["db_match"])
    want = {k: ev[k] for k in got}
    if got != want:
        problems.append(f"evaluation:\n  got      {got}\n  expected {want}")
    gold = world.gold_env(task)
    if (agent_db_hash(gold), user_db_hash(gold)) != (ev["gold_db_sha256"], ev["gold_user_db_sha256"]):
        problems.append("the evaluator's reference hashes differ")
    gold.close()
    env.close()


def test_every_tool_is_exercised(world):
    called = {(c["requestor"], c["name"]) for s in SEQUENCES for c in s["calls"] if not c["error"]}
    assert {n for side, n in called if side == "assistant"} >= set(world.tools)
    assert {n for side, n in called if side == "user"} >= set(world.user_tools)
    assert len(world.tools) == 13 and len(world.user_tools) == 30
