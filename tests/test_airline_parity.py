"""Differential test: our airline tools against tau2-bench's own, call by call, record by record.

/work/shared/tau2/parity/airline.jsonl holds 350 sequences (the 50 gold action lists + 300 random ones,
2,111 calls) recorded by running tau2's airline tools on the base database. For every sequence, on a fresh env:
  1. every call's output string is byte-identical and its error flag the same;
  2. the records that differ from the base DB afterwards are exactly the recorded `changed` ones, each equal
     to tau2's record (json.dumps with sort_keys: key order free, 1 vs 1.0 not);
  3. the DB's sha256 equals the recorded `db_sha256`. env.db_hash() re-serialises the whole 7 MB DB (~0.1 s),
     so it runs on every gold sequence and every 10th random one; for all 350 the same hash is assembled from
     precomputed canonical texts of the base records plus our changed records (test_all_hashes).
"""

import hashlib
import json

import pytest

from conftest import TAU2, needs_tau2

pytestmark = needs_tau2

BASE_SHA = "124e39a664b56402bcd09cb8a6a9cece6acb8462337c969799d5658e3250f263"


def _canon(rec) -> str:
    return json.dumps(rec, sort_keys=True)


@pytest.fixture(scope="module")
def world():
    from domains import airline

    return airline.build_world(TAU2 / "data")


@pytest.fixture(scope="module")
def sequences():
    with open(TAU2 / "parity" / "airline.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def base(world):
    """collection -> id -> canonical text of the base record (from a fresh env's export)."""
    env = world.new_env()
    out = {c: {rid: _canon(rec) for rid, rec in recs.items()} for c, recs in env.export().items()}
    env.close()
    return out


@pytest.fixture(scope="module")
def replayed(world, sequences, base):
    """Replay every sequence once; keep per sequence the output mismatches and our changed records."""
    results = {}
    for seq in sequences:
        env = world.new_env()
        mismatches = []
        for i, c in enumerate(seq["calls"]):
            out = env.call(c["name"], json.loads(json.dumps(c["arguments"])))  # a private copy of the arguments
            if out != c["output"] or env.calls[-1].error != c["error"]:
                mismatches.append((i, c["name"], c["output"][:200], out[:200]))
        changed = {}
        for coll in world.collections:
            for rid, doc in env.db.written(coll).items():
                text = _canon(json.loads(doc))
                if base[coll].get(rid) != text:
                    changed.setdefault(coll, {})[rid] = text
        results[seq["seq_id"]] = {"mismatches": mismatches, "changed": changed, "env": env}
    yield results
    for r in results.values():
        r["env"].close()


def test_fixture_counts(sequences):
    assert len(sequences) == 350
    assert sum(len(s["calls"]) for s in sequences) == 2111
    assert {c["name"] for s in sequences for c in s["calls"]} == {
        "book_reservation", "calculate", "cancel_reservation", "get_flight_status", "get_reservation_details",
        "get_user_details", "list_all_airports", "search_direct_flight", "search_onestop_flight",
        "send_certificate", "transfer_to_human_agents", "update_reservation_baggages",
        "update_reservation_flights", "update_reservation_passengers",
    }  # fmt: skip


def test_base_hash(world):
    env = world.new_env()
    assert env.db_hash() == BASE_SHA
    # normalised shape: model field order, optional fields present
    assert list(env.db.get("flights", "HAT001"))[:3] == ["flight_number", "origin", "destination"]
    res = env.db.get("reservations", "4WQ150")
    assert list(res)[-1] == "status" and res["status"] is None
    assert list(res["flights"][0]) == ["flight_number", "origin", "destination", "date", "price"]


def test_every_output_identical(sequences, replayed):
    bad = {s["seq_id"]: replayed[s["seq_id"]]["mismatches"] for s in sequences if replayed[s["seq_id"]]["mismatches"]}
    assert not bad, f"{len(bad)} sequences differ, first: {next(iter(bad.items()))}"


def test_every_changed_record_identical(sequences, replayed):
    bad = []
    for s in sequences:
        ours = replayed[s["seq_id"]]["changed"]
        want = {c: {rid: _canon(rec) for rid, rec in recs.items()} for c, recs in s["changed"].items() if recs}
        assert not any(s["deleted"].values())  # no tool deletes a top-level record
        if ours != want:
            extra = {c: sorted(set(ours.get(c, {})) - set(want.get(c, {}))) for c in ours}
            missing = {c: sorted(set(want.get(c, {})) - set(ours.get(c, {}))) for c in want}
            differ = [(c, r) for c in want for r in want[c] if r in ours.get(c, {}) and ours[c][r] != want[c][r]]
            bad.append((s["seq_id"], extra, missing, differ[:3]))
    assert not bad, f"{len(bad)} sequences end in a different DB, first: {bad[0]}"


def test_db_hash_subset(sequences, replayed):
    # the real thing, env.db_hash(), on all gold sequences and a fixed tenth of the random ones
    subset = [s for i, s in enumerate(sequences) if "gold" in s["seq_id"] or i % 10 == 0]
    assert len(subset) >= 75
    for s in subset:
        assert replayed[s["seq_id"]]["env"].db_hash() == s["db_sha256"], s["seq_id"]


def test_all_hashes(world, sequences, base, replayed):
    # json.dumps(db, sort_keys=True) of {coll: {id: record}} is '{"flights": {"HAT001": {...}, ...}, ...}':
    # assembling it from canonical record texts gives the same bytes, so the hash of every sequence is cheap.
    def assemble(changed):
        parts = []
        for coll in sorted(base):
            recs = {**base[coll], **changed.get(coll, {})}
            body = ", ".join(f"{json.dumps(rid)}: {recs[rid]}" for rid in sorted(recs))
            parts.append(f"{json.dumps(coll)}: {{{body}}}")
        return hashlib.sha256(("{" + ", ".join(parts) + "}").encode()).hexdigest()

    assert assemble({}) == BASE_SHA  # the assembly itself is right
    assert assemble(replayed[sequences[0]["seq_id"]]["changed"]) == replayed[sequences[0]["seq_id"]]["env"].db_hash()
    bad = [s["seq_id"] for s in sequences if assemble(replayed[s["seq_id"]]["changed"]) != s["db_sha256"]]
    assert not bad, f"{len(bad)} sequences end with a different DB hash: {bad[:5]}"
