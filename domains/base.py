"""The world an agent acts on: a company database in SQLite, the tools bound to it, tasks, and the reward.

MUA-RL (Zhao et al. 2025, section "Environment") gives every rollout its own copy of the company database and
scores the rollout by comparing the final database with the one the task's gold actions produce. This file is
that machinery, shared by every domain (retail.py, airline.py, telecom.py, synthetic.py):

    World   one domain: a read-only SQLite *template* of its database, its tools, its rules (policy text), its tasks
    Env     one rollout's private database + the log of the calls it made;   env.call(name, arguments) -> str
    Store   what a tool sees of the database: get / put / scan / query on JSON documents
    Task    one customer request: hidden user instructions, gold actions, required outputs
    score   reward 1 iff the final database equals the gold database (and, optionally, the required outputs
            were said)

How the database is stored (and why)
------------------------------------
tau2-bench keeps each domain's database as nested JSON (users -> addresses, orders -> items -> options ...) and
its tools answer with the JSON of a record, *in the model's field order*. To reproduce those answers byte for
byte we keep every top-level record as one JSON document in a SQLite table:

    CREATE TABLE users (pos INTEGER, id TEXT PRIMARY KEY, doc TEXT)     -- one row per user, doc = its JSON

`pos` keeps tau2's dict order (tools that scan, e.g. "find the user with this email", return the first match
in that order). Searches run in SQL with `json_extract`, always with `?` parameters.

Copy-on-write, not copy
-----------------------
The reference path (tau2, the MUA-RL code) json.loads a multi-megabyte file and deep-copies it for every
rollout: ~60 ms (retail) / ~150 ms (airline) here. We build the template once (a SQLite file in a cache
directory, keyed by the hash of the source data) and give each rollout a fresh in-memory database that
ATTACHes the template read-only as `base`. The rollout's own tables start empty and receive every write;
reads look in the rollout's tables first and fall through to `base`. Creating an env is therefore ~0.1 ms,
no env can see another env's writes, and the template is opened read-only so it is never written. Comparing
two envs (the reward) only needs the rows either of them wrote.

Departures from tau2-bench
--------------------------
1. Storage is SQLite documents instead of pydantic models in memory; outputs and the exported DB are
   identical (tests/test_retail_parity.py and test_airline_parity.py check every recorded call against tau2's own outputs).
2. A tool that raises after writing keeps its write, as in tau2 (no rollback): tools read, check, then write,
   in tau2's order, so the database ends up exactly where tau2's would.
"""

from __future__ import annotations

import copy
import ctypes
import hashlib
import json
import os
import sqlite3
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from tools import ParsedTurn, check_arguments, clean, parse_tool_calls

# ---------------------------------------------------------------------------------------------------------------
# Where built templates live. One file per (domain, source data, normaliser version); safe to delete.


def cache_dir() -> Path:
    d = Path(os.environ.get("MUARL_CACHE") or Path.home() / ".cache" / "muarl")
    d.mkdir(parents=True, exist_ok=True)
    return d


def build_template(name: str, db: dict[str, dict[str, dict]], key: str) -> Path:
    """Write `db` (collection -> id -> record) to a SQLite file once; return its path.

    `key` identifies the content (a hash of the source data plus the normaliser's version): a template with
    the same key is reused, a changed source builds a new file. The file is written under a temporary name
    and renamed, so a crash mid-build never leaves a half-written template that later runs would trust.
    """
    path = cache_dir() / f"{name}-{key[:16]}.sqlite"
    if path.exists():
        return path
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    os.close(fd)
    con = sqlite3.connect(tmp)
    try:
        for coll, records in db.items():
            _check_ident(coll)
            con.execute(f"CREATE TABLE {coll} (pos INTEGER NOT NULL, id TEXT PRIMARY KEY, doc TEXT NOT NULL)")
            con.executemany(
                f"INSERT INTO {coll} (pos, id, doc) VALUES (?, ?, ?)",
                [(i, rid, json.dumps(rec)) for i, (rid, rec) in enumerate(records.items())],
            )
        con.commit()
    finally:
        con.close()
    os.replace(tmp, path)  # atomic: readers see the old state or the whole new file
    return path


