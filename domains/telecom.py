"""The telecom world: tau2-bench's dual-control domain. The agent has 13 tools on the company database, the customer
30 tools on their own phone (domains/phone.py), and most tasks can only be solved by the customer acting.

The paper reports telecom beside retail and airline (MUA-RL-14B: 33.4 % pass^1, 54.3 % task completion). It is the
domain where the simulated user matters most: the phone is broken in some combination of ways (airplane mode, a
removed SIM, data off, a 2G-only network mode, a broken APN, a slow VPN, missing app permissions, roaming off
abroad, data usage over the limit, a line suspended for an overdue bill), and the agent must diagnose it from what
the customer reads off the phone and guide them, or fix the account side itself (refuel data, enable roaming,
send a payment request and resume the line). Everything here re-implements tau2's own code, described in
../shared/tau2/TELECOM.md:

    the company DB   plans, customers, lines, bills, devices: SQLite documents in tau2's model_dump() form
    the phone        the `phone` collection of the same per-rollout database (phone.py; phone_tasks.py holds
                     the functions tasks use to break it and the evaluator's checks)
    sync             after every successful call of either side (World.after_call), tau2's `sync_tools` copies the
                     line's state onto the phone's surroundings and moves payments between the two sides
    init_env         a task's initialization_actions, on both sides (cached per task: a new env copies the rows)
    score            tau2's evaluator: the task's env assertions on the final state (and, for the 20 transfer
                     tasks, its gold actions among the calls); info["completion"] is the share of assertions met

The clock is fixed at 2025-02-25 (12:08:00), as tau2's `get_today`.

Outputs are tau2's byte for byte: a model is json.dumps(model_dump()) (numbers stay numbers), but a plain dict a
tool returns has its numbers and booleans turned into str() first (tau2's `to_json_str`): refuel_data answers
`"charge": "4.0"`. tests/test_telecom_parity.py replays 414 sequences (5,224 calls of both sides) recorded from
tau2 and checks every output, error flag, changed record, both databases' hashes, assertions and evaluation.

Departures from tau2-bench: (1) records are keyed by id, so a bill created with an id that already exists (only the
initialisation helper suspend_line_for_overdue_bill could do it) replaces the old one instead of sitting beside it;
(2) a keyword argument named like the hidden first parameter (`db`, `ph`) gets Python's "positional-only" TypeError
instead of tau2's; (3) scoring runs the assertions on the rollout's own env instead of on a replay of its write
calls (the same state: reads never change it, and every write already ran with tau2's syncs).
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import tomllib
import uuid
from datetime import date, datetime
from typing import Any, Callable

from domains import phone, phone_tasks
from domains.base import Env, Store, Task, World, content_key
from domains.tau2_data import find_data, render_instructions

NORMALISER_VERSION = "telecom-1"
TODAY = "2025-02-25"  # tau2's get_today(); the charges, suspensions and new bills below are dated from it
AGENT_COLLECTIONS = ("plans", "customers", "lines", "bills", "devices")
VALID_ENDS = ("user_stop", "transfer", "agent_stop")  # tau2 scores only USER_STOP / AGENT_STOP conversations

# ---------------------------------------------------------------------------------------------------------------
# db.toml -> tau2's model_dump() records (field order, defaults, floats, dates as text)


def _date(x: Any) -> str | None:
    return None if x is None else str(x if isinstance(x, date) else date.fromisoformat(x))


def _datetime(x: Any) -> str | None:
    # pydantic prints a datetime with a space ("2025-01-20 14:30:00"); a bare date default stays a date
    return None if x is None else str(x if isinstance(x, date) else datetime.fromisoformat(x))


def _fields(rec: dict, spec: list[tuple[str, Any, Callable]]) -> dict:
    return {k: (conv(rec[k]) if k in rec else copy.deepcopy(default)) for k, default, conv in spec}


_same = lambda x: x  # noqa: E731
PLAN = [("plan_id", None, _same), ("name", None, _same), ("data_limit_gb", None, float),
        ("price_per_month", None, float), ("data_refueling_price_per_gb", None, float)]
DEVICE = [("device_id", None, _same), ("device_type", None, _same), ("model", None, _same), ("imei", None, _same),
          ("is_esim_capable", None, _same), ("activated", False, _same), ("activation_date", None, _datetime),
          ("last_esim_transfer_date", None, _datetime)]
LINE = [("line_id", None, _same), ("phone_number", None, _same), ("status", "Pending Activation", _same),
        ("plan_id", None, _same), ("device_id", None, _same), ("data_used_gb", 0.0, float),
        ("data_refueling_gb", 0.0, float), ("roaming_enabled", False, _same), ("contract_end_date", None, _date),
        ("last_plan_change_date", None, _date), ("last_sim_replacement_date", None, _date),
        ("suspension_start_date", None, _date)]
LINE_ITEM = [("description", None, _same), ("amount", None, float), ("date", None, _date), ("item_type", None, _same)]
BILL = [("bill_id", None, _same), ("customer_id", None, _same), ("period_start", None, _date),
        ("period_end", None, _date), ("issue_date", None, _date), ("total_due", None, float), ("due_date", None, _date),
        ("line_items", [], lambda items: [_fields(i, LINE_ITEM) for i in items]), ("status", "Draft", _same)]
CUSTOMER = [("customer_id", None, _same), ("full_name", None, _same), ("date_of_birth", None, _same),
            ("email", None, _same), ("phone_number", None, _same),
            ("address", None, lambda a: {k: a[k] for k in ("street", "city", "state", "zip_code")}),
            ("account_status", "Pending Verification", _same),
            ("payment_methods", [], lambda ms: [{k: m[k] for k in ("method_type", "account_number_last_4",
                                                                   "expiration_date")} for m in ms]),
            ("line_ids", [], list), ("bill_ids", [], list), ("created_at", "2025-01-01", _datetime),
            ("last_extension_date", None, _date), ("goodwill_credit_used_this_year", 0.0, float)]
SPECS = {"plans": PLAN, "customers": CUSTOMER, "lines": LINE, "bills": BILL, "devices": DEVICE}


def normalise(db: dict, user_db: dict) -> dict[str, dict[str, dict]]:
    """Both TOML files -> collection -> id -> record; the phone is one more collection (phone.py)."""
    out = {}
    for coll, spec in SPECS.items():
        recs = [_fields(r, spec) for r in db.get(coll, [])]
        out[coll] = {r[spec[0][0]]: r for r in recs}
    out["phone"] = phone.normalise_user_db(user_db)
    return out


# ---------------------------------------------------------------------------------------------------------------
# Lookups with tau2's messages. A non-string id matches nothing (tau2 compares with ==), as Store.get does.


def _get(db: Store, coll: str, rid: Any, kind: str) -> dict:
    rec = db.get(coll, rid)
    if rec is None:
        raise ValueError(f"{kind} with ID {rid} not found")
    return rec


def _customer(db: Store, customer_id: Any) -> dict:
    return _get(db, "customers", customer_id, "Customer")


def _target_line(db: Store, customer_id: Any, line_id: Any) -> dict:
    """The line, after checking that the customer exists and owns it (tau2's _get_target_line)."""
    if line_id not in _customer(db, customer_id)["line_ids"]:
        raise ValueError(f"Line {line_id} not found for customer {customer_id}")
    return _get(db, "lines", line_id, "Line")


def _customer_by_phone(db: Store, phone_number: Any) -> dict:
    for _, cust in db.scan("customers"):
        if cust["phone_number"] == phone_number:
            return cust
        if any(_get(db, "lines", lid, "Line")["phone_number"] == phone_number for lid in cust["line_ids"]):
            return cust
    raise ValueError(f"Customer with phone number {phone_number} not found")


def _dumps(x: Any) -> str:
    return json.dumps(x)  # a record is already in model_dump() form with dates as text: json.dumps is tau2's output


def _plain(x: Any) -> Any:
    """tau2's to_json_str on a plain dict: numbers and booleans become str(), None stays (records never go here)."""
    return x if x is None or isinstance(x, str) else str(x)


def _new_bill_id(db: Store) -> str:
    # tau2: "B" + uuid4().hex[:8], random. A test can pin the ids by setting env.db.new_bill_ids = [...].
    pinned = getattr(db, "new_bill_ids", None)
    return pinned.pop(0) if pinned else "B" + uuid.uuid4().hex[:8]


def _agent_tool(fn: Callable) -> Callable:
    fn.__qualname__ = f"TelecomTools.{fn.__name__}"  # the name tau2's TypeErrors print
    return fn


# ---------------------------------------------------------------------------------------------------------------
# The 13 agent tools (docstrings: tau2's, which become the schemas the agent reads)


@_agent_tool
def get_customer_by_phone(db: Store, /, phone_number: str) -> str:
    """Finds a customer by their primary contact or line phone number.

    Args:
        phone_number: The phone number to search for.
    """
    return _dumps(_customer_by_phone(db, phone_number))


@_agent_tool
def get_customer_by_id(db: Store, /, customer_id: str) -> str:
    """Retrieves a customer directly by their unique ID.

    Args:
        customer_id: The unique identifier of the customer.
    """
    return _dumps(_customer(db, customer_id))


@_agent_tool
def get_customer_by_name(db: Store, /, full_name: str, dob: str) -> str:
    """Searches for customers by name and DOB. May return multiple matches if names are similar, DOB helps disambiguate.

    Args:
        full_name: The full name of the customer.
        dob: Date of birth for verification, in the format YYYY-MM-DD.
    """
    found = [c for _, c in db.scan("customers") if c["full_name"].lower() == full_name.lower()
             and c["date_of_birth"] == dob]
    return _dumps(found)


@_agent_tool
def get_details_by_id(db: Store, /, id: str) -> str:  # noqa: A002 - tau2's argument name
    """Retrieves the details for a given ID. The ID must be a valid ID for a Customer, Line, Device, Bill, or Plan.

    Args:
        id: The ID of the object to retrieve.
    """
    if not isinstance(id, str):
        raise AttributeError(f"'{type(id).__name__}' object has no attribute 'startswith'")
    kinds = {"L": ("lines", "Line"), "D": ("devices", "Device"), "B": ("bills", "Bill"), "C": ("customers", "Customer"),
             "P": ("plans", "Plan")}
    if id[:1] not in kinds:
        raise ValueError(f"Unknown ID format or type: {id}")
    coll, kind = kinds[id[:1]]
    return _dumps(_get(db, coll, id, kind))


@_agent_tool
def suspend_line(db: Store, /, customer_id: str, line_id: str, reason: str) -> str:
    """Suspends a specific line (max 6 months). Checks: Line status must be Active. Logic: Sets line status to
    Suspended, records suspension_start_date.

    Args:
        customer_id: ID of the customer who owns the line.
        line_id: ID of the line to suspend.
        reason: Reason for suspension.
    """
    line = _target_line(db, customer_id, line_id)
    if line["status"] != "Active":
        raise ValueError("Line must be active to suspend")
    line.update(status="Suspended", suspension_start_date=TODAY)  # no fee is charged; the reason is only logged
    db.put("lines", line["line_id"], line)
    return _dumps({"message": "Line suspended successfully. $5/month holding fee will apply.", "line": line})


@_agent_tool
def resume_line(db: Store, /, customer_id: str, line_id: str) -> str:
    """Resumes a suspended line. Checks: Line status must be Suspended or Pending Activation. Logic: Sets line status
    to Active, clears suspension_start_date.

    Args:
        customer_id: ID of the customer who owns the line.
        line_id: ID of the line to resume.
    """
    line = _target_line(db, customer_id, line_id)
    if line["status"] not in ("Suspended", "Pending Activation"):  # bills and contract dates are not checked
        raise ValueError("Line must be suspended to resume")
    line.update(status="Active", suspension_start_date=None)
    db.put("lines", line["line_id"], line)
    return _dumps({"message": "Line resumed successfully", "line": line})


def _bills(db: Store, customer: dict) -> list[dict]:
    return [_get(db, "bills", bid, "Bill") for bid in customer["bill_ids"]]


@_agent_tool
def get_bills_for_customer(db: Store, /, customer_id: str, limit: int = 12) -> str:
    """Retrieves a list of the customer's bills, most recent first.

    Args:
        customer_id: ID of the customer.
        limit: Maximum number of bills to return.
    """
    bills = sorted(_bills(db, _customer(db, customer_id)), key=lambda b: b["issue_date"], reverse=True)
    return _dumps(bills[:limit])  # Python slicing: 0 -> [], -1 drops the last, "3" -> TypeError


@_agent_tool
def send_payment_request(db: Store, /, customer_id: str, bill_id: str) -> str:
    """Sends a payment request to the customer for a specific bill. Checks: Customer exists; Bill exists and belongs
    to the customer; No other bills are already awaiting payment for this customer. Logic: Sets bill status to
    AWAITING_PAYMENT and notifies customer. Warning: This method does not check if the bill is already PAID. Always
    check the bill status before calling this method.

    Args:
        customer_id: ID of the customer who owns the bill.
        bill_id: ID of the bill to send payment request for.
    """
    customer = _customer(db, customer_id)
    if any(b["status"] == "Awaiting Payment" for b in _bills(db, customer)):
        raise ValueError("A bill is already awaiting payment for this customer")
    if bill_id not in customer["bill_ids"]:
        raise ValueError(f"Bill {bill_id} not found for customer {customer_id}")
    bill = _get(db, "bills", bill_id, "Bill")
    bill["status"] = "Awaiting Payment"  # QUIRK: whatever its status (Paid, Draft, Disputed...)
    db.put("bills", bill["bill_id"], bill)
    return f"Payment request sent to the customer for bill {bill['bill_id']}"


@_agent_tool
def get_data_usage(db: Store, /, customer_id: str, line_id: str) -> str:
    """Retrieves current billing cycle data usage for a line, including data refueling amount, data limit, and cycle
    end date.

    Args:
        customer_id: ID of the customer who owns the line.
        line_id: ID of the line to check usage for.
    """
    line = _target_line(db, customer_id, line_id)
    plan = _get(db, "plans", line["plan_id"], "Plan")
    return _dumps({"line_id": _plain(line_id), "data_used_gb": _plain(line["data_used_gb"]),
                   "data_limit_gb": _plain(plan["data_limit_gb"]),
                   "data_refueling_gb": _plain(line["data_refueling_gb"]), "cycle_end_date": "2025-02-28"})


def _set_roaming(db: Store, customer_id: Any, line_id: Any, on: bool) -> str:
    line = _target_line(db, customer_id, line_id)
    word = "enabled" if on else "disabled"
    if bool(line["roaming_enabled"]) == on:
        return f"Roaming was already {word}"
    line["roaming_enabled"] = on
    db.put("lines", line["line_id"], line)
    return f"Roaming {word} successfully"


@_agent_tool
def enable_roaming(db: Store, /, customer_id: str, line_id: str) -> str:
    """Enables international roaming on a line.

    Args:
        customer_id: ID of the customer who owns the line.
        line_id: ID of the line to enable roaming for.
    """
    return _set_roaming(db, customer_id, line_id, True)


@_agent_tool
def disable_roaming(db: Store, /, customer_id: str, line_id: str) -> str:
    """Disables international roaming on a line.

    Args:
        customer_id: ID of the customer who owns the line.
        line_id: ID of the line to disable roaming for.
    """
    return _set_roaming(db, customer_id, line_id, False)


@_agent_tool
def transfer_to_human_agents(db: Store, /, summary: str) -> str:
    """Transfer the user to a human agent, with a summary of the user's issue. Only transfer if
     -  the user explicitly asks for a human agent
     -  given the policy and the available tools, you cannot solve the user's issue.

    Args:
        summary: A summary of the user's issue.
    """
    return "Transfer successful"


def _charge(db: Store, customer_id: Any, amount: float, description: str) -> None:
    """tau2's _apply_one_time_charge: onto the customer's first Draft bill, or a new Draft bill for March."""
    customer = _customer(db, customer_id)
    bill = next((b for b in _bills(db, customer) if b["status"] == "Draft"), None)
    if bill is None:
        bill = {"bill_id": _new_bill_id(db), "customer_id": customer_id, "period_start": "2025-03-01",
                "period_end": "2025-03-31", "issue_date": "2025-03-01", "total_due": 0.0, "due_date": "2025-03-15",
                "line_items": [], "status": "Draft"}
        customer["bill_ids"].append(bill["bill_id"])
        db.put("customers", customer["customer_id"], customer)
    bill["line_items"].append({"description": description, "amount": float(amount), "date": TODAY,
                               "item_type": "Credit" if amount < 0 else "Charge"})
    bill["total_due"] += amount
    db.put("bills", bill["bill_id"], bill)


@_agent_tool
def refuel_data(db: Store, /, customer_id: str, line_id: str, gb_amount: float) -> str:
    """Refuels data for a specific line, adding to the customer's bill. Checks: Line status must be Active, Customer
    owns the line. Logic: Adds data to the line and charges customer based on the plan's refueling rate.

    Args:
        customer_id: ID of the customer who owns the line.
        line_id: ID of the line to refuel data for.
        gb_amount: Amount of data to add in gigabytes.
    """
    line = _target_line(db, customer_id, line_id)  # QUIRK: the line's status is not checked, nor a 2 GB cap
    if gb_amount <= 0:  # a string fails here with Python's "'<=' not supported ..."
        raise ValueError("Refuel amount must be positive")
    price = _get(db, "plans", line["plan_id"], "Plan")["data_refueling_price_per_gb"]
    charge = gb_amount * price
    line["data_refueling_gb"] += gb_amount
    db.put("lines", line["line_id"], line)
    _charge(db, customer_id, charge, f"Data refueling: {gb_amount} GB at ${price}/GB")
    return _dumps({"message": f"Successfully added {gb_amount} GB of data for line {line_id} for ${charge:.2f}",
                   "new_data_refueling_gb": _plain(line["data_refueling_gb"]), "charge": _plain(charge)})


TOOLS = [get_customer_by_phone, get_customer_by_id, get_customer_by_name, get_details_by_id, suspend_line,
         resume_line, get_bills_for_customer, send_payment_request, get_data_usage, enable_roaming, disable_roaming,
         transfer_to_human_agents, refuel_data]
WRITE_TOOLS = {"suspend_line", "resume_line", "send_payment_request", "enable_roaming", "disable_roaming",
               "refuel_data"}

# ---------------------------------------------------------------------------------------------------------------
# Agent-side functions only task initialisation and the evaluator call


@_agent_tool
def set_data_usage(db: Store, /, customer_id: str, line_id: str, data_used_gb: float) -> str:
    line = _target_line(db, customer_id, line_id)
    line["data_used_gb"] = data_used_gb  # stored as given (an int stays an int)
    db.put("lines", line["line_id"], line)
    return f"Data usage set to {data_used_gb} GB for line {line_id}"


@_agent_tool
def suspend_line_for_overdue_bill(db: Store, /, customer_id: str, line_id: str, new_bill_id: str,
                                  contract_ended: bool) -> str:
    line = _get(db, "lines", line_id, "Line")
    if line["status"] != "Active":
        raise ValueError("Line must be active to suspend for unpaid bill")
    amount = _get(db, "plans", line["plan_id"], "Plan")["price_per_month"]
    if amount <= 0:
        raise ValueError("Amount must be positive for overdue bill")
    customer = _customer(db, customer_id)
    if any(b["status"] == "Overdue" for b in _bills(db, customer)):
        raise ValueError("Customer already has an overdue bill")
    db.put("bills", new_bill_id, {
        "bill_id": new_bill_id, "customer_id": customer_id, "period_start": "2025-01-01", "period_end": "2025-01-31",
        "issue_date": "2025-01-01", "total_due": 0.0 + amount, "due_date": "2025-01-15",
        "line_items": [{"description": f"Charge for line {line['line_id']}", "amount": float(amount), "date": TODAY,
                        "item_type": "Charge"}], "status": "Overdue"})
    customer["bill_ids"].append(new_bill_id)
    db.put("customers", customer["customer_id"], customer)
    line.update(status="Suspended", suspension_start_date=TODAY)
    if contract_ended:
        line["contract_end_date"] = "2025-01-31"
    db.put("lines", line["line_id"], line)
    return f"Line {line_id} suspended for unpaid bill {new_bill_id}. Contract ended: {contract_ended}"


@_agent_tool
def assert_data_refueling_amount(db: Store, /, customer_id: str, line_id: str, expected_amount: float) -> bool:
    return abs(_target_line(db, customer_id, line_id)["data_refueling_gb"] - expected_amount) < 1e-6


@_agent_tool
def assert_no_overdue_bill(db: Store, /, overdue_bill_id: str) -> bool:
    bill = db.get("bills", overdue_bill_id)
    return bill is None or bill["status"] == "Paid"


@_agent_tool
def assert_line_status(db: Store, /, customer_id: str, line_id: str, expected_status: str) -> bool:
    return _target_line(db, customer_id, line_id)["status"] == expected_status


AGENT_FUNCTIONS = {fn.__name__: fn for fn in TOOLS + [set_data_usage, suspend_line_for_overdue_bill,
                                                       assert_data_refueling_amount, assert_no_overdue_bill,
                                                       assert_line_status]}

# ---------------------------------------------------------------------------------------------------------------
# The sync between the two sides (tau2's TelecomEnvironment.sync_tools)


def sync(db: Store) -> None:
    """Copy the user's line onto the phone's surroundings; settle a paid request; raise the next payment request."""
    sur = db.get("phone", "surroundings")
    number = sur["phone_number"]
    if number is None:  # no user set (a bare env): nothing to sync
        return
    before = json.dumps(sur)
    found = db.query("lines", "json_extract(doc, '$.phone_number') = ?", (number,)) if isinstance(number, str) else []
    if not found:
        raise ValueError(f"Line with phone number {number} not found")
    line = found[0][1]
    plan = _get(db, "plans", line["plan_id"], "Plan")
    sur["line_active"] = line["status"] == "Active"
    sur["roaming_allowed"] = bool(line["roaming_enabled"])
    sur["mobile_data_usage_exceeded"] = line["data_used_gb"] >= plan["data_limit_gb"] + line["data_refueling_gb"]
    req = sur["payment_request"]
    if req is not None and req["paid"]:
        bill = _get(db, "bills", req["bill_id"], "Bill")
        bill["status"] = "Paid"
        db.put("bills", bill["bill_id"], bill)
        sur["payment_request"] = None
    if sur["payment_request"] is None:
        waiting = [b for b in _bills(db, _customer_by_phone(db, number)) if b["status"] == "Awaiting Payment"]
        if waiting:
            sur["payment_request"] = {"bill_id": waiting[0]["bill_id"], "amount_due": float(waiting[0]["total_due"]),
                                      "paid": False}
    if json.dumps(sur) != before:
        db.put("phone", "surroundings", sur)


def run_function(env: Env, env_type: str, name: str, arguments: dict) -> Any:
    """tau2's run_env_function_call: any function of either side by name (tools, init helpers, assertions), then a
    sync. Raises what the function raises."""
    funcs = phone_tasks.USER_FUNCTIONS if env_type == "user" else AGENT_FUNCTIONS
    if name not in funcs:
        raise ValueError(f"Function {name} not found in {env_type} tools")
    result = funcs[name](env.db, **copy.deepcopy(arguments))
    sync(env.db)
    return result


# ---------------------------------------------------------------------------------------------------------------
# Hashes in tau2's form: sha256(json.dumps(model_dump(), sort_keys=True)) of each side's database


def agent_db_hash(env: Env) -> str:
    dump = {c: [rec for _, rec in env.db.scan(c)] for c in AGENT_COLLECTIONS}
    return hashlib.sha256(json.dumps(dump, sort_keys=True).encode()).hexdigest()


def user_db_hash(env: Env) -> str:
    dump = {"device": env.db.get("phone", "device"), "surroundings": env.db.get("phone", "surroundings")}
    return hashlib.sha256(json.dumps(dump, sort_keys=True).encode()).hexdigest()


def action_matches(gold: dict, name: str, arguments: Any) -> bool:
    """tau2's Action.compare_with_tool_call: same name, and equal values on compare_args (None: every argument the
    call gave; []: none). Who called is not compared."""
    if gold["name"] != name:
        return False
    keys = gold.get("compare_args")
    if keys == []:
        return True
    if not isinstance(arguments, dict):
        return False
    keys = list(arguments) if keys is None else keys
    return ({k: v for k, v in arguments.items() if k in keys}
            == {k: v for k, v in gold.get("arguments", {}).items() if k in keys})


# ---------------------------------------------------------------------------------------------------------------
# The world


class TelecomWorld(World):
    refuse_bad_arguments = False  # tau2 passes arguments straight through: Python's own TypeError texts

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.user_tools = {fn.__name__: fn for fn in phone.USER_TOOLS}
        self.write_tools |= phone.USER_WRITE_TOOLS
        self._init_rows: dict[str, list[tuple[str, int, str, str]]] = {}
        self._gold: dict[str, tuple[str, str]] = {}
        self._gold_delta: dict[str, dict] = {}  # (gold_rows)

    def after_call(self, env: Env) -> None:
        sync(env.db)

    def init_env(self, env: Env, task: Task) -> None:
        """tau2's set_state(initialization_actions): each function on its side, a sync after each and at the end.
        The result depends on the task alone, so it is computed once and later envs copy its rows."""
        rows = self._init_rows.get(task.id)
        if rows is None:
            init_actions(env, (task.raw or {}).get("initial_state", {}).get("initialization_actions") or [])
            self._init_rows[task.id] = [(c, pos, rid, doc) for c in self.collections
                                        for pos, rid, doc in env.con.execute(f"SELECT pos, id, doc FROM main.{c}")]
            return
        for coll, pos, rid, doc in rows:
            env.con.execute(f"INSERT INTO main.{coll} (pos, id, doc) VALUES (?, ?, ?)", (pos, rid, doc))

    def gold_env(self, task: Task) -> Env:
        """tau2's reference environment: initialisation, then the gold actions with no sync after them and their
        errors ignored (so its phone can lag behind the database: never part of a telecom reward)."""
        env = self.new_env(task)
        for a in task.actions:
            fn = (self.user_tools if a.get("requestor") == "user" else self.tools).get(a["name"])
            try:
                fn(env.db, **copy.deepcopy(a.get("arguments") or {}))
            except Exception:  # noqa: BLE001,S110 - tau2's make_tool_call errors are ignored here
                pass
        return env

    def gold_hashes(self, task: Task) -> tuple[str, str]:
        """Both hashes of the gold environment, computed once per task (its gold actions depend on nothing else)."""
        if task.id not in self._gold:
            gold = self.gold_env(task)
            self._gold[task.id] = (agent_db_hash(gold), user_db_hash(gold))
            gold.close()
        return self._gold[task.id]

    def score(self, task: Task, env: Env, messages: list[dict] | None = None, check_outputs: bool = False,
              stop_reason: str | None = None):
        """tau2's evaluate_simulation for telecom. reward = product of the env assertions' met flags [x 1 iff every
        gold action appears among the calls, for ACTION tasks]; 0 if the conversation did not end by a stop or a
        transfer (when stop_reason is given). info["completion"]: the share of assertions met, whatever the end."""
        crit = (task.raw or {}).get("evaluation_criteria") or {}
        basis = crit.get("reward_basis") or ["ENV_ASSERTION"]
        try:
            sync(env.db)  # the evaluator syncs once after replaying the conversation
        except Exception:  # noqa: BLE001,S110 - a failing sync leaves the state as it is, as after a failed call
            pass
        met = []
        for a in crit.get("env_assertions") or []:
            try:
                met.append(run_function(env, a["env_type"], a["func_name"], a.get("arguments") or {})
                           == a.get("assert_value", True))
            except Exception:  # noqa: BLE001 - an assertion that raises is not met
                met.append(False)
        matches = [any(action_matches(g, c.name, c.arguments) for c in env.calls) for g in task.actions]
        db_match = (agent_db_hash(env), user_db_hash(env)) == self.gold_hashes(task)  # tau2's db_check (info only)
        breakdown = {}
        if "DB" in basis:
            breakdown["DB"] = float(db_match)
        if "ENV_ASSERTION" in basis:
            breakdown["ENV_ASSERTION"] = float(all(met))
        if "ACTION" in basis:
            breakdown["ACTION"] = float(all(matches))
        ended = stop_reason is None or stop_reason in VALID_ENDS
        reward = float(ended and all(v == 1.0 for v in breakdown.values()))
        info = {"reward_basis": basis, "reward_breakdown": breakdown, "env_assertions_met": met,
                "action_matches": matches, "db_match": db_match, "completion": sum(met) / len(met) if met else reward,
                "stop_ok": ended, "calls": len(env.calls), "user_calls": sum(c.requestor == "user" for c in env.calls),
                "write_calls": sum(c.write for c in env.calls), "errors": sum(c.error for c in env.calls)}
        if not db_match:  # the records both sides (company and phone) hold otherwise than the gold run left them
            info["db_rows"] = self.db_rows(env, self.gold_rows(task))
        return reward, info

    def gold_rows(self, task: Task) -> dict:
        """The gold environment's written records (World._delta), computed once per task: db_rows' reference."""
        if task.id not in self._gold_delta:
            gold = self.gold_env(task)
            self._gold_delta[task.id] = self._delta(gold)
            gold.close()
        return self._gold_delta[task.id]


def init_actions(env: Env, actions: list[dict]) -> None:
    """Run initialization actions ({env_type, func_name, arguments}) on an env, each followed by a sync, then one
    more sync (tau2's Environment.set_state)."""
    for a in actions:
        run_function(env, a["env_type"], a["func_name"], a.get("arguments") or {})
    sync(env.db)


def load_tasks(src, split_file: dict) -> list[Task]:
    where = {tid: s for s in ("train", "test") for tid in split_file.get(s, [])}
    tasks = []
    for t in json.loads(src.read_bytes("tasks.json")):
        scenario = t.get("user_scenario") or {}
        text = render_instructions(scenario.get("instructions"))
        if scenario.get("persona"):
            text += f"\n\nPersona:\n{scenario['persona']}"
        actions = [{"name": a["name"], "arguments": a.get("arguments") or {},
                    "requestor": a.get("requestor", "assistant"), "compare_args": a.get("compare_args")}
                   for a in (t.get("evaluation_criteria") or {}).get("actions") or []]
        tasks.append(Task(id=f"telecom/{t['id']}", domain="telecom", split=where.get(t["id"], "base"),
                          instructions=text, actions=actions, raw=t))
    return tasks


def build_world(data_dir: str | None = None) -> TelecomWorld:
    """The telecom World: both TOML databases in one template, 13 + 30 tools, the policy and the 114 tasks."""
    src = find_data("telecom", data_dir)
    raw_db, raw_user = src.read_bytes("db.toml"), src.read_bytes("user_db.toml")
    db = normalise(tomllib.loads(raw_db.decode()), tomllib.loads(raw_user.decode()))
    rules = (f"<main_policy>\n{src.read_bytes('main_policy.md').decode()}\n</main_policy>\n<tech_support_policy>\n"
             f"{src.read_bytes('tech_support_manual.md').decode()}\n</tech_support_policy>")
    try:
        split = json.loads(src.read_bytes("split_tasks.json"))
    except (FileNotFoundError, KeyError):
        split = {}
    world = TelecomWorld("telecom", db, content_key(raw_db, raw_user, NORMALISER_VERSION), TOOLS,
                         WRITE_TOOLS, rules, load_tasks(src, split))
    return world


if __name__ == "__main__":
    import statistics
    import time

    ap = argparse.ArgumentParser(description="Replay one telecom task's gold actions (both sides); time env creation.")
    ap.add_argument("--task", default=None, help="task id without 'telecom/' (default: the first test task)")
    ap.add_argument("--data-dir", default=None, help="tau2 data folder (default: found by tau2_data.find_data)")
    args = ap.parse_args()
    world = build_world(args.data_dir)
    task = world.tasks("test")[0] if args.task is None else world.task(f"telecom/{args.task}")
    print(f"{task.id} ({task.split})\n")
    env = world.replay(task.actions, world.new_env(task))
    for c in env.calls:
        print(f"[{c.requestor}] {c.name}({json.dumps(c.arguments)})\n  -> {c.output[:200]}")
    reward, info = world.score(task, env, stop_reason="user_stop")
    print(f"\nreward = {reward}  completion = {info['completion']}  breakdown = {info['reward_breakdown']}\n")

    # Timings over all 114 tasks, beside tau2's own (TELECOM.md section 10, same machine, medians of its ranges).
    def per_task_ms(fn) -> float:
        times = []
        for t in world.tasks():
            t0 = time.perf_counter()
            fn(t)
            times.append(1000 * (time.perf_counter() - t0))
        return statistics.median(times)

    cold = per_task_ms(lambda t: world.new_env(t).close())  # first env of each task: runs the initialisation
    warm = min(per_task_ms(lambda t: world.new_env(t).close()) for _ in range(3))  # later envs copy its rows
    envs = {t.id: world.replay(t.actions, world.new_env(t)) for t in world.tasks()}
    first = per_task_ms(lambda t: world.score(t, envs[t.id], stop_reason="user_stop"))  # builds the gold hashes
    scoring = per_task_ms(lambda t: world.score(t, envs[t.id], stop_reason="user_stop"))
    print("tau2: the middle of TELECOM.md's measured ranges (4.3-8.4 ms per env + init, 43-79 ms per scoring)")
    for name, ours, theirs in (("fresh env + task initialisation (first, per task)", cold, 6.35),
                               ("fresh env + task initialisation (later)", warm, 6.35),
                               ("scoring one episode (first, per task)", first, 61.0),
                               ("scoring one episode (later)", scoring, 61.0)):
        print(f"{name:52s} {ours:7.3f} ms median   tau2 ~{theirs} ms   ratio {theirs / ours:6.1f}x")
