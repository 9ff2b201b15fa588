"""The simulated customer: the other side of every MUA-RL rollout, and what it is told and sees.

MUA-RL's one new idea (Zhao et al. 2025, "Method") is a *user* inside the RL loop: a frozen LLM
plays a customer who knows the task's hidden instructions and reveals them only as the conversation
asks, so requests are dynamic (it omits details, changes its mind, insists). The reward still comes
from the database, but the agent must earn its information by asking. Here: the customer's prompt
and its view of the conversation, many requests at once (`concurrently`), the `User` protocol,
`LLMUser` (any OpenAI-compatible endpoint: a hosted model, a vLLM server), scripted customers, and
USERS, the table --user picks a row of.

Two views of one conversation. rollout.py keeps the *agent's*: its own turns are "assistant", the
customer's "user". The customer model needs the reverse, so every request is rebuilt from the
agent-side text with roles swapped; the agent's tool calls and results never reach it (a real
customer cannot see the company's systems). In dual control (tau2's telecom) the customer acts on
its own phone (domains/dual_control.Phone): it remembers its calls, the agent never sees them.
The opening is fixed per task, so a group's reward differences come from the agent. A request
that fails for good (plumbing/chat_client.py retries first) aborts its episode: never a 0.

Departures from the paper / tau2-bench:
1. The paper used GPT-4o-2024-11-20 at temperature 0 with its authors' prompt; here any endpoint,
   told tau2's own guidelines in tau2's worlds (--user_prompt auto), prompts/customer.md elsewhere.
2. The opening answers a fixed greeting; consecutive messages of one role are merged; an empty agent
   turn becomes NO_REPLY; special-token look-alikes are broken by a zero-width space (tools.as_text).
3. Dual control: the opening is text only (a task's rollouts share it); tools come from turn two on.
"""

from __future__ import annotations

import itertools
import os
import random
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from domains import DOMAINS
from domains.base import customer_only
from domains.dual_control import Phone, own_call_view
from domains.tau2_data import LOADED as TAU2_LOADED, user_guidelines
from plumbing import chat_client
from plumbing.chat_client import (ChatClient, UserError, reply_text, reply_turn,  # noqa: F401
                                   thinking_switch)
from plumbing.preflight import RunStopped, check_endpoint, endpoint
from plumbing.sampling import episode_seed
from tools import as_text

STOP, TRANSFER, OUT_OF_SCOPE = "###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###"
GREETING = "Hi! How can I help you today?"  # what the customer "hears" before its first message
NO_REPLY = "(the agent sent an empty message)"  # what it "hears" after an agent turn with no text


def is_terminal(text: str | None) -> str | None:
    """The end marker a customer message carries (the earliest, if several), or None."""
    markers = (STOP, TRANSFER, OUT_OF_SCOPE)
    found = [(text.find(m), m) for m in markers if m in text] if isinstance(text, str) else []
    return min(found)[1] if found else None


# --------------------------------------------------------------------------------------------------
# The customer's prompt and its view of the conversation

PROMPTS = Path(__file__).resolve().parent / "prompts"  # muarl's own wording of tau2's guidelines


def system_prompt(instructions: str, tools: bool = False, guidelines: str | None = None) -> str:
    """The customer's system prompt. With `guidelines` (tau2's own text) as tau2 lays it out: the
    guidelines, then the <scenario>. Else prompts/customer.md (who it is, the house rules; with
    `tools`, its phone's rules, prompts/customer_phone.md), its situation last, right before the
    conversation: what lets a small customer model (demo/customer.py) keep to it."""
    if guidelines is not None:
        return f"{guidelines.strip()}\n\n<scenario>\n{instructions.strip()}\n</scenario>"
    phone = "\n\n" + (PROMPTS / "customer_phone.md").read_text().rstrip("\n") if tools else ""
    return (PROMPTS / "customer.md").read_text().rstrip("\n").format(
        STOP=STOP, TRANSFER=TRANSFER, OUT_OF_SCOPE=OUT_OF_SCOPE, phone=phone,
        instructions=instructions.strip())


# Tool-call markup, tool results, reasoning in an agent's text: never shown to the customer.
_HIDDEN = re.compile(r"<(tool_call|tool_response|think)>.*?(</\1>|$)", re.S)