def content_key(*parts: str | bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode() if isinstance(p, str) else p)
        h.update(b"\0")
    return h.hexdigest()


def _check_ident(name: str) -> None:
    # Table names cannot be SQL parameters, so collection names (which come from the domain's code, never from
    # a model or a user) are checked to be plain identifiers before they are formatted into a statement.
    if not name.isidentifier():
        raise ValueError(f"bad collection name {name!r}")


# ---------------------------------------------------------------------------------------------------------------
# Store: what a tool sees. Documents in, documents out; every read returns a fresh dict the tool may mutate.


class Store:
    def __init__(self, con: sqlite3.Connection, collections: list[str]):
        self.con = con
        self.collections = collections

    def get(self, coll: str, rid: Any) -> dict | None:
        """The record `rid` of `coll`, or None. A non-string id (a model may send 123) simply matches nothing."""
        if not isinstance(rid, str):
            return None
        row = self.con.execute(f"SELECT doc FROM main.{coll} WHERE id = ?", (rid,)).fetchone()
        if row is None:
            row = self.con.execute(f"SELECT doc FROM base.{coll} WHERE id = ?", (rid,)).fetchone()
        return None if row is None else json.loads(row[0])

    def contains(self, coll: str, rid: Any) -> bool:
        return self.get(coll, rid) is not None

    def put(self, coll: str, rid: str, doc: dict) -> None:
        """Insert or replace a record in this env's own tables; a new id goes after every existing one."""
        row = self.con.execute(
            f"SELECT pos FROM main.{coll} WHERE id = ? UNION ALL SELECT pos FROM base.{coll} WHERE id = ?", (rid, rid)
        ).fetchone()
        if row is None:  # a new record: append, like a new key in a Python dict
            pos = self.con.execute(
                f"SELECT max(coalesce((SELECT max(pos) FROM main.{coll}), -1), "
                f"coalesce((SELECT max(pos) FROM base.{coll}), -1)) + 1"
            ).fetchone()[0]
        else:
            pos = row[0]
        self.con.execute(f"INSERT OR REPLACE INTO main.{coll} (pos, id, doc) VALUES (?, ?, ?)", (pos, rid, json.dumps(doc)))

    def _effective(self, coll: str, where: str = "1", params: tuple = ()) -> str:
        # The env's view of a collection: its own rows, plus the template's rows it has not overwritten.
        return (
            f"SELECT pos, id, doc FROM main.{coll} WHERE {where} "
            f"UNION ALL SELECT pos, id, doc FROM base.{coll} "
            f"WHERE id NOT IN (SELECT id FROM main.{coll}) AND {where} ORDER BY pos"
        )

    def scan(self, coll: str) -> Iterator[tuple[str, dict]]:
        """Every (id, record) of `coll` in tau2's order."""
        for _, rid, doc in self.con.execute(self._effective(coll)):
            yield rid, json.loads(doc)

    def query(self, coll: str, where: str, params: tuple) -> list[tuple[str, dict]]:
        """(id, record) pairs whose document satisfies `where` (SQL over `doc`, with `?` placeholders), in order.

        `where` is written by the domain's code (e.g. "lower(json_extract(doc, '$.email')) = ?"); values from the
        model only ever travel in `params`.
        """
        sql = self._effective(coll, where)
        return [(rid, json.loads(doc)) for _, rid, doc in self.con.execute(sql, params + params)]

    def ids(self, coll: str) -> list[str]:
        return [rid for _, rid, _ in self.con.execute(self._effective(coll))]

    def written(self, coll: str) -> dict[str, str]:
        """id -> JSON text of every record this env wrote (the copy-on-write delta)."""
        return {rid: doc for rid, doc in self.con.execute(f"SELECT id, doc FROM main.{coll}")}

    def raw(self, coll: str, rid: str) -> str | None:
        row = self.con.execute(self._effective(coll, "id = ?"), (rid, rid)).fetchone()
        return None if row is None else row[2]


# ---------------------------------------------------------------------------------------------------------------
# Tasks


