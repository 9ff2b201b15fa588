"""The airline world as a reward: gold replays score 1, dropping a gold write scores 0, envs stay apart.

Also: the template file is never written, the 15 tool schemas are well-formed, and bad arguments of every kind
come back as "Error: ..." observations with the database untouched.
"""

import hashlib
import json
import subprocess
import sys

import pytest

from conftest import REPO, TAU2, needs_tau2

pytestmark = needs_tau2

BASE_SHA = "124e39a664b56402bcd09cb8a6a9cece6acb8462337c969799d5658e3250f263"


@pytest.fixture(scope="module")
def world():
    from domains import airline

    return airline.build_world(TAU2 / "data")


def _file_sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---------------------------------------------------------------------------------------------------------------
# Tasks and reward


def test_task_set(world):
    tasks = world.tasks()
    assert len(tasks) == 50
    assert len(world.tasks("train")) == 30 and len(world.tasks("test")) == 20
    assert all(t.id.startswith("airline/") and t.instructions for t in tasks)
    known = set(world.tools)
    assert {a["name"] for t in tasks for a in t.actions} <= known


def test_every_gold_replay_scores_one(world):
    for task in world.tasks():
        env = world.replay(task.actions)
        reward, info = world.score(task, env)
        assert reward == 1.0, (task.id, info)
        assert info["db_match"] and info["calls"] == len(task.actions)
        env.close()


def test_dropping_a_gold_write_scores_zero(world):
    from domains.airline import WRITE_TOOLS

    checked = 0
    for task in world.tasks():
        writes = [i for i, a in enumerate(task.actions) if a["name"] in WRITE_TOOLS]
        if not writes:
            continue
        full = world.replay(task.actions)
        full_hash = full.db_hash()
        full.close()
        for i in writes:
            env = world.replay(task.actions[:i] + task.actions[i + 1 :])
            if env.db_hash() != full_hash:  # the write mattered (some gold writes fail on purpose)
                reward, info = world.score(task, env)
                assert reward == 0.0 and info["db_diff"], (task.id, i, task.actions[i]["name"])
                checked += 1
            env.close()
    assert checked == 49  # 49 gold writes in 26 tasks, and each of them changes the final DB


def test_outputs_check_is_optional(world):
    task = next(t for t in world.tasks() if t.outputs)
    env = world.replay(task.actions)
    assert world.score(task, env)[0] == 1.0  # MUA-RL's DB-only reward
    assert world.score(task, env, messages=[], check_outputs=True)[0] == 0.0
    said = [{"role": "assistant", "content": " and ".join(task.outputs)}]
    assert world.score(task, env, messages=said, check_outputs=True)[0] == 1.0


# ---------------------------------------------------------------------------------------------------------------
# Isolation and the template


def test_envs_are_isolated_and_template_untouched(world):
    before = _file_sha(world.template_path)
    a, b = world.new_env(), world.new_env()
    out = a.call("cancel_reservation", {"reservation_id": "4WQ150"})
    assert json.loads(out)["status"] == "cancelled"
    a.call("send_certificate", {"user_id": "mia_li_3668", "amount": 100})
    assert json.loads(b.call("get_reservation_details", {"reservation_id": "4WQ150"}))["status"] is None
    user_b = json.loads(b.call("get_user_details", {"user_id": "mia_li_3668"}))
    assert "certificate_3221322" not in user_b["payment_methods"]
    assert a.db_hash() != BASE_SHA and b.db_hash() == BASE_SHA
    a.close()
    assert world.new_env().db_hash() == BASE_SHA
    assert _file_sha(world.template_path) == before