def simulator_messages(instructions: str, history: list[dict], tools: bool = False,
                       guidelines: str | None = None) -> list[dict]:
    """Agent-side conversation -> the customer's messages: [system, user: GREETING, assistant:
    <customer's first message>, user: <agent's reply>, ...]. `history`: as the agent saw it, text
    turns plus the customer's own tool calls and results (dual control). (A benchmark with its own
    customer prompt builds its own messages: benchmarks/acebench_customer.py.)"""
    swap, msgs, pending = {"user": "assistant", "assistant": "user"}, [], []  # pending: call ids
    for m in history:
        role, content = m.get("role"), m.get("content")
        if customer_only(m):  # its own call or result stays in its view, as a call
            msgs.append(own_call_view(m, pending, sum(len(x.get("tool_calls", ())) for x in msgs)))
            continue
        if role not in swap or not isinstance(content, str):
            continue  # system prompts, tool messages, tool-call-only turns: the agent's business
        content = (_HIDDEN.sub("", content) if role == "assistant" else content).strip()
        if not content:
            continue
        if msgs and msgs[-1]["role"] == swap[role] and "tool_calls" not in msgs[-1]:
            msgs[-1]["content"] += "\n\n" + content  # two agent texts in a row (around a tool call)
        else:
            msgs.append({"role": swap[role], "content": content})
    if not msgs or msgs[0]["role"] != "user":  # the opening answered the greeting: say it
        msgs.insert(0, {"role": "user", "content": GREETING})
    if msgs[-1]["role"] == "assistant":  # the agent handed over without text: a real customer
        msgs.append({"role": "user", "content": NO_REPLY})  # would nudge; aborting hides the turn
    msgs = [{"role": "system", "content": system_prompt(instructions, tools, guidelines)}] + msgs
    return [{**m, "content": as_text(m["content"])} for m in msgs]  # look-alikes reach it as text


# --------------------------------------------------------------------------------------------------
# Many requests at once: the customers' openings (rollout.py) and a batch of replies (User.replies)


def concurrently(fn, items: list, workers: int) -> list:
    """[fn(x) for x in items] on up to `workers` threads, in order (the endpoint is the bottleneck, not
    Python: threads are real concurrency). If the caller is interrupted while it waits, what is still
    queued is cancelled and chat_client.STOP tells the requests in flight to give up, so the interrupt propagates
    at once rather than after the slowest request's deadline and retries."""
    chat_client.STOP.clear()
    pool = ThreadPoolExecutor(max_workers=max(1, min(workers, len(items))))
    try:
        return [patient(f) for f in [pool.submit(fn, x) for x in items]]
    except BaseException as e:
        if not isinstance(e, Exception):  # Ctrl-C: the requests in flight give up too (a call's own
            chat_client.STOP.set()  # error leaves them to finish, and later requests to be asked)
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    finally:
        pool.shutdown(wait=False)  # (after a normal end every call is done: nothing to wait for)


def patient(future):
    """future.result(), waking every 0.2 s: a Ctrl-C that the OS delivered to another thread is raised
    here within 0.2 s (a wait without a timeout would hold it until the future is done)."""
    while True:
        try:
            return future.result(timeout=0.2)
        except TimeoutError:
            if future.done():  # (the call's own TimeoutError, not the wait's)
                raise


# --------------------------------------------------------------------------------------------------
# The User protocol: what rollout() and a run call on any customer


