"""The simulated customer: the other side of every MUA-RL rollout, and what it is told and sees.

MUA-RL's one new idea (Zhao et al. 2025, "Method") is to put a *user* inside the RL loop: while the
policy learns to call tools, a frozen LLM plays a customer who knows the task's hidden instructions
and reveals them only as the conversation asks, so requests are dynamic (it omits details, changes
its mind, insists). The reward still comes from the database, but the agent must earn its
information by asking. This file holds:

    the prompt    system_prompt(instructions): who the customer is, the house rules, its hidden situation;
                  simulator_messages(instructions, history): the agent-side conversation with roles
                  swapped
    User          the protocol rollout() and a run call on any customer
    LLMUser       a customer played by any OpenAI-compatible chat endpoint (a hosted model, a vLLM server)
    scripted      ScriptedUser and its kin: deterministic customers for generated tasks, no LLM needed
    USERS         the table `--user NAME` picks a row of

Two views of one conversation. rollout.py keeps the *agent's*: its own turns are "assistant", the
customer's "user". The customer model needs the reverse, so every request is rebuilt from the
agent-side text with the roles swapped. The agent's tool calls and results never reach the customer:
a real one cannot see the company's systems. In a dual-control world (tau2's telecom,
`world.user_tools`) the customer acts on its own phone: its calls run on the episode's env as
requestor "user" (domains/dual_control.Phone), it remembers them, the agent never sees them.

The opening is fixed per task: all G rollouts of a task start from the same first message, so a
group's reward differences come from the agent. Failures abort, they never score zero: a request
that fails for good (plumbing/chat_client.py retries first) raises UserError, and rollout.py drops
the episode from training.

Departures from the paper / tau2-bench:
1. The paper used GPT-4o-2024-11-20 at temperature 0 with its authors' prompt; any endpoint plays it
   here, with tau2's own guidelines in tau2's worlds (--user_prompt auto) and this project's wording
   elsewhere.
2. The opening answers a fixed greeting (GREETING); consecutive messages of one role are merged; an
   agent turn with no text becomes NO_REPLY; special-token look-alikes are broken by a zero-width
   space (tools.as_text).
3. Dual control: the opening is text only (the G rollouts of a task share it); tools are offered
   from the customer's second turn on. A leading <think> block in a reply is removed.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

from domains import script_for
from domains.dual_control import Phone, customer_only
from domains.tau2_data import LOADED as TAU2_LOADED, user_guidelines
from plumbing.chat_client import ChatClient, UserError, reply_text, reply_turn  # noqa: F401 (UserError: here too)
from plumbing.preflight import RunStopped, check_endpoint, endpoint
from plumbing.sampling import episode_seed
from tools import as_text

STOP, TRANSFER, OUT_OF_SCOPE = "###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###"
# What the customer "hears" before its first message: a chat model answers better with something to
# answer.
GREETING = "Hi! How can I help you today?"
NO_REPLY = "(the agent sent an empty message)"  # what it "hears" after an agent turn with no text


def is_terminal(text: str | None) -> str | None:
    """The end marker a customer message carries (the earliest, if it somehow carries several), or None."""
    found = [(text.find(m), m) for m in (STOP, TRANSFER, OUT_OF_SCOPE) if m in text] if isinstance(text, str) else []
    return min(found)[1] if found else None


# --------------------------------------------------------------------------------------------------
# The customer's prompt and its view of the conversation

# tau2's guidelines for a customer with tools (simulation_guidelines_tools.md), in this project's
# words.
PHONE_RULES = """

