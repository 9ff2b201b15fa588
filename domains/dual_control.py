"""Dual control: the customer has tools too. The customer's phone, and tau2's limits on a two-sided
episode.

In tau2's telecom domain (TELECOM.md section 1) the agent fixes a phone it cannot touch: it has 13
tools on the company database, the customer has 30 on its own device (toggle airplane mode, reseat
the SIM, run a speed test...), and the task is solved only when the agent talks the customer into
acting. Both sides act on ONE environment; a user tool call goes to the env and its result back to
the customer only, an agent call back to the agent only, and neither side sees the other's calls,
only the other's text. This file is the runtime half of that contract (domains/base.py has the
other: `Env.call(name, arguments, requestor=)`, `World.user_tools`, and `customer_only`, which every
episode asks of its messages):

    Phone            one customer turn's access to its tools: runs each call on the episode's env as requestor
                     "user", logs call and result in the episode's readable messages, stops at a cap
    too_many_errors  tau2's rule: 10 failed tool calls in all, from either side, end the episode (never reset)

The customer model (user_sim.LLMUser) and the scripted customer (domains/telecom_user.py) both act
through a Phone, so a scripted test and an LLM run put the same calls on the same path.

How the calls are recorded (readable messages, as tau2 keeps its trajectory):
    {"role": "user", "content": <text beside the calls, usually "">, "requestor": "user",
     "tool_calls": [{"type": "function", "function": {"name": ..., "arguments": {...}}}]}
    {"role": "tool", "name": ..., "content": <output>, "requestor": "user"}        one per call, in order

Departures from tau2: none in the rules. The training turn cap counts the agent's tool executions +
the customer's replies (the paper's 30); the customer's own calls are capped per turn by it, or by
tau2's cap on messages (its max_steps, 200) where a rollout sets one (eval.py does in tau2's
worlds).
"""

from __future__ import annotations

import json

MAX_ERRORS = 10  # tau2's too-many-errors limit (orchestrator max_errors): tool errors in all, both sides


def own_call_view(m: dict, ids: list[str], n: int) -> dict:
    """A customer's own tool call or result as its chat model sees it (roles swapped): its calls are
    the model's "assistant" tool calls, their results "tool" messages tied to them by id (`ids`: the
    ids awaiting results; `n`: calls earlier in the request). Arguments travel as a JSON string; a
    malformed call's raw text as it came."""
    if m["role"] == "tool":
        return {"role": "tool", "tool_call_id": ids.pop(0) if ids else "call_x", "content": m["content"]}
    calls = []
    for c in m["tool_calls"]:
        args = c["function"]["arguments"]
        ids.append(f"call_{n + len(calls)}")
        calls.append({"id": ids[-1], "type": "function", "function": {
            "name": str(c["function"]["name"]), "arguments": args if isinstance(args, str) else json.dumps(args)}})
    return {"role": "assistant", "content": m.get("content") or "", "tool_calls": calls}


def too_many_errors(env) -> bool:
    """tau2's rule: the episode ends once MAX_ERRORS tool calls, from either side, have failed. The
    count is over the episode's whole call log and never reset (tau2's CLI help says "in a row"; its
    code counts them all)."""
    return sum(c.error for c in env.calls) >= MAX_ERRORS


def gold_requestors(task) -> list[str]:
    """Who performs each of the task's gold actions: "assistant" or "user" (tau2 tags each action
    with its requestor). Read from the action itself, else from the source record, else "assistant"
    (single-control)."""
    raw = ((getattr(task, "raw", None) or {}).get("evaluation_criteria") or {}).get("actions") or []
    if len(raw) != len(task.actions):  # e.g. a generated task: its actions are all the agent's
        raw = [{}] * len(task.actions)
    return [a.get("requestor") or r.get("requestor") or "assistant" for a, r in zip(task.actions, raw)]


class Phone:
    """The customer's own tools during one customer turn of a dual-control episode: runs its calls
    on the episode's env as requestor "user", logs each call and result in the episode's readable
    messages (`log`), and stops the turn when a cap is reached (`turns_left`: the calls a customer turn
    may make, or the messages left under tau2's message cap; or tau2's too-many-errors rule)."""

    def __init__(self, env, log: list[dict], turns_left: int, cap: str = "max_turns"):
        self.env, self.log, self.turns_left, self.cap = env, log, turns_left, cap
        self.new: list[dict] = []  # this turn's calls and results: the customer sees them in its next request
        self.calls, self.stop = 0, None  # tool executions this turn (each one a turn); why the turn was cut short

    def run(self, calls: list[tuple], content: str = "") -> list[str]:
        """One customer message's tool calls [(name, arguments)], run in order; returns their
        outputs."""
        new = [{"role": "user", "content": content, "requestor": "user",
                "tool_calls": [{"type": "function", "function": {"name": n, "arguments": a}} for n, a in calls]}]
        for name, args in calls:
            new.append({"role": "tool", "name": name, "content": self.env.call(name, args, requestor="user"),
                        "requestor": "user"})
        self.new += new
        self.log += new  # the episode's messages (transcripts, logs); rollout never renders these for the agent
        self.calls += len(calls)
        # errors first: when both caps are hit at once, tau2 reports too many errors
        used = len(self.new) if self.cap == "max_messages" else self.calls  # messages, or calls
        self.stop = "too_many_errors" if too_many_errors(self.env) else \
            self.cap if used >= self.turns_left else None
        return [m["content"] for m in new[1:]]




if __name__ == "__main__":
    # A toy dual-control world: the agent can only read a lamp's state, the customer can switch it.
    # The customer's phone runs a good call, an unknown tool and a malformed one: all three are
    # logged, two count as errors.
    import json

    from domains.base import World, content_key, customer_only

    def lamp_state(db) -> str:
        """Read the lamp's state (the agent's one tool)."""
        return json.dumps(db.get("lamps", "lamp"))

    def switch_lamp(db, on: bool) -> str:
        """Switch the lamp (a customer tool).

        Args:
            on: true to switch it on.
        """
        db.put("lamps", "lamp", {"id": "lamp", "on": bool(on)})
        return f"The lamp is now {'on' if on else 'off'}."

    lamp = {"lamps": {"lamp": {"id": "lamp", "on": False}}}
    world = World("lamp", lamp, content_key(json.dumps(lamp), "lamp-demo"), [lamp_state], set(), "Help with lamps.")
    world.user_tools = {"switch_lamp": switch_lamp}
    env, messages = world.new_env(), []
    phone = Phone(env, messages, turns_left=30)
    print(phone.run([("switch_lamp", {"on": True})]), "->", env.call("lamp_state", {}))
    print(phone.run([("fly_to_moon", {}), ("switch_lamp", '{"on": tru')]))  # unknown tool; arguments not JSON
    print(f"calls {phone.calls}, errors {sum(c.error for c in env.calls)}, stop {phone.stop}")
    print("agent calling the customer's tool:", env.call("switch_lamp", {"on": False}))  # the other side's: not found
    for m in messages:
        print(" ", json.dumps(m), "| customer only:", customer_only(m))