@dataclass
class Task:
    id: str  # e.g. "retail/12" or "synth-retail/s0-17"
    domain: str  # the world it runs in
    split: str  # "train" | "test" (tau2's split_tasks.json) or "synthetic"
    instructions: str  # the user's hidden goal, in words (what the user simulator is told)
    actions: list[dict]  # gold actions [{"name", "arguments"}], replayed to build the gold database
    outputs: list[str] = field(default_factory=list)  # strings the agent must say (tau2's communicate_info)
    spec: dict | None = None  # structured user spec (synthetic tasks): identity, intent, reveal-on-ask, stop
    expert: list[dict] | None = None  # scripted expert conversation (synthetic tasks)
    raw: dict | None = None  # the source record, for anyone who needs a field we did not lift out


@dataclass(frozen=True)
class Domain:
    """One row of the DOMAINS table (domains/__init__.py): everything the rest of the code needs to know about a
    domain, so that no other file names one. A new domain is one file plus one row."""

    build: Callable[..., "World"]  # keyword arguments -> the World (load_world caches it per arguments)
    settings: Callable[[Any], dict] = lambda cfg: {}  # the run's Config -> build's keyword arguments
    # module with scripted_first_message(spec), scripted_reply(spec, history), or None; a script for tasks with no
    # spec (tau2's) gets the task instead of its spec, and in a dual-control world the customer's phone as well:
    # scripted_reply(task, history, phone) (user_sim.Phone; domains/telecom_user.py)
    script: Any = None
    generator: bool = False  # --tasks synthetic can generate tasks over this world (domains/synthetic.py)
    # the world's own LLM customer (ACEBench's prompt, benchmarks/acebench_customer.py), or None: a mixin over
    # user_sim.LLMUser that plays the tasks carrying its prompt and hands every other task to LLMUser
    customer: Any = None


# ---------------------------------------------------------------------------------------------------------------
# Env: one rollout

TOOL_SECONDS = 10.0  # a tool call's time budget (World.tool_seconds; retail / airline tools answer in ~0.1 ms)
TOOL_CHARS = 100_000  # a tool call's size budget: its arguments as JSON, and its output (cut beyond, with a note)


def _size(arguments: dict) -> int:
    # characters of the arguments as JSON; arguments JSON cannot write back (nested past the stack) count as too large
    try:
        return len(json.dumps(arguments, default=repr))
    except (ValueError, RecursionError):
        return TOOL_CHARS + 1



@dataclass
class Call:
    name: str
    arguments: Any
    output: str
    error: bool
    write: bool  # was this a write tool (by the domain's declaration, whether or not it succeeded)
    requestor: str = "assistant"  # who called: "assistant" (the agent) or "user" (the customer, dual-control domains)