Your phone: you have tools that act on your own device. The agent cannot see them, nor what you do with them.
- In one turn, either call tools or write a message to the agent, never both. Only your messages reach the agent.
- Use a tool only when the agent asks you to do something on your device, or when you need it to answer the \
agent's question. If you are unsure what the agent wants you to do, ask.
- Do one action at a time. If the agent asks for several at once, say you can only do one at a time and ask \
which comes first.
- Report only what the tools actually returned; never invent a result. If a call fails, correct it and try again."""


def system_prompt(instructions: str, tools: bool = False, guidelines: str | None = None) -> str:
    """The customer's system prompt. `guidelines`: tau2's own text, laid out as tau2 lays it out (guidelines, then
    the <scenario>). Else this project's: who it is, the house rules, then its situation, last,
    right before the
    conversation, which is what lets a small customer model (demo/customer.py) keep to it."""
    if guidelines is not None:
        return f"{guidelines.strip()}\n\n<scenario>\n{instructions.strip()}\n</scenario>"
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


# Tool-call markup, tool results and reasoning that might sit inside an agent's text: never shown to
# the customer.
_HIDDEN = re.compile(r"<(tool_call|tool_response|think)>.*?(</\1>|$)", re.S)


def _own_call(m: dict, ids: list[str], n: int) -> dict:
    # The customer's own tool call or result, in its (swapped) view: its calls are the model's
    # "assistant" calls, their results "tool" messages tied by id (n: calls earlier in this
    # request). Arguments travel as a JSON string; a malformed call's raw text goes back as it came.
    if m["role"] == "tool":
        return {"role": "tool", "tool_call_id": ids.pop(0) if ids else "call_x", "content": m["content"]}
    calls = []
    for c in m["tool_calls"]:
        args = c["function"]["arguments"]
        ids.append(f"call_{n + len(calls)}")
        calls.append({"id": ids[-1], "type": "function", "function": {
            "name": str(c["function"]["name"]), "arguments": args if isinstance(args, str) else json.dumps(args)}})
    return {"role": "assistant", "content": m.get("content") or "", "tool_calls": calls}


def simulator_messages(instructions: str, history: list[dict], variant: dict | None = None, tools: bool = False,
                       guidelines: str | None = None) -> list[dict]:
    """Agent-side conversation -> the customer's API messages: [system, user: GREETING, assistant: <customer's
    1st message>, user: <agent's reply>, ...]. `history`: [{"role": "user" | "assistant",
    "content"}] as the agent saw it, plus the customer's own tool calls and results (dual control).
    `variant`: a benchmark's own customer
    (task.spec["simulator"], ACEBench's): its system text, greeting and roles, verbatim."""
    if variant is not None:
        msgs = [{"role": "system", "content": variant["system"]}, {"role": "user", "content": variant["greeting"]}]
        for m in history:
            text = m["content"]
            if m["role"] == "assistant":
                text = next((text[len(p):] for p in variant.get("strip", []) if text.startswith(p)), text)
            msgs.append({"role": variant["own_role"] if m["role"] == "user" else "user", "content": text})
        # special-token look-alikes stay text
        return [{**m, "content": as_text(m["content"])} for m in msgs]
    # pending: ids awaiting results
    swap, msgs, pending = {"user": "assistant", "assistant": "user"}, [], []
    for m in history:
        role, content = m.get("role"), m.get("content")
        if customer_only(m):
            msgs.append(_own_call(m, pending, sum(len(x.get("tool_calls", ())) for x in msgs)))
            continue
        if role not in swap or not isinstance(content, str):
            # system prompts, tool messages and tool-call-only turns are the agent's business
            continue
        # stray tool markup
        content = (_HIDDEN.sub("", content) if role == "assistant" else content).strip()
        if not content:
            continue
        # two agent texts in a row
        if msgs and msgs[-1]["role"] == swap[role] and "tool_calls" not in msgs[-1]:
            msgs[-1]["content"] += "\n\n" + content
        else:
            msgs.append({"role": swap[role], "content": content})
    # the customer's opening answered the greeting: say the greeting
    if not msgs or msgs[0]["role"] != "user":
        msgs.insert(0, {"role": "user", "content": GREETING})
    # the agent's last turn had no text, yet rollout.py handed over: a real
    if msgs[-1]["role"] == "assistant":
        # customer would nudge; aborting would hide the turn
        msgs.append({"role": "user", "content": NO_REPLY})
    msgs = [{"role": "system", "content": system_prompt(instructions, tools, guidelines)}] + msgs
    # marker look-alikes reach the server as text
    return [{**m, "content": as_text(m["content"])} for m in msgs]


# --------------------------------------------------------------------------------------------------
# The User protocol: what rollout() and a run call on any customer


class User:
    """A simulated customer. rollout() calls the first two methods; a run (muarl.py, eval.py) the others: check
    before it writes anything, start once its folder is ready, after at every step and evaluation,
    close at the end. A new simulator subclasses User, overrides `reply` (or `replies`) and
    `first_message`, and is a row of USERS.

    first_message(task, tools=False) -> str  the opening, fixed per task
    replies(requests) -> list                requests [(task, agent-side history, phone | None, seed | None)]: one
                                             answer each, in order, never raising: the text; None
                                             (the phone hit a cap); or a UserError (that episode
                                             aborts, unscored)
    check(tasks) / start(tasks, log)         what can fail before any work / side effects (serve a model)
    after(where, report, log)                after a GRPO step or an evaluation: RunStopped once down too long
    take_stats() -> dict, close()            health since the last call (log.jsonl); stop what was started"""

    label = "a customer"  # how the results table names it
    down_s = float("inf")  # seconds every group may fail before the run stops (--user_down_s)
    workers = 1  # requests answered at once (threads)

    def first_message(self, task, tools: bool = False) -> str:
        raise NotImplementedError

    def reply(self, task, history: list[dict], phone: Phone | None = None, seed: int | None = None) -> str | None:
        raise NotImplementedError

    def replies(self, requests: list[tuple]) -> list:
        # the endpoint is the bottleneck, not Python: threads give real concurrency here
        def one(req):
            try:
                return self.reply(*req)
            # "never raises": a bug in one request must not take down the whole batch
            except Exception as e:
                return e if isinstance(e, UserError) else UserError(f"{type(e).__name__}: {e}")

        with ThreadPoolExecutor(max_workers=max(1, min(self.workers, len(requests)))) as pool:
            return list(pool.map(one, requests))  # map yields in submission order

    def check(self, tasks: list) -> None:
        pass

    def start(self, tasks: list, log=None) -> None:
        pass

    def after(self, where: str, report: dict, log=None) -> None:
        """The downtime clock: it runs while every group of a step aborts; a step with any kept group stops it."""
        if "all_aborted" not in report:  # an evaluation: not a step
            return
        now = time.monotonic()
        self._down_since = (now if getattr(self, "_down_since", None) is None else self._down_since) \
            if report["all_aborted"] else None
        if self._down_since is not None and now - self._down_since >= self.down_s:
            raise RunStopped(f"the customer endpoint has failed every conversation for "
                             f"{now - self._down_since:.0f} s (budget --user_down_s {self.down_s:g}); last error: "
                             f"{report.get('last_error', '')[:200].rstrip('.')}. Checkpoint saved: fix the "
                             "endpoint, then rerun with --resume")

    def take_stats(self) -> dict:
        return {}

    def close(self) -> None:
        pass


# --------------------------------------------------------------------------------------------------
# LLMUser: a customer over an OpenAI-compatible endpoint


class LLMUser(User):
    """A simulated customer played by a chat model behind any OpenAI-compatible /v1/chat/completions."""

    def __init__(self, model, base_url=None, api_key=None, temperature=0.0, seed=None, timeout=30.0,
                 max_retries=3, backoff=1.0, max_workers=16, max_tokens=512, client=None, allow_http=False,
                 down_s=float("inf"), preflight=True, prompt="auto"):
        import openai  # imported here so scripted customers run without the package

        # which key may go where (preflight.endpoint's rule), decided here, not by openai
        if client is None:
            base_url, api_key = endpoint(base_url, api_key, allow_http)
        self.model, self.base_url, self.temperature, self.max_tokens = model, base_url, temperature, max_tokens
        self.seed, self.workers, self.down_s, self.preflight, self.prompt = seed, max_workers, down_s, preflight, prompt
        self.label = f"{model} at T={temperature:g}"
        # max_retries=0: the client must not retry on its own, or ChatClient's counts and backoff
        # would be a lie
        self.client = client or openai.OpenAI(base_url=base_url, api_key=api_key, timeout=timeout, max_retries=0)
        self.api = ChatClient(self.client, f"user simulator {model!r} at {base_url}", timeout, max_retries, backoff)
        self.stats = self.api.stats  # calls, retries, failures since the start
        self._first: dict[str, str] = {}  # task id -> the cached opening message
        # task id -> held while that opening is generated
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def take_stats(self) -> dict:
        return self.api.take_stats()

    def guidelines(self, task, tools: bool = False) -> str | None:
        """tau2's own guidelines where --user_prompt asks for them (auto: in the worlds read from tau2's data)."""
        tau2 = self.prompt == "tau2" or self.prompt == "auto" and getattr(task, "domain", None) in TAU2_LOADED
        return user_guidelines(task.domain, tools) if tau2 else None

    def request(self, task, history, tools: bool = False) -> list[dict]:
        """The messages this customer is sent for `task` after `history`."""
        return simulator_messages(task.instructions, history, _variant(task), tools, self.guidelines(task, tools))

    def complete(self, messages: list[dict], tools: list[dict] | None = None, sampling: dict | None = None,
                 verbatim: bool = False, seed: int | None = None):
        """One chat completion with retries: the reply text, or with `tools` (text, calls); else UserError.
        `seed`: this request's sampling seed (the episode's), else the customer's own: the OpenAI
        API and vLLM's
        server take one per request, so a rerun of one seed meets the same replies."""
        kwargs = dict(model=self.model, messages=messages, temperature=self.temperature, max_tokens=self.max_tokens)
        # a benchmark's own customer settings (ACEBench: temperature 0.001, top_p 1)
        kwargs.update(sampling or {})
        if tools:
            kwargs["tools"] = tools
        if seed is not None or self.seed is not None:
            # (any endpoint takes an int32)
            kwargs["seed"] = (seed if seed is not None else self.seed) % 2**31
        return self.api.complete(kwargs, reply_turn if tools else lambda r: reply_text(r, verbatim))

    def first_message(self, task, tools: bool = False) -> str:
        """The opening for this task: generated once, then shared by every rollout of the task. A per-task lock
        makes 8 rollouts asking at once cost one request; a failure is not cached (a later call tries again)."""
        with self._guard:
            lock = self._locks.setdefault(task.id, threading.Lock())
        with lock:
            if task.id not in self._first:
                v = _variant(task)  # a fixed opening (ACEBench's question) needs no model
                self._first[task.id] = v["opening"] if v and "opening" in v else self.complete(
                    self.request(task, [], tools), sampling=(v or {}).get("sampling"), verbatim=bool(v),
                    seed=None if self.seed is None else episode_seed(self.seed, "opening", task.id))
            return self._first[task.id]

    def reply(self, task, history: list[dict], phone: Phone | None = None, seed: int | None = None) -> str | None:
        """The customer's next message. With a `phone` (dual control) the model may first call its tools: they
        run, their results go back, and it is asked again until it writes text (None: the phone hit a cap)."""
        if phone is None:
            v = _variant(task)
            return self.complete(self.request(task, history), sampling=(v or {}).get("sampling"), verbatim=bool(v),
                                 seed=seed)
        # bounded: each round runs >= 1 call, and the phone stops at its cap
        for k in itertools.count():
            text, calls = self.complete(self.request(task, history + phone.new, tools=True),
                                        tools=phone.env.world.user_tool_schemas(),
                                        seed=None if seed is None else episode_seed(seed, k))
            if not calls:
                return text
            phone.run(calls, text)
            if phone.stop:
                return None

    def check(self, tasks: list) -> None:
        """Preflight: the endpoint reachable, the model served, its longest opening request within its context."""
        if self.preflight and tasks:
            longest = max(tasks, key=lambda t: len(t.instructions))
            ok = check_endpoint("customer", self.model, self.request(longest, []), self.max_tokens,
                                client=self.client)
            print(f"[preflight] customer {ok['model']} at {ok['base_url']}: ok ({ok})", flush=True)


def _variant(task) -> dict | None:
    spec = getattr(task, "spec", None)
    return spec.get("simulator") if isinstance(spec, dict) else None


# --------------------------------------------------------------------------------------------------
# Scripted customers: generated tasks, no LLM


class ScriptedUser(User):
    """Plays a generated task's spec deterministically with its domain's script (domains/synthetic.py, shop.py). A
    task with no spec (tau2's own) is played by its domain's script from the task itself, with the
    phone in
    dual-control worlds (domains/telecom_user.py: it performs the task's user-side gold actions when asked)."""

    label = "the script"

    def first_message(self, task, tools: bool = False) -> str:
        return script_for(task).scripted_first_message(task.spec if task.spec is not None else task)

    def reply(self, task, history: list[dict], phone: Phone | None = None, seed: int | None = None) -> str | None:
        if phone is not None:  # a dual-control world's script reads the customer's phone too
            return script_for(task).scripted_reply(task, history, phone)
        return script_for(task).scripted_reply(task.spec, history)


class SampledScriptUser(ScriptedUser):
    """The script, sampling its paraphrases with each request's seed (`sampled_reply(spec, history, rng)`, the
    store's); another world plays as ScriptedUser. The control between a fixed script and a language model."""

    label = "the sampled script"

    def reply(self, task, history: list[dict], phone: Phone | None = None, seed: int | None = None) -> str | None:
        script = script_for(task)
        if phone is None and task.spec is not None and hasattr(script, "sampled_reply"):
            return script.sampled_reply(task.spec, history, random.Random(seed))
        return super().reply(task, history, phone, seed)


class FixedUser(User):
    """States the task's request and stops at the agent's first text reply (for the oracle). In a dual-control
    world (a phone comes with the request) the customer must act, so its domain's script plays it."""

    label = "a fixed line"

    def first_message(self, task, tools=False):
        if tools:
            return ScriptedUser().first_message(task)
        return task.instructions.split("\n\n")[1] if "\n\n" in task.instructions else task.instructions

    def reply(self, task, history, phone=None, seed=None):
        return "Thanks, that's all. " + STOP if phone is None else ScriptedUser().reply(task, history, phone)


# --------------------------------------------------------------------------------------------------
# The table of customers: --user NAME picks a row; validation, eval.py and muarl.py read it


def _llm(model: str | None = None, **kw) -> User:
    """An LLM customer at an endpoint: model, base_url, api_key from kw, else $MUARL_USER_MODEL."""
    model = model or os.environ.get("MUARL_USER_MODEL")
    if not model:
        raise ValueError("the customer is a language model: give it an endpoint (--user_model NAME, and "
                         "--user_base_url URL/v1 unless it is OpenAI's) or serve a local model on this machine "
                         "(--user_serve FOLDER)")
    return LLMUser(model, **kw)


@dataclass(frozen=True)
class UserKind:
    # settings (the run's flags, by LLMUser's names) -> a User; unused ones ignored
    make: Callable[..., User]
    # plays only worlds whose DOMAINS row has a script (validation checks the domains)
    scripted: bool = False
    # an LLM: the --user_model / _base_url / _api_key / _serve flags are for it
    endpoint: bool = False


USERS = {
    "llm": UserKind(_llm, endpoint=True),
    "scripted": UserKind(lambda **kw: ScriptedUser(), scripted=True),
    "sampled": UserKind(lambda **kw: SampledScriptUser(), scripted=True),
    "fixed": UserKind(lambda **kw: FixedUser()),
}


def make_user(kind: str, **kw) -> User:
    """The User of row `kind` of USERS, built from the run's customer settings `kw`."""
    if kind not in USERS:
        raise ValueError(f"unknown user kind {kind!r}: expected one of {', '.join(USERS)}")
    return USERS[kind].make(**kw)


# --------------------------------------------------------------------------------------------------
# Demo: a short exchange with a canned endpoint (no network), then what the customer was sent

if __name__ == "__main__":
    from types import SimpleNamespace

    task = SimpleNamespace(id="demo/0", spec=None, domain="demo", instructions="Reason for call:\nReturn the desk "
                           "lamp from order #W1234567, refund to your gift card.\n\nKnown info:\nYou are Ana Lopez, "
                           "zip code 10001.")
    canned = ["Hi, I'd like to return something from a recent order.", "Sure, it's Ana Lopez, zip code 10001.",
              "Yes, please, back to the gift card.", "Great, that's all I needed. Thanks! " + STOP]

    def create(messages, **_):  # a chat endpoint answering by turn number: what a model would say
        text = canned[sum(m["role"] == "assistant" for m in messages)]
        return SimpleNamespace(choices=[SimpleNamespace(message=SimpleNamespace(content=text))])

    client = SimpleNamespace(chat=SimpleNamespace(completions=SimpleNamespace(create=create)))
    user = make_user("llm", model="fake-customer", base_url="http://127.0.0.1/v1", client=client)
    history = [{"role": "user", "content": user.first_message(task)}]
    for said in ["Your name and zip code, please?", "Order #W1234567, the desk lamp, refund to the gift card: "
                 "correct?", "Done: the return is requested."]:
        history += [{"role": "assistant", "content": said}, {"role": "user", "content": user.reply(task, history)}]
    print("\n".join(f"[{'agent' if m['role'] == 'assistant' else 'user '}] {m['content']}" for m in history))
    print("\nThe last request, as the customer saw it (roles swapped):")
    for m in user.request(task, history[:-1])[1:]:
        print(f"  {m['role']:>9}: {m['content']}")
    print(f"\nends: {is_terminal(history[-1]['content'])}; opening cached: "
          f"{user.first_message(task) == history[0]['content']}; USERS: {list(USERS)}; API stats: {user.stats}")
