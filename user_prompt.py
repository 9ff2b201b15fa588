"""What the simulated customer is told and what it sees: its system prompt, the conversation with roles swapped.

MUA-RL's customer is a chat model that knows the task's hidden instructions (user_sim.py calls it). This file is
everything that model reads, so that every customer (a hosted model, a `vllm serve` endpoint, the CPU demo's own
customer model, demo/customer.py, which is trained on exactly these requests) is sent the same thing, built by the same
function:

    simulator_messages(instructions, history)  ->  [system: the prompt with the instructions,
                                                    user: GREETING, assistant: <customer's 1st message>,
                                                    user: <agent's reply>, assistant: <customer>, ...]

Two views of one conversation. rollout.py keeps the *agent's* view: its own turns are "assistant", the customer's
"user". The customer model needs the reverse, so every request is rebuilt from the agent-side text with the roles
swapped, under a system prompt carrying the hidden instructions. The agent's tool calls and results never reach the
customer: a real one cannot see the company's systems, and reading them would leak database facts into its answers.
A customer with tools of its own (dual-control worlds: telecom) keeps *its* calls and results in its view.

Departures (see user_sim.py for the rest): the prompt is this project's own wording of tau2's simulation guidelines;
the opening answers a fixed greeting (GREETING); consecutive messages of one role are merged, so the request always
alternates (some chat templates refuse anything else); an agent turn with no text becomes NO_REPLY; special-token
look-alikes in any content (the policy's words above all) are broken by a zero-width space (tools.as_text), so the
customer's server renders them as text, never as a forged turn.
"""

from __future__ import annotations

import json
import re

from domains.dual_control import customer_only
from tools import as_text

STOP, TRANSFER, OUT_OF_SCOPE = "###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###"

# What the customer "hears" before its first message. The agent never says it (its conversation starts with the
# customer's), but a chat model answers better when it has something to answer; one greeting keeps it reproducible.
GREETING = "Hi! How can I help you today?"
NO_REPLY = "(the agent sent an empty message)"  # what it "hears" after an agent turn with no text (see below)


def is_terminal(text: str | None) -> str | None:
    """The end marker a user message carries (the earliest, if it somehow carries several), or None."""
    found = [(text.find(m), m) for m in (STOP, TRANSFER, OUT_OF_SCOPE) if m in text] if isinstance(text, str) else []
    return min(found)[1] if found else None


# ---------------------------------------------------------------------------------------------------------------
# The customer's prompt and its view of the conversation


# tau2's guidelines for a customer with tools (simulation_guidelines_tools.md), in this project's words.
PHONE_RULES = """

Your phone: you have tools that act on your own device. The agent cannot see them, nor what you do with them.
- In one turn, either call tools or write a message to the agent, never both. Only your messages reach the agent.
- Use a tool only when the agent asks you to do something on your device, or when you need it to answer the \
agent's question. If you are unsure what the agent wants you to do, ask.
- Do one action at a time. If the agent asks for several at once, say you can only do one at a time and ask \
which comes first.
- Report only what the tools actually returned; never invent a result. If a call fails, correct it and try again."""