def test_booking_updates_seats_user_and_ids(world):
    env = world.new_env()
    args = {
        "user_id": "mia_li_3668", "origin": "PHL", "destination": "LGA", "flight_type": "one_way", "cabin": "economy",
        "flights": [{"flight_number": "HAT001", "date": "2024-05-20"}],
        "passengers": [{"first_name": "Mia", "last_name": "Li", "dob": "1990-04-05"}],
        "payment_methods": [], "total_baggages": 0, "nonfree_baggages": 0, "insurance": "no",
    }  # fmt: skip
    day = env.db.get("flights", "HAT001")["dates"]["2024-05-20"]
    price, seats = day["prices"]["economy"], day["available_seats"]["economy"]
    out = env.call("book_reservation", args)
    assert out == f"Error: Payment amount does not add up, total price is {price}, but paid 0"
    args["payment_methods"] = [{"payment_id": "credit_card_4421486", "amount": float(price)}]  # 146.0 -> 146
    ids = [json.loads(env.call("book_reservation", args))["reservation_id"] for _ in range(3)]
    assert ids == ["HATHAT", "HATHAU", "HATHAV"]
    assert env.call("book_reservation", args) == "Error: Too many reservations"
    assert env.db.get("flights", "HAT001")["dates"]["2024-05-20"]["available_seats"]["economy"] == seats - 3
    res = env.db.get("reservations", "HATHAT")
    assert res["payment_history"] == [{"payment_id": "credit_card_4421486", "amount": price}]
    assert isinstance(res["payment_history"][0]["amount"], int) and res["created_at"] == "2024-05-15T15:00:00"
    assert env.db.get("users", "mia_li_3668")["reservations"][-3:] == ids


# ---------------------------------------------------------------------------------------------------------------
# Schemas and bad arguments


def test_tool_schemas(world):
    from domains.airline import WRITE_TOOLS

    schemas = world.tool_schemas()
    names = [s["function"]["name"] for s in schemas]
    assert len(schemas) == 15 and len(set(names)) == 15
    assert {"think", "calculate", "transfer_to_human_agents"} <= set(names) and WRITE_TOOLS <= set(names)
    json.dumps(schemas)

    def check(prop, where):
        assert "type" in prop, where
        if prop["type"] == "array":
            check(prop["items"], where + "[]")
        if prop["type"] == "object" and "properties" in prop:
            assert set(prop["required"]) <= set(prop["properties"]), where
            for k, sub in prop["properties"].items():
                assert sub.get("description"), f"{where}.{k}"
                check(sub, f"{where}.{k}")

    for s in schemas:
        fn = s["function"]
        assert s["type"] == "function" and fn["description"], fn["name"]
        params = fn["parameters"]
        assert params["type"] == "object" and set(params["required"]) <= set(params["properties"])
        for k, prop in params["properties"].items():
            assert prop.get("description"), f"{fn['name']}.{k} lacks a description"
            check(prop, f"{fn['name']}.{k}")
    book = next(s for s in schemas if s["function"]["name"] == "book_reservation")["function"]["parameters"]
    assert book["properties"]["cabin"]["enum"] == ["business", "economy", "basic_economy"]
    assert book["properties"]["payment_methods"]["items"]["properties"]["amount"]["type"] == "integer"
    assert len(book["required"]) == 11