class Env:
    """One rollout's private database and the tools bound to it."""

    def __init__(self, world: "World"):
        self.world = world
        # isolation_level=None: no implicit transactions; each write is its own statement on an in-memory DB.
        self.con = sqlite3.connect(":memory:", uri=True, isolation_level=None, check_same_thread=False)
        self.con.execute("ATTACH DATABASE ? AS base", (f"file:{world.template_path}?mode=ro&immutable=1",))
        for coll in world.collections:
            self.con.execute(f"CREATE TABLE main.{coll} (pos INTEGER NOT NULL, id TEXT PRIMARY KEY, doc TEXT NOT NULL)")
        self.db = Store(self.con, world.collections)
        self.calls: list[Call] = []

    def call(self, name: str, arguments: Any, requestor: str = "assistant") -> str:
        """Run tool `name` with keyword `arguments`; return the string the caller sees. Never raises.

        Like tau2, an exception inside a tool becomes the observation "Error: <message>"; objects are returned as
        their JSON (json.dumps with default separators), strings as they are. `requestor` picks the toolkit, as in
        tau2: "assistant" calls the company's tools, "user" the customer's own (world.user_tools; dual-control
        domains such as telecom), and a name from the other side's toolkit is "not found".
        """
        toolkit = self.world.user_tools if requestor == "user" else self.world.tools
        fn = toolkit.get(name) if isinstance(name, str) else None
        if fn is None:
            out, err = f"Error: Tool '{name}' not found.", True
        elif not isinstance(arguments, dict):
            out, err = f"Error: arguments of {name} must be a JSON object, got {type(arguments).__name__}", True
        elif self.world.refuse_bad_arguments and (bad := check_arguments(fn, arguments)) is not None:
            out, err = bad, True
        elif (size := _size(arguments)) > TOOL_CHARS:
            out, err = f"Error: arguments of {name} too large ({size} characters, at most {TOOL_CHARS})", True
        else:
            out, err = self._run(fn, arguments)
        out = clean(out) if len(out) <= TOOL_CHARS else clean(out[:TOOL_CHARS]) + f"... [{len(out)} characters]"
        self.calls.append(Call(name, arguments, out, err, name in self.world.write_tools, requestor))
        return out

    def tool_schemas(self, messages: list[dict] | None = None) -> list[dict]:
        """The tools the agent sees at this point of its conversation (`messages`): the world's, for every domain
        whose toolkit is fixed; BFCL's env shows its own task's tools, and a held-out one once it is revealed."""
        return self.world.tool_schemas()

    def _run(self, fn: Callable, arguments: dict) -> tuple[str, bool]:
        """(output, error) of one tool call, under the world's time budget (world.tool_seconds).

        The tool runs on its own thread while this one waits: past the budget, the caller gets an error, as from a
        real service that timed out, a running SQL statement is interrupted, and the abandoned thread is stopped
        (SystemExit raised in it at its next Python instruction: a runaway loop would otherwise keep a core for
        good). What a thread cannot do is stop code that holds Python's lock (a big power, Decimal or mpmath
        precision, a catastrophic regex): neither this thread nor the stop gets a turn until it lets go. So every
        tool that computes on a number the model chose is bounded by construction, refusing before it works:
        tools.calculate, ACEBench's argument arithmetic (acebench._too_large), BFCL's MathAPI (bfcl.too_costly);
        the world tools are lookups linear in their arguments, which Env.call caps at TOOL_CHARS (tests/test_fuzz.py
        plays them all). A tool a fork adds that can hold the lock needs the same (or a child process to run in)."""
        box: dict = {}

        def work():
            try:
                result = fn(self.db, **arguments)
                box["out"] = (result if isinstance(result, str) else json.dumps(result)), False
                # after every successful call (e.g. telecom's sync between the agent's database and the customer's
                # phone); inside the try, as in tau2: if it fails, the call is answered with its error
                self.world.after_call(self)
            except Exception as e:  # noqa: BLE001 - every failure is an observation for the agent, as in tau2
                box["out"] = f"Error: {e}", True
            except SystemExit:  # stopped, past its budget (below)
                pass

        worker = threading.Thread(target=work, daemon=True)
        worker.start()
        worker.join(self.world.tool_seconds)
        if "out" not in box:
            self.con.interrupt()
            if worker.is_alive():  # (its id is not yet another thread's)
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(worker.ident), ctypes.py_object(SystemExit))
            return f"Error: {fn.__name__} did not answer within {self.world.tool_seconds:g} seconds", True
        return box["out"]

    def export(self) -> dict[str, dict[str, dict]]:
        """The whole database in tau2's shape: collection -> id -> record (every field, nulls included)."""
        return {coll: dict(self.db.scan(coll)) for coll in self.world.collections}

    def db_hash(self) -> str:
        """sha256 of the DB as tau2's evaluator hashes it: json.dumps(db, sort_keys=True, default=str)."""
        return hashlib.sha256(json.dumps(self.export(), sort_keys=True, default=str).encode()).hexdigest()

    def close(self) -> None:
        self.con.close()


# Where the customer has tools of its own (domains/dual_control.py), its calls and their results are kept among
# the episode's readable messages with requestor "user"; rollout.py keeps them out of the agent's view.
def customer_only(m: dict) -> bool:
    """A message only the customer saw: its own tool call (a "user" message with tool_calls) or that
    call's result (a "tool" message with requestor "user"). Never shown to the agent, never in its
    token stream."""
    return m.get("requestor") == "user" and (m.get("role") == "tool" or bool(m.get("tool_calls")))


# ---------------------------------------------------------------------------------------------------------------
# World: a domain


def _canon(doc_text: str | None) -> str | None:
    # tau2 compares databases by hashing json.dumps(..., sort_keys=True): key order does not matter, 1 vs 1.0 does.
    return None if doc_text is None else json.dumps(json.loads(doc_text), sort_keys=True)