def system_prompt(instructions: str, tools: bool = False) -> str:
    """The simulator's system prompt: who it is, the house rules (with `tools`, also the rules for the customer's own
    tools), then what it wants (the hidden instructions). The situation comes last, as tau2 lays its prompt out
    (guidelines, then <scenario>): the facts a customer must repeat sit right before the conversation, not behind
    ~300 tokens of rules, which is what lets a small customer model (demo/customer.py) keep to them."""
    return f"""You are playing a customer who has contacted a company's customer service. The other side of this \
chat is the company's support agent. You are the customer, never the agent: you cannot see or use the company's \
systems, and you only know what your situation below tells you.

How to write:
- Write exactly one message: your next turn in the chat, nothing else. Keep it short and natural, like a \
real person typing to support.
- Begin with why you are getting in touch; after that, give details only when the agent asks for them, a \
little at a time.
- Use only facts from your situation. If the agent asks for something your situation does not mention, say \
you don't know or don't have it. Never make up names, numbers, ids, addresses, dates or preferences.
- Say things in your own words; do not copy sentences from your situation.
- Stay in character. Only agree to an action if it is what your situation asks for.

How to end the chat (write the marker at the end of your message):
- {STOP} once everything you came for is done, or once it is clear it cannot be done.
- {TRANSFER} if the agent hands you over to a human agent.
- {OUT_OF_SCOPE} if the chat reaches a point your situation gives you no information to handle, so you \
cannot go on.{PHONE_RULES if tools else ""}

Your situation (private; the agent cannot see it):
<situation>
{instructions.strip()}
</situation>"""


# Tool-call markup, tool results and reasoning that might sit inside an agent's text: never shown to the customer.
_HIDDEN = re.compile(r"<(tool_call|tool_response|think)>.*?(</\1>|$)", re.S)
# A leading reasoning block in the simulator's own reply (a thinking model served without a reasoning parser).
_LEADING_THINK = re.compile(r"^\s*<think>.*?</think>", re.S)


def _own_call(m: dict, ids: list[str], n: int) -> dict:
    # The customer's own tool call or result, in its (swapped) view: its calls are the model's "assistant" calls,
    # their results "tool" messages tied to them by id. The wire carries arguments as a JSON string; a malformed
    # call's arguments were kept as the raw text the model wrote, and go back as they came.
    if m["role"] == "tool":
        return {"role": "tool", "tool_call_id": ids.pop(0) if ids else "call_x", "content": m["content"]}
    calls = []
    for c in m["tool_calls"]:
        args = c["function"]["arguments"]
        ids.append(f"call_{n + len(calls)}")  # n: calls earlier in this request
        calls.append({"id": ids[-1], "type": "function", "function": {
            "name": str(c["function"]["name"]), "arguments": args if isinstance(args, str) else json.dumps(args)}})
    return {"role": "assistant", "content": m.get("content") or "", "tool_calls": calls}


def simulator_messages(instructions: str, history: list[dict], variant: dict | None = None,
                       tools: bool = False) -> list[dict]:
    """Agent-side text conversation -> the simulator's API messages (system prompt + roles swapped).

    history: [{"role": "user" | "assistant", "content": str}, ...] as the agent saw it (user = customer), plus, in
    a dual-control world, the customer's own tool calls and results (customer_only), which stay in its view.
    Returns [system, user: GREETING, assistant: <customer's 1st msg>, user: <agent's reply>, ...].
    `variant` (a benchmark's own customer, carried by task.spec["simulator"], e.g. ACEBench's): its system text,
    greeting, the role of the customer's own turns and prefixes cut from the agent's, verbatim, nothing else (its
    replies are then kept as they come, unstripped)."""
    if variant is not None:
        msgs = [{"role": "system", "content": variant["system"]}, {"role": "user", "content": variant["greeting"]}]
        for m in history:
            text = m["content"]
            if m["role"] == "assistant":
                text = next((text[len(p):] for p in variant.get("strip", []) if text.startswith(p)), text)
            msgs.append({"role": variant["own_role"] if m["role"] == "user" else "user", "content": text})
        return [{**m, "content": as_text(m["content"])} for m in msgs]  # special-token look-alikes stay text
    swap = {"user": "assistant", "assistant": "user"}
    msgs: list[dict] = []
    pending: list[str] = []  # ids of the customer's calls whose results have not come yet
    for m in history:
        role, content = m.get("role"), m.get("content")
        if customer_only(m):
            msgs.append(_own_call(m, pending, sum(len(x.get("tool_calls", ())) for x in msgs)))
            continue
        if role not in swap or not isinstance(content, str):
            continue  # system prompts, tool messages and tool-call-only turns are the agent's business
        content = (_HIDDEN.sub("", content) if role == "assistant" else content).strip()  # hide stray tool markup
        if not content:
            continue
        if msgs and msgs[-1]["role"] == swap[role] and "tool_calls" not in msgs[-1]:  # two agent texts in a row
            msgs[-1]["content"] += "\n\n" + content  # (e.g. around a tool call)
        else:
            msgs.append({"role": swap[role], "content": content})
    if not msgs or msgs[0]["role"] != "user":  # the customer's opening answered the greeting; say the greeting
        msgs.insert(0, {"role": "user", "content": GREETING})
    if msgs[-1]["role"] == "assistant":
        # The agent's last turn had no text (a bare tool call, or nothing), yet rollout.py handed over. Say so, not
        # refuse: a real customer would nudge, and aborting would hide the very turns RL should learn to avoid.
        msgs.append({"role": "user", "content": NO_REPLY})
    msgs = [{"role": "system", "content": system_prompt(instructions, tools)}] + msgs
    return [{**m, "content": as_text(m["content"])} for m in msgs]  # marker look-alikes reach the server as text