class User:
    """A simulated customer. rollout() calls the first two methods, a run the others. A new
    simulator subclasses User, overrides `reply` (or `replies`) and `first_message`, and is a row
    of USERS.

    first_message(task, tools=False)  the opening, fixed per task
    replies(requests)                 requests [(task, agent-side history, phone | None, seed)]:
                                      one answer each, in order, never raising: the text; None
                                      (the phone hit a cap); or a UserError (the episode aborts)
    check(tasks), start(tasks, log)   what can fail before any work; side effects (serve a model)
    after(where, report, log)         after a GRPO step or an evaluation: RunStopped if down long
    take_stats(), close()             health since the last call (log.jsonl); stop what started"""

    label = "a customer"  # how the results table names it
    down_s = float("inf")  # seconds every group may fail before the run stops (--user_down_s)
    workers = 1  # requests answered at once (threads)

    def first_message(self, task, tools: bool = False) -> str:
        raise NotImplementedError

    def reply(self, task, history: list[dict], phone: Phone | None = None,
              seed: int | None = None) -> str | None:
        raise NotImplementedError

    def replies(self, requests: list[tuple]) -> list:
        def one(req):  # the endpoint is the bottleneck, not Python: threads are real concurrency
            try:
                return self.reply(*req)
            except Exception as e:  # one request's failure must not take down the batch
                return e if isinstance(e, UserError) else UserError(f"{type(e).__name__}: {e}")

        return concurrently(one, requests, self.workers)  # in order; Ctrl-C leaves no request waited on

    def check(self, tasks: list, worlds: dict | None = None) -> None:
        pass

    def start(self, tasks: list, log=None) -> None:
        pass

    def after(self, where: str, report: dict, log=None) -> None:
        """The downtime clock: it runs while every group of a step aborts; a kept group stops it."""
        if "all_aborted" not in report:  # an evaluation: not a step
            return
        now, since = time.monotonic(), getattr(self, "_down_since", None)
        self._down_since = (now if since is None else since) if report["all_aborted"] else None
        if self._down_since is not None and now - self._down_since >= self.down_s:
            raise RunStopped(f"the customer endpoint has failed every conversation for "
                             f"{now - self._down_since:.0f} s (budget --user_down_s {self.down_s:g}); "
                             f"last error: {report.get('last_error', '')[:200].rstrip('.')}. Checkpoint "
                             "saved: fix the endpoint, then rerun with --resume")

    def take_stats(self) -> dict:
        return {}

    def close(self) -> None:
        pass


# --------------------------------------------------------------------------------------------------
# LLMUser: a customer over an OpenAI-compatible endpoint


class LLMUser(User):
    """A simulated customer played by a chat model behind any /v1/chat/completions."""

    def __init__(self, model, base_url=None, api_key=None, temperature=0.0, seed=None, timeout=30.0,
                 max_retries=3, backoff=1.0, max_workers=16, max_tokens=512, client=None,
                 allow_http=False, down_s=float("inf"), preflight=True, prompt="auto", thinking=False):
        import openai  # here, so that scripted customers run without the package

        if client is None:  # which key may go where: preflight.endpoint's rule, not openai's
            base_url, api_key = endpoint(base_url, api_key, allow_http)
        self.model, self.base_url, self.temperature = model, base_url, temperature
        self.max_tokens, self.seed, self.workers, self.down_s = max_tokens, seed, max_workers, down_s
        self.preflight, self.prompt, self.label = preflight, prompt, f"{model} at T={temperature:g}"
        # max_retries=0: the client must not retry on its own, or ChatClient's counts would lie
        self.client = client or openai.OpenAI(base_url=base_url, api_key=api_key, timeout=timeout,
                                              max_retries=0)
        self.api = ChatClient(self.client, f"user simulator {model!r} at {base_url}", timeout, max_retries,
                              backoff, thinking_switch(base_url, thinking))  # its reasoning kept from the agent
        self.stats = self.api.stats  # calls, retries, failures since the start
        self._first: dict[str, str] = {}  # task id -> the cached opening
        self._locks: dict[str, threading.Lock] = {}  # task id -> held while it is generated
        self._guard = threading.Lock()

    def take_stats(self) -> dict:  # the endpoint's health since the last call (plumbing/chat_client.py)
        return self.api.take_stats()

    def request(self, task, history, tools: bool = False) -> list[dict]:
        """The messages this customer is sent for `task` after `history`: tau2's own guidelines
        where --user_prompt asks for them (auto: the worlds read from tau2's data), else muarl's."""
        domain = getattr(task, "domain", None)
        tau2 = self.prompt == "tau2" or self.prompt == "auto" and domain in TAU2_LOADED
        guide = user_guidelines(domain, tools) if tau2 else None
        if self.prompt == "tau2" and guide is None:  # (one line at the start: check() asks it first)
            raise ValueError(f"--user_prompt tau2: no tau2 guidelines for a task of {domain!r}")
        return simulator_messages(task.instructions, history, tools, guide)

    def complete(self, messages: list[dict], tools: list[dict] | None = None,
                 sampling: dict | None = None, verbatim: bool = False, seed: int | None = None):
        """One chat completion with retries: the reply's text, with `tools` (text, calls); else
        UserError. `seed`: this request's (from the episode's), else the customer's own: the OpenAI
        API and vLLM's server take one per request, so a rerun of one seed meets the same replies."""
        kwargs = {"model": self.model, "messages": messages, "temperature": self.temperature,
                  "max_tokens": self.max_tokens, **(sampling or {})}  # (a subclass's own sampling)
        if tools:
            kwargs["tools"] = tools
        if seed is not None or self.seed is not None:  # (an int32: any endpoint takes it)
            kwargs["seed"] = (seed if seed is not None else self.seed) % 2**31
        return self.api.complete(kwargs, reply_turn if tools else lambda r: reply_text(r, verbatim))

    def first_message(self, task, tools: bool = False) -> str:
        """The opening for this task: generated once, then shared by every rollout of the task. A
        per-task lock makes 8 rollouts asking at once cost one request; a failure is not cached."""
        with self._guard:
            lock = self._locks.setdefault(task.id, threading.Lock())
        with lock:
            if task.id not in self._first:
                seed = None if self.seed is None else episode_seed(self.seed, "opening", task.id)
                self._first[task.id] = self.opening(task, tools, seed)
            return self._first[task.id]

    def opening(self, task, tools: bool, seed: int | None) -> str:
        """The customer's first message, asked of the model (first_message keeps it for the task's rollouts)."""
        return self.complete(self.request(task, [], tools), seed=seed)

    def reply(self, task, history: list[dict], phone: Phone | None = None,
              seed: int | None = None) -> str | None:
        """The customer's next message. With a `phone` (dual control) the model may first call its
        tools: they run, their results go back, and it is asked again until it writes text (None:
        the phone hit a cap)."""
        if phone is None:
            return self.complete(self.request(task, history), seed=seed)
        for k in itertools.count():  # bounded: each round runs >= 1 call; the phone has a cap
            text, calls = self.complete(self.request(task, history + phone.new, tools=True),
                                        tools=phone.env.world.user_tool_schemas(),
                                        seed=None if seed is None else episode_seed(seed, k))
            if not calls:
                return text
            phone.run(calls, text)
            if phone.stop:
                return None

    def check(self, tasks: list, worlds: dict | None = None) -> None:
        """Preflight (plumbing/preflight.py): each world's longest request as sent, a phone's tools too."""
        for domain in dict.fromkeys(t.domain for t in tasks) if self.preflight else ():
            longest = max((t for t in tasks if t.domain == domain), key=lambda t: len(t.instructions))
            tools = worlds[domain].user_tool_schemas() if worlds else []  # [] where the customer has no phone
            ok = check_endpoint("customer", self.model, self.request(longest, [], bool(tools)), self.max_tokens,
                                tools, client=self.client, extra=self.api.extra, retries=self.api.max_retries,
                                backoff=self.api.backoff)
            print(f"[preflight] customer {ok['model']} at {ok['base_url']}, {domain}: ok ({ok})", flush=True)


