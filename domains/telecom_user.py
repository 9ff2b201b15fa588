"""The scripted telecom customer: tau2's dual-control tasks played with no LLM, for tests and CPU runs.

In telecom the customer's phone is broken in a way the task's initial state chose (airplane mode on, data off, a
bad APN...) and the gold actions say how to fix it, on both sides: 393 of tau2's 516 gold actions are the
customer's own (requestor "user": toggle_airplane_mode, reseat_sim_card, reboot_device...), the rest the agent's
(refuel_data, enable_roaming, transfer_to_human_agents...). This customer knows its task's gold actions and
performs its own side of them, through the same path an LLM customer's tool calls take (dual_control.Phone ->
env.call(..., requestor="user")), but only when the agent asks for them, in words: the agent's job is still to
find out what is wrong and tell the customer what to do. It then reports what its phone said. The script:

    1. opening: the problem, by the task's category, and who the customer is (the task's known info)
    2. the agent's last message asks for one of the customer's pending gold actions (its tool name, with spaces or
       underscores, or the words in ASKS)  -> run it with the gold arguments, report the tool's output
    3. every gold action done, on both sides                  -> "that fixed it" + ###STOP###
    4. the agent names a diagnostic tool of the phone's that needs no arguments (check_status_bar,
       run_speed_test...)                                     -> run it, report the output
    5. anything else                                          -> the problem is still there; what should I do?

It is one module with scripted_first_message / scripted_reply, the DOMAINS row's `script` (domains/__init__.py):
user_sim.ScriptedUser hands it the task (tau2's tasks have no generated spec) and, each turn, the phone.

Departures from tau2's LLM customer: it never paraphrases, never improvises, and considers the task solved when
the gold actions were done (a real customer checks its phone: tau2 scores the phone's state, see TELECOM.md
section 8); the agent's gold actions count as done once the agent made a successful call of that name.
"""

from __future__ import annotations

import copy
import inspect
import re

from domains.dual_control import gold_requestors

STOP = "###STOP###"  # user_sim.STOP (not imported: user_sim imports domains, and a circle is not allowed)

# How a support agent asks for each of the customer's gold actions, besides naming the tool (lower-cased text).
ASKS = {
    "toggle_airplane_mode": r"airplane|flight mode",
    "set_network_mode_preference": r"network mode|network (type|preference)|\b[2345]g\b|\blte\b",
    "grant_app_permission": r"permission",
    "toggle_roaming": r"roaming",
    "toggle_data": r"(mobile|cellular) data|\bdata (on|off)\b|(turn|switch) (on|off) (your |the )?(mobile )?data\b",
    "reboot_device": r"reboot|restart",
    "reseat_sim_card": r"\bsim\b",
    "reset_apn_settings": r"\bapn",
    "toggle_wifi_calling": r"wi-?fi calling",
    "toggle_data_saver_mode": r"data saver",
    "disconnect_vpn": r"\bvpn\b",
    "make_payment": r"\bpay",
}
# The problem, by task category (tau2's ids start with it: "[mms_issue]break_app_sms_permission|...").
OPENINGS = {
    "mobile_data_issue": "my mobile data is not working properly: it keeps stopping or it is very slow",
    "mms_issue": "I can't send MMS (picture) messages from my phone",
    "service_issue": "my phone has no service",
}


def _scenario(task) -> dict:
    # tau2's structured user instructions (reason_for_call, known_info, ...), when the task kept its source record
    return ((getattr(task, "raw", None) or {}).get("user_scenario") or {}).get("instructions") or {}


def _problem(task) -> str:
    category = re.match(r"\[(\w+)\]", str(task.id).split("/")[-1])
    return OPENINGS.get(category.group(1) if category else "", "my phone is not working properly")


def scripted_first_message(task) -> str:
    """The opening: what is wrong, and who is asking (tau2's known info, turned into the first person)."""
    known = str(_scenario(task).get("known_info") or "")
    known = re.sub(r"\bYou are\b", "I am", re.sub(r"\bYour\b", "My", known))
    return f"Hi, {_problem(task)}. {known}".strip()