class World:
    """A domain: template database + tools + rules (the company policy the agent reads) + tasks.
    Build one per process; make an Env per rollout."""

    # Refuse calls whose arguments do not bind to the tool's signature with our own message (retail, airline).
    # telecom turns it off: tau2's telecom fixtures pin Python's own TypeError texts for such calls.
    refuse_bad_arguments = True

    def __init__(
        self,
        name: str,
        db: dict[str, dict[str, dict]],
        key: str,
        tools: list[Callable],
        write_tools: set[str],
        rules: str,
        tasks: list[Task] | None = None,
    ):
        self.name = name
        self.collections = list(db)
        for c in self.collections:
            _check_ident(c)
        self.template_path = build_template(name, db, key)
        self.tools = {fn.__name__: fn for fn in tools}
        self.write_tools = set(write_tools)
        self.rules = rules
        self._tasks = list(tasks or [])
        self.tool_seconds = TOOL_SECONDS  # every tool call's time budget (Env._run)
        self.user_tools: dict[str, Callable] = {}  # the customer's own tools (dual-control domains set them)
        self._gold_cache: dict[str, dict[str, dict[str, str | None]]] = {}

    def new_env(self, task: Task | None = None) -> Env:
        """A fresh private database for one rollout; with `task`, in that task's initial state (init_env)."""
        env = Env(self)
        if task is not None:
            self.init_env(env, task)
        return env

    def init_env(self, env: Env, task: Task) -> None:
        """Put a new env in the task's initial state. Nothing to do for retail / airline (every task starts from the
        template); telecom overrides it (tau2's initialization_actions on both sides)."""

    def after_call(self, env: Env) -> None:
        """Runs after every successful tool call of either side. Nothing by default; telecom syncs its two sides."""

    def parse_turn(self, env: Env, text: str) -> ParsedTurn:
        """An agent's text -> its tool calls: Qwen3 <tool_call> JSON here; a benchmark may speak its own syntax."""
        return parse_tool_calls(text, set(self.tools))

    def ends(self, ep) -> str | None:
        """A stop reason once the newest message of episode `ep` ends the conversation by this domain's own rule
        (rollout.py asks after every message); None: tau2's markers and caps alone decide."""

    def customer_mistakes(self, task: Task, messages: list[dict]) -> list[str] | None:
        """What the simulated customer said against its instructions ([] = faithful), or None when the domain cannot
        tell (only worlds whose tasks carry a structured spec can: the demo's store, demo/worlds/store.py)."""
        return None

    def user_tool_schemas(self) -> list[dict]:
        """The customer's tools' JSON schemas ([] for single-control domains), for the OpenAI tools API."""
        if not hasattr(self, "_user_schemas"):
            from tools import function_schema

            self._user_schemas = [function_schema(fn) for fn in self.user_tools.values()]
        return self._user_schemas

    def tasks(self, split: str = "all") -> list[Task]:
        return [t for t in self._tasks if split == "all" or t.split == split]

    def task(self, task_id: str) -> Task:
        for t in self._tasks:
            if t.id == task_id:
                return t
        raise KeyError(f"no task {task_id!r} in world {self.name!r}")

    def tool_schemas(self) -> list[dict]:
        """The tools' JSON schemas, derived once (tools.function_schema) and reused by every rollout."""
        if not hasattr(self, "_schemas"):
            from tools import function_schema  # tools.py derives schemas from signatures + docstrings

            self._schemas = [function_schema(fn) for fn in self.tools.values()]
        return self._schemas

    # --- reward ---------------------------------------------------------------------------------------------

    def replay(self, actions: list[dict], env: Env | None = None) -> Env:
        """Run gold actions in order on a fresh env (some fail on purpose in tau2's data; they fail the same way).
        An action with "requestor": "user" is the customer's (dual-control domains) and runs on the user's side."""
        env = env or self.new_env()
        for a in actions:
            env.call(a["name"], copy.deepcopy(a.get("arguments", {})), requestor=a.get("requestor", "assistant"))
        return env

    def _delta(self, env: Env) -> dict[str, dict[str, str | None]]:
        # collection -> id -> canonical JSON of every record the env wrote
        return {c: {rid: _canon(doc) for rid, doc in env.db.written(c).items()} for c in self.collections}

    def gold_delta(self, task: Task) -> dict[str, dict[str, str | None]]:
        if task.id not in self._gold_cache:
            env = self.replay(task.actions)
            self._gold_cache[task.id] = self._delta(env)
            env.close()
        return self._gold_cache[task.id]

    def db_equal(self, env: Env, gold: dict[str, dict[str, str | None]]) -> tuple[bool, list[str]]:
        """Whole-DB equality with the gold DB, computed on the two deltas (records neither wrote are equal)."""
        mine = self._delta(env)
        diffs = []
        for c in self.collections:
            for rid in set(mine[c]) | set(gold[c]):
                # a record one side never wrote still has the template's value on that side
                a = mine[c][rid] if rid in mine[c] else _canon(self._template_raw(c, rid))
                b = gold[c][rid] if rid in gold[c] else _canon(self._template_raw(c, rid))
                if a != b:
                    diffs.append(f"{c}/{rid}")
        return not diffs, sorted(diffs)

    def db_rows(self, env: Env, gold: dict[str, dict[str, str | None]], limit: int = 5) -> list[dict]:
        """The first `limit` records that differ from the gold DB, each as {"row", "expected", "agent"}
        holding only the fields that differ (a whole record where one side has none), long values cut:
        what the run's page shows under a database mismatch."""
        def cut(v):  # a value past 200 characters of JSON is shown as its first 200
            text = json.dumps(v)
            return v if len(text) <= 200 else text[:200] + "..."

        mine, rows = self._delta(env), []
        for c in self.collections:
            for rid in sorted(set(mine[c]) | set(gold[c])):
                a = mine[c][rid] if rid in mine[c] else _canon(self._template_raw(c, rid))
                b = gold[c][rid] if rid in gold[c] else _canon(self._template_raw(c, rid))
                if a == b or len(rows) >= limit:
                    continue
                x, y = (None if v is None else json.loads(v) for v in (a, b))
                if isinstance(x, dict) and isinstance(y, dict):  # only the fields that differ
                    keys = sorted(k for k in x.keys() | y.keys() if x.get(k) != y.get(k))
                    x, y = {k: cut(x.get(k)) for k in keys}, {k: cut(y.get(k)) for k in keys}
                rows.append({"row": f"{c}/{rid}", "expected": y, "agent": x})
        return rows

    def _template_raw(self, coll: str, rid: str) -> str | None:
        row = self._template_con().execute(f"SELECT doc FROM {coll} WHERE id = ?", (rid,)).fetchone()
        return None if row is None else row[0]

    def _template_con(self) -> sqlite3.Connection:
        if not hasattr(self, "_tcon"):
            self._tcon = sqlite3.connect(f"file:{self.template_path}?mode=ro&immutable=1", uri=True, check_same_thread=False)
        return self._tcon

    def score(self, task: Task, env: Env, messages: list[dict] | None = None, check_outputs: bool = False,
              stop_reason: str | None = None):
        """Outcome reward. r = 1 iff final DB == gold DB [and every required output was said, if switched on].
        `stop_reason` (the episode's) is unused here, as in MUA-RL; telecom's tau2 scoring needs it.

        MUA-RL trains on the DB check alone (the output check hurt learning); tau2's evaluation adds the output
        check: each required string must appear, case-insensitively and with commas removed, in some assistant
        message. Returns (reward, info) with the breakdown.
        """
        gold = self.gold_delta(task)
        db_match, diffs = self.db_equal(env, gold)
        said = " ".join(
            (m.get("content") or "").lower().replace(",", "") for m in (messages or []) if m.get("role") == "assistant"
        )
        found = [o for o in task.outputs if o.lower().replace(",", "") in said]
        missing = [o for o in task.outputs if o not in found]
        ok = db_match and (not check_outputs or not missing)
        info = {
            "db_match": db_match,
            "db_diff": diffs[:20],
            "db_rows": [] if db_match else self.db_rows(env, gold),  # the fields that differ, for the run's page
            "outputs_found": found,
            "outputs_missing": missing,
            "outputs_checked": check_outputs,
            "calls": len(env.calls),
            "write_calls": sum(c.write for c in env.calls),
            "errors": sum(c.error for c in env.calls),
        }
        return float(ok), info