# ---------------------------------------------------------------------------------------------------------------
# What comes back: the reply of a chat endpoint, checked (anything else is garbage, retried by user_sim.LLMUser)


class _Garbage(Exception):
    """The server answered 200 but the answer holds no usable message (retried like a 5xx)."""


def _content_of(resp, verbatim: bool = False) -> str:
    # The openai client returns the raw body text (a str) when the server does not send JSON, so every step here
    # uses getattr: anything that is not "choices[0].message.content is a non-empty string" is garbage.
    choices = getattr(resp, "choices", None)
    if not choices:
        raise _Garbage(f"no choices in the response ({type(resp).__name__})")
    content = getattr(getattr(choices[0], "message", None), "content", None)
    if not isinstance(content, str):
        raise _Garbage(f"message content is {type(content).__name__}, not a string")
    if not content.strip():
        raise _Garbage("empty message content")
    if verbatim:  # a benchmark that passes the reply on as it came (ACEBench)
        return content
    content = _LEADING_THINK.sub("", content).strip()
    if not content:
        raise _Garbage("empty message content")
    return content  # a reply cut by max_tokens (finish_reason "length") is still a usable customer message


def _turn_of(resp) -> tuple[str, list[tuple]]:
    """A reply to a request that offered tools: (text, [(name, arguments), ...]). With no calls it must be text
    (_content_of); with calls, any text beside them stays private to the customer (as in tau2)."""
    msg = getattr((getattr(resp, "choices", None) or [None])[0], "message", None)
    raw = getattr(msg, "tool_calls", None)
    calls = []
    for c in raw if isinstance(raw, list) else []:
        fn = getattr(c, "function", None)
        name, args = getattr(fn, "name", None), getattr(fn, "arguments", None)
        try:  # bad JSON stays the raw text: env.call answers it with an error observation (counted, as in tau2)
            args = json.loads(args) if isinstance(args, str) else args
        except (RecursionError, ValueError):
            pass
        calls.append((name, args))
    if not calls:
        return _content_of(resp), []
    text = getattr(msg, "content", None)
    return (_LEADING_THINK.sub("", text).strip() if isinstance(text, str) else ""), calls


if __name__ == "__main__":
    # One request as a customer model receives it: the agent asked for the order id; the customer answers next.
    history = [{"role": "user", "content": "Hi, I want to cancel an order."},
               {"role": "assistant", "content": "Sure. <tool_call>{\"name\": \"x\"}</tool_call>What is the order id?"}]
    for m in simulator_messages("You want to cancel order #W123. Give the id when asked.", history):
        print(f"--- {m['role']}\n{m['content']}")
    print("\nend marker of 'Thanks! ###STOP###':", is_terminal("Thanks! ###STOP###"))