# ---------------------------------------------------------------------------------------------------------------
# A turn


def _asks_for(said: str, name: str) -> bool:
    return name in said or name.replace("_", " ") in said or bool(re.search(ASKS.get(name, r"(?!)"), said))


def _pending(task, env) -> tuple[list[dict], list[dict]]:
    """The gold actions not done yet: (the customer's, the agent's). A customer action is done when a successful
    customer call with its name and arguments is on the env's log (each call counts once, for one action)."""
    done = [c for c in env.calls if c.requestor == "user" and not c.error]
    agent_ok = {c.name for c in env.calls if c.requestor == "assistant" and not c.error}
    mine, theirs = [], []
    for a, who in zip(task.actions, gold_requestors(task)):
        if who != "user":
            theirs += [] if a["name"] in agent_ok else [a]
            continue
        match = next((c for c in done if c.name == a["name"] and c.arguments == a.get("arguments", {})), None)
        if match is None:
            mine.append(a)
        else:
            done.remove(match)
    return mine, theirs


def _no_arguments(fn) -> bool:
    # a tool the customer can run on its own when asked: every parameter after the database has a default
    return all(p.default is not p.empty for p in list(inspect.signature(fn).parameters.values())[1:])


def scripted_reply(task, history: list[dict], phone) -> str | None:
    """The customer's next message (it may run one tool on its phone first). None: the phone hit a cap."""
    said = history[-1]["content"].lower() if history and history[-1]["role"] == "assistant" else ""
    mine, theirs = _pending(task, phone.env)
    asked = next((a for a in mine if _asks_for(said, a["name"])), None)
    if asked is None and (mine or theirs):  # 4. a diagnostic the agent named, if it needs no arguments
        name = next((n for n, fn in phone.env.world.user_tools.items() if n in said and _no_arguments(fn)), None)
        asked = {"name": name, "arguments": {}} if name else None
    if asked is not None:
        out = phone.run([(asked["name"], copy.deepcopy(asked.get("arguments", {})))])[0]
        return None if phone.stop else f"Okay, I did that ({asked['name'].replace('_', ' ')}). My phone says:\n{out}"
    if not mine and not theirs:
        return "That fixed it, thank you! " + STOP
    return f"Sorry, {_problem(task)}, still. What should I do on my phone?"


if __name__ == "__main__":
    # A made-up telecom-like task on a one-switch world: the customer waits until the agent asks, then acts.
    import json

    from domains.base import Task, World, content_key
    from domains.dual_control import Phone

    def toggle_data(db) -> str:
        """Toggle mobile data on the phone."""
        on = not db.get("phone", "p")["data"]
        db.put("phone", "p", {"id": "p", "data": on})
        return f"Mobile data is now {'on' if on else 'off'}.\nStatus Bar: {'Data Enabled' if on else 'Data Disabled'}"

    phone_db = {"phone": {"p": {"id": "p", "data": False}}}
    world = World("demo", phone_db, content_key(json.dumps(phone_db), "telecom-user-demo"), [], set(), "")
    world.user_tools = {"toggle_data": toggle_data}
    task = Task(id="demo/[mobile_data_issue]data_mode_off", domain="demo", split="test", instructions="",
                actions=[{"name": "toggle_data", "arguments": {}, "requestor": "user"}],
                raw={"user_scenario": {"instructions": {"known_info": "You are John Smith."}}})
    env, history = world.new_env(task), [{"role": "user", "content": scripted_first_message(task)}]
    for agent in ["What is your account number?", "Please turn your mobile data on.", "Is it working now?"]:
        history.append({"role": "assistant", "content": agent})
        history.append({"role": "user", "content": scripted_reply(task, history, Phone(env, history, 30))})
    for m in history:
        print(f"{m['role']:>9}: {m['content'] if not m.get('tool_calls') else m['tool_calls']}")