# --------------------------------------------------------------------------------------------------
# Scripted customers: generated tasks, no LLM


def domain_scripts() -> dict:
    """World name -> the module that scripts its customer: every row of domains.DOMAINS that has one."""
    return {name: d.script for name, d in DOMAINS.items() if d.script is not None}


class ScriptedUser(User):
    """Plays a generated task's spec with its world's script (domains/synthetic.py, the demo's shop and store);
    a task without one (tau2's telecom) is played by its domain's script from the task itself, phone included
    (domains/telecom_user.py: it performs the user-side gold actions). `scripts` (world name -> script module) is
    read once, when the customer is built: every world registered by then (domain_scripts()) unless given."""

    label = "the script"

    def __init__(self, scripts: dict | None = None):
        self.scripts = domain_scripts() if scripts is None else dict(scripts)

    def script_for(self, task):
        """The script that plays `task`: a generated task's spec names the world whose script wrote it; a task
        without one (tau2's own) is played by its own domain's script, if it has one (telecom's)."""
        name = task.spec.get("world") if task.spec is not None else getattr(task, "domain", None)
        if name not in self.scripts:
            raise ValueError(f"task {task.id!r} has no scripted customer; use the LLM customer (--user llm) for it")
        return self.scripts[name]

    def first_message(self, task, tools: bool = False) -> str:
        return self.script_for(task).scripted_first_message(task.spec if task.spec is not None else task)

    def reply(self, task, history, phone=None, seed=None):
        if phone is not None:  # a dual-control world's script reads the customer's phone too
            return self.script_for(task).scripted_reply(task, history, phone)
        return self.script_for(task).scripted_reply(task.spec, history)