BAD_CALLS = [
    ("no_such_tool", {}),
    ("get_user_details", ["mia_li_3668"]),
    ("get_user_details", {}),
    ("get_user_details", {"user_id": "mia_li_3668", "extra": 1}),
    ("get_user_details", {"user_id": 42}),
    ("get_user_details", {"user_id": ["mia_li_3668"]}),
    ("get_reservation_details", {"reservation_id": None}),
    ("get_flight_status", {"flight_number": "HAT001", "date": ["2024-05-01"]}),
    ("search_onestop_flight", {"origin": "JFK", "destination": "LAX", "date": {"d": 1}}),
    ("calculate", {"expression": 7}),
    ("book_reservation", {"user_id": "mia_li_3668"}),
    ("book_reservation", {
        "user_id": "mia_li_3668", "origin": "PHL", "destination": "LGA", "flight_type": "one_way", "cabin": "economy",
        "flights": "HAT001", "passengers": [], "payment_methods": [], "total_baggages": 0, "nonfree_baggages": 0,
        "insurance": "no"}),
    ("book_reservation", {
        "user_id": "mia_li_3668", "origin": "PHL", "destination": "LGA", "flight_type": "one_way", "cabin": "economy",
        "flights": [{"flight_number": "HAT001", "date": "2024-05-20"}], "passengers": [{"first_name": "Mia"}],
        "payment_methods": [], "total_baggages": 0, "nonfree_baggages": 0, "insurance": "no"}),
    ("book_reservation", {
        "user_id": "mia_li_3668", "origin": "PHL", "destination": "LGA", "flight_type": "one_way", "cabin": "first",
        "flights": [{"flight_number": "HAT001", "date": "2024-05-20"}],
        "passengers": [{"first_name": "Mia", "last_name": "Li", "dob": "1990-04-05"}],
        "payment_methods": [{"payment_id": "credit_card_4421486", "amount": 100.5}], "total_baggages": 0,
        "nonfree_baggages": 0, "insurance": "no"}),
    ("book_reservation", {
        "user_id": "mia_li_3668", "origin": "PHL", "destination": "LGA", "flight_type": "one_way", "cabin": "first",
        "flights": [{"flight_number": "HAT001", "date": "2024-05-20"}],
        "passengers": [{"first_name": "Mia", "last_name": "Li", "dob": "1990-04-05"}],
        "payment_methods": [], "total_baggages": 0, "nonfree_baggages": 0, "insurance": "no"}),
    ("book_reservation", {
        "user_id": "mia_li_3668", "origin": "PHL", "destination": "LGA", "flight_type": "one_way", "cabin": "economy",
        "flights": [{"flight_number": "HAT001", "date": "2024-05-20"}],
        "passengers": [{"first_name": "Mia", "last_name": "Li", "dob": "1990-04-05"}],
        "payment_methods": [], "total_baggages": "two", "nonfree_baggages": 0, "insurance": "maybe"}),
    ("update_reservation_baggages", {"reservation_id": "4WQ150", "total_baggages": "6", "nonfree_baggages": 1,
                                     "payment_id": "gift_card_3576581"}),
    ("update_reservation_baggages", {"reservation_id": "4WQ150", "total_baggages": 6, "nonfree_baggages": 1.5,
                                     "payment_id": "gift_card_3576581"}),
    ("update_reservation_flights", {"reservation_id": "4WQ150", "cabin": "first", "flights": [],
                                    "payment_id": "gift_card_3576581"}),
    ("update_reservation_flights", {"reservation_id": "4WQ150", "cabin": "business", "flights": [{"flight": 1}],
                                    "payment_id": "gift_card_3576581"}),
    ("update_reservation_passengers", {"reservation_id": "4WQ150", "passengers": "Chen Jackson"}),
    ("update_reservation_passengers", {"reservation_id": "4WQ150", "passengers": [1, 2, 3]}),
    ("send_certificate", {"user_id": "mia_li_3668", "amount": "a lot"}),
    ("send_certificate", {"user_id": "mia_li_3668", "amount": None}),
    ("cancel_reservation", {"reservation_id": {"id": "4WQ150"}}),
]  # fmt: skip


@pytest.mark.parametrize("name,arguments", BAD_CALLS, ids=[f"{i}-{c[0]}" for i, c in enumerate(BAD_CALLS)])
def test_bad_arguments_give_errors(world, name, arguments):
    env = world.new_env()
    out = env.call(name, arguments)
    assert isinstance(out, str) and out.startswith("Error: "), out
    assert env.calls[-1].error
    assert all(not env.db.written(c) for c in world.collections), "a refused call wrote to the database"
    env.close()


def test_main_replays_a_task():
    r = subprocess.run(
        [sys.executable, "-m", "domains.airline", "--task", "airline/8", "--data-dir", str(TAU2 / "data")],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "reward 1.0" in r.stdout and "book_reservation" in r.stdout