class SampledScriptUser(ScriptedUser):
    """The script, sampling its paraphrases with each request's seed (a world with a
    `sampled_reply(spec, history, rng)`: the store): a fixed script's decisions, random wording."""

    label = "the sampled script"

    def reply(self, task, history, phone=None, seed=None):
        script = self.script_for(task)
        if phone is None and task.spec is not None and hasattr(script, "sampled_reply"):
            return script.sampled_reply(task.spec, history, random.Random(seed))
        return super().reply(task, history, phone, seed)


class FixedUser(User):
    """States the task's request and stops at the agent's first text reply (for the oracle). With a
    phone (dual control) the customer must act, so its domain's script plays it."""

    label = "a fixed line"

    def __init__(self, scripts: dict | None = None):
        self.script = ScriptedUser(scripts)  # (what acts on the phone in a dual-control world)

    def first_message(self, task, tools=False):
        if tools:
            return self.script.first_message(task)
        text = task.instructions
        return text.split("\n\n")[1] if "\n\n" in text else text

    def reply(self, task, history, phone=None, seed=None):
        if phone is None:
            return "Thanks, that's all. " + STOP
        return self.script.reply(task, history, phone)


# --------------------------------------------------------------------------------------------------
# The table of customers: --user NAME picks a row; validation, eval.py and muarl.py read it


def _llm(model: str | None = None, **kw) -> User:
    """An LLM customer at an endpoint: model, base_url, api_key from kw, else $MUARL_USER_MODEL.
    A world whose DOMAINS row names its own `customer` (ACEBench's prompt) has it mixed in: a class
    whose methods come before LLMUser's, that plays the tasks carrying its prompt and calls LLMUser's
    for every other task. So training and evaluation alike play each task with its world's customer."""
    model = model or os.environ.get("MUARL_USER_MODEL")
    if not model:
        raise ValueError("the customer is a language model: give it an endpoint (--user_model NAME, "
                         "and --user_base_url URL/v1 unless it is OpenAI's) or serve a local model "
                         "on this machine (--user_serve FOLDER)")
    mixins = tuple(dict.fromkeys(d.customer for d in DOMAINS.values() if d.customer is not None))
    user = type("LLMUser", (*mixins, LLMUser), {}) if mixins else LLMUser
    return user(model, **kw)


@dataclass(frozen=True)
class UserKind:
    make: Callable[..., User]  # the run's customer settings (LLMUser's names) -> a User
    scripted: bool = False  # plays only worlds whose DOMAINS row has a script
    endpoint: bool = False  # an LLM: the --user_model / _base_url / _api_key / _serve flags are its


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
# Demo: python user_sim.py -- a short exchange with a canned endpoint (no network), then what the
# customer model was sent

if __name__ == "__main__":
    from types import SimpleNamespace

    task = SimpleNamespace(id="demo/0", spec=None, domain="demo", instructions="Reason for call:\nReturn the desk "
                           "lamp from #W1234567, refund to your gift card.\n\nKnown info:\nYou are Ana Lopez, 10001.")
    canned = ["Hi, I'd like to return something from a recent order.", "Sure, Ana Lopez, 10001.",
              "Yes, please, back to the gift card.", "Great, that's all I needed. Thanks! " + STOP]

    def create(messages, **_):  # a chat endpoint answering by turn number: no network
        text = canned[sum(m["role"] == "assistant" for m in messages)]
        return SimpleNamespace(choices=[SimpleNamespace(message=SimpleNamespace(content=text))])

    client = SimpleNamespace(chat=SimpleNamespace(completions=SimpleNamespace(create=create)))
    user = make_user("llm", model="fake-customer", base_url="http://127.0.0.1/v1", client=client)
    history = [{"role": "user", "content": user.first_message(task)}]
    for said in ["Your name and zip code, please?", "The desk lamp of #W1234567, refund to the "
                 "gift card: correct?", "Done: the return is requested."]:
        history += [{"role": "assistant", "content": said}, {"role": "user", "content": user.reply(task, history)}]
    for m in history:
        print(f"[{'agent' if m['role'] == 'assistant' else 'user '}] {m['content']}")
    print("\nThe last request, as the customer saw it (roles swapped):")
    for m in user.request(task, history[:-1])[1:]:
        print(f"  {m['role']:>9}: {m['content']}")
    print(f"\nends: {is_terminal(history[-1]['content'])}; USERS: {list(USERS)}; API stats: {user.stats}")
