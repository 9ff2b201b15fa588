"""The simulated user: the customer on the other side of every MUA-RL rollout.

MUA-RL's central idea (Zhao et al. 2025, section "Method") is to put a *user* inside the RL loop: while the policy
learns to call tools, a frozen LLM plays a customer who knows the task's hidden instructions and reveals them only
as the conversation asks. The reward still comes from the database, but the agent must earn its information by
asking. This file is that customer: `LLMUser`, played by any OpenAI-compatible chat endpoint (hosted, or a local
vLLM server); `ScriptedUser`, a deterministic customer for generated tasks, so the pipeline runs with no LLM; and
`make_user`, which builds either from arguments or the environment.

Two views of one conversation. rollout.py keeps the *agent's* view: its own turns are "assistant", the customer's
"user". The customer model needs the reverse, so every request is rebuilt from the agent-side text with the roles
swapped, under a system prompt carrying the hidden instructions. Tool calls and results never reach the customer:
a real one cannot see the company's systems, and reading them would leak database facts into its answers.

The first message is fixed per task. The paper starts all G rollouts of a task from the same opening message, so
the group's reward differences come from the agent, not from a different first request: `first_message` asks
the model once per task id, and a per-task lock makes 8 rollouts asking at once cost one API call.

Failures abort, they do not score zero. If the simulator's API fails for good, the episode says nothing about the
policy: rollout.py drops it (UserError) instead of training on reward 0. Before giving up we retry transient
errors (connection errors, timeouts, 408, 429, 5xx) and garbage replies with exponential backoff.

Departures from the paper / tau2-bench:
1. The system prompt is written for this project (same rules as tau2's simulation guidelines, own wording);
   the paper used GPT-4o-2024-11-20 at temperature 0 with the MUA-RL authors' prompt.
2. The opening is generated from a fixed agent greeting (GREETING) rather than from tau2's exact first turn.
3. A reply's leading `<think>...</think>` block (a reasoning model served without a reasoning parser) is removed.
4. Consecutive messages of the same role are merged into one, so the request always alternates user/assistant
   (some chat templates refuse anything else); an agent turn with no text becomes NO_REPLY for the same reason.
"""

from __future__ import annotations

import ipaddress
import json
import os
import random
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlparse

from domains import script_for

STOP, TRANSFER, OUT_OF_SCOPE = "###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###"

# What the customer "hears" before its first message. The agent never says it (its conversation starts with the
# customer's), but a chat model answers better when it has something to answer; one greeting keeps it reproducible.
GREETING = "Hi! How can I help you today?"
NO_REPLY = "(the agent sent an empty message)"  # what it "hears" after an agent turn with no text (see below)


class UserError(Exception):
    """The user simulator failed for good (retries exhausted or a non-retryable API error): abort the episode."""


def is_terminal(text: str | None) -> str | None:
    """The end marker a user message carries (the earliest, if it somehow carries several), or None."""
    found = [(text.find(m), m) for m in (STOP, TRANSFER, OUT_OF_SCOPE) if m in text] if isinstance(text, str) else []
    return min(found)[1] if found else None


# ---------------------------------------------------------------------------------------------------------------
# The customer's prompt and its view of the conversation


def system_prompt(instructions: str) -> str:
    """The simulator's system prompt: who it is, what it wants (the hidden instructions), and the house rules."""
    return f"""You are playing a customer who has contacted a company's customer service. The other side of this \
chat is the company's support agent. You are the customer, never the agent: you cannot see or use the company's \
systems, and you only know what your situation below tells you.

Your situation (private; the agent cannot see it):
<situation>
{instructions.strip()}
</situation>

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
cannot go on."""


# Tool-call markup, tool results and reasoning that might sit inside an agent's text: never shown to the customer.
_HIDDEN = re.compile(r"<(tool_call|tool_response|think)>.*?(</\1>|$)", re.S)
# A leading reasoning block in the simulator's own reply (a thinking model served without a reasoning parser).
_LEADING_THINK = re.compile(r"^\s*<think>.*?</think>", re.S)


def simulator_messages(instructions: str, history: list[dict]) -> list[dict]:
    """Agent-side text conversation -> the simulator's API messages (system prompt + roles swapped).

    history: [{"role": "user" | "assistant", "content": str}, ...] as the agent saw it (user = customer).
    Returns [system, user: GREETING, assistant: <customer's 1st msg>, user: <agent's reply>, ...]."""
    swap = {"user": "assistant", "assistant": "user"}
    msgs: list[dict] = []
    for m in history:
        role, content = m.get("role"), m.get("content")
        if role not in swap or not isinstance(content, str):
            continue  # system prompts, tool messages and tool-call-only turns are the agent's business
        content = (_HIDDEN.sub("", content) if role == "assistant" else content).strip()  # hide stray tool markup
        if not content:
            continue
        if msgs and msgs[-1]["role"] == swap[role]:  # two agent texts in a row (e.g. around a tool call)
            msgs[-1]["content"] += "\n\n" + content
        else:
            msgs.append({"role": swap[role], "content": content})
    if not msgs or msgs[0]["role"] != "user":  # the customer's opening answered the greeting; say the greeting
        msgs.insert(0, {"role": "user", "content": GREETING})
    if msgs[-1]["role"] == "assistant":
        # The agent's last turn had no text (a bare tool call, or nothing), yet rollout.py handed over. Say so, not
        # refuse: a real customer would nudge, and aborting would hide the very turns RL should learn to avoid.
        msgs.append({"role": "user", "content": NO_REPLY})
    return [{"role": "system", "content": system_prompt(instructions)}] + msgs


# ---------------------------------------------------------------------------------------------------------------
# LLMUser: a customer over an OpenAI-compatible endpoint


class _Garbage(Exception):
    """The server answered 200 but the answer holds no usable message (retried like a 5xx)."""


class _Deadline(Exception):
    """An attempt ran past the whole-request deadline (retried like a timeout)."""


def _content_of(resp) -> str:
    # The openai client returns the raw body text (a str) when the server does not send JSON, so every step here
    # uses getattr: anything that is not "choices[0].message.content is a non-empty string" is garbage.
    choices = getattr(resp, "choices", None)
    if not choices:
        raise _Garbage(f"no choices in the response ({type(resp).__name__})")
    content = getattr(getattr(choices[0], "message", None), "content", None)
    if not isinstance(content, str):
        raise _Garbage(f"message content is {type(content).__name__}, not a string")
    content = _LEADING_THINK.sub("", content).strip()
    if not content:
        raise _Garbage("empty message content")
    return content  # a reply cut by max_tokens (finish_reason "length") is still a usable customer message


class LLMUser:
    """A simulated customer played by a chat model behind any OpenAI-compatible /v1/chat/completions."""

    def __init__(self, model, base_url=None, api_key=None, temperature=0.0, seed=None, timeout=30.0,
                 max_retries=3, backoff=1.0, max_workers=16, max_tokens=512, client=None):
        import openai  # imported here so ScriptedUser runs without the package

        self._openai = openai
        self.model, self.base_url, self.temperature, self.max_tokens = model, base_url, temperature, max_tokens
        self.seed, self.max_retries, self.backoff, self.max_workers = seed, max_retries, backoff, max_workers
        self.timeout = timeout  # the whole-request deadline of one attempt (connect + every read), seconds
        # max_retries=0: the client must not retry on its own, or our attempt counts and backoff would be a lie.
        self.client = client or openai.OpenAI(base_url=base_url, api_key=api_key, timeout=timeout, max_retries=0)
        self._first: dict[str, str] = {}  # task id -> the cached opening message
        self._locks: dict[str, threading.Lock] = {}  # task id -> lock held while that opening is generated
        self._guard = threading.Lock()  # protects the two dicts and the counters below
        self.stats = {"calls": 0, "retries": 0, "failures": 0}  # for the training log: API health at a glance
        self._step: dict = {"calls": 0, "retries": 0, "failures": 0, "deadlines": 0, "latency": []}  # since take_stats

    def _count(self, key: str) -> None:
        with self._guard:
            if key in self.stats:  # ("deadlines" is counted per step only)
                self.stats[key] += 1
            self._step[key] += 1

    def take_stats(self) -> dict:
        """The customer's API health since the last call, for one log.jsonl record: calls, retries, failures, attempts
        cut by the deadline, and the latency of an attempt in seconds (p50 / p90 / p99 / max, nearest rank)."""
        with self._guard:
            step, lat = self._step, sorted(self._step.pop("latency"))
            self._step = {"calls": 0, "retries": 0, "failures": 0, "deadlines": 0, "latency": []}
        pct = {f"latency_{q}": lat[min(len(lat) - 1, int(p * len(lat)))] if lat else None
               for q, p in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("max", 1.0))}
        return {**step, **pct}

    def _attempt(self, kwargs: dict):
        """One request under the whole-request deadline. The client's timeout bounds each read, so a server that
        trickles a byte a second would hold a request for ever; here the request runs on a daemon thread and is given
        up at the deadline (the thread ends when the server or the client's own read timeout does)."""
        box, t0 = {}, time.monotonic()

        def run():
            try:
                box["reply"] = self.client.chat.completions.create(**kwargs)
            except Exception as e:  # noqa: BLE001 - handed to complete(), which sorts retryable from fatal
                box["error"] = e

        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        worker.join(self.timeout)
        with self._guard:
            self._step["latency"].append(time.monotonic() - t0)
        if worker.is_alive():
            self._count("deadlines")
            raise _Deadline(f"Timeout: no complete reply within the {self.timeout:g} s deadline")
        if "error" in box:
            raise box["error"]
        return box["reply"]

    def complete(self, messages: list[dict]) -> str:
        """One chat completion with retries; returns the reply text or raises UserError."""
        kwargs = dict(model=self.model, messages=messages, temperature=self.temperature, max_tokens=self.max_tokens)
        if self.seed is not None:
            kwargs["seed"] = self.seed
        oa, last, who = self._openai, None, f"user simulator {self.model!r} at {self.base_url}"
        for attempt in range(self.max_retries + 1):
            if attempt:  # exponential backoff; the jitter keeps 16 threads from retrying in lockstep
                self._count("retries")
                time.sleep(self.backoff * 2 ** (attempt - 1) * (1 + 0.25 * random.random()))
            self._count("calls")
            try:
                return _content_of(self._attempt(kwargs))
            except _Garbage as e:
                last = f"garbage reply: {e}"
            except _Deadline as e:  # a hung or trickling server: retried like a timeout
                last = str(e)
            except oa.APIStatusError as e:
                last = f"HTTP {e.status_code}: {e}"
                if e.status_code not in (408, 429) and e.status_code < 500:  # 400/401/404...: asking again cannot help
                    self._count("failures")
                    raise UserError(f"{who}: HTTP {e.status_code} (not retried): {e}") from e
            except oa.APIConnectionError as e:  # includes APITimeoutError
                last = f"{type(e).__name__}: {e}"
            except (oa.APIResponseValidationError, json.JSONDecodeError) as e:  # a body that is not valid JSON
                last = f"garbage reply: {type(e).__name__}: {e}"
        self._count("failures")
        raise UserError(f"{who} failed after {self.max_retries + 1} attempts; last error: {last}")

    def first_message(self, task) -> str:
        """The customer's opening for this task: generated once, then shared by every rollout of the task."""
        with self._guard:
            lock = self._locks.setdefault(task.id, threading.Lock())
        with lock:  # concurrent callers for one task queue here; the first one generates, the rest read the cache
            if task.id not in self._first:
                # Not cached on failure: a later call (e.g. next epoch) tries again instead of failing forever.
                self._first[task.id] = self.complete(simulator_messages(task.instructions, []))
            return self._first[task.id]

    def reply(self, task, history: list[dict]) -> str:
        """The customer's next message, given the agent-side text conversation so far."""
        return self.complete(simulator_messages(task.instructions, history))

    def replies(self, requests: list[tuple]) -> list:
        """reply() for many (task, history) pairs at once; order kept; a failure comes back as a UserError."""
        return _fan_out(self.reply, requests, self.max_workers)


def _fan_out(fn, requests: list[tuple], max_workers: int) -> list:
    # The API is the bottleneck (network + a large model), not Python, so threads give real concurrency here.
    def one(req):
        try:
            return fn(*req)
        except Exception as e:  # "never raises": a bug in one request must not take down the whole batch
            return e if isinstance(e, UserError) else UserError(f"{type(e).__name__}: {e}")

    with ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(requests)))) as pool:
        return list(pool.map(one, requests))  # map yields in submission order


# ---------------------------------------------------------------------------------------------------------------
# ScriptedUser: synthetic tasks, no LLM


class ScriptedUser:
    """Plays a generated task's spec deterministically with its domain's script (domains/synthetic.py, shop.py)."""

    def first_message(self, task) -> str:
        return script_for(task).scripted_first_message(task.spec)

    def reply(self, task, history: list[dict]) -> str:
        return script_for(task).scripted_reply(task.spec, history)

    def replies(self, requests: list[tuple]) -> list:
        return _fan_out(self.reply, requests, 1)  # pure Python and fast: threads would only add overhead


# ---------------------------------------------------------------------------------------------------------------
# Factory


def _is_loopback(url: str | None) -> bool:
    host = urlparse(url).hostname if url else None
    try:
        return host == "localhost" or (host is not None and ipaddress.ip_address(host).is_loopback)
    except ValueError:  # a host name other than localhost
        return False


def make_user(kind: str, **kw):
    """"llm" -> LLMUser (model/base_url/api_key from kw, else MUARL_USER_MODEL / OPENAI_BASE_URL / OPENAI_API_KEY);
    "scripted" -> ScriptedUser (LLM settings in kw are ignored, so callers can pass one set of arguments)."""
    if kind == "scripted":
        return ScriptedUser()
    if kind != "llm":
        raise ValueError(f"unknown user kind {kind!r}: expected 'llm' or 'scripted'")
    model = kw.pop("model", None) or os.environ.get("MUARL_USER_MODEL")
    base_url = kw.pop("base_url", None) or os.environ.get("OPENAI_BASE_URL")
    api_key = kw.pop("api_key", None) or os.environ.get("OPENAI_API_KEY")
    if not model:
        raise ValueError("the LLM user needs a model: pass --user_model / model=... or set MUARL_USER_MODEL")
    if not api_key:
        if not _is_loopback(base_url):
            raise ValueError(f"the LLM user needs an API key for {base_url or 'the default OpenAI endpoint'}: "
                             "set OPENAI_API_KEY (a key-less local server must be on 127.0.0.1/localhost)")
        api_key = "EMPTY"  # a local vLLM server accepts any key, but the client insists on having one
    return LLMUser(model, base_url=base_url, api_key=api_key, **kw)


# ---------------------------------------------------------------------------------------------------------------
# Demo: a short exchange with OpenAI (if OPENAI_API_KEY is set) or a canned client; then what the simulator was sent

if __name__ == "__main__":
    from types import SimpleNamespace

    task = SimpleNamespace(id="demo/0", spec=None, instructions="Reason for call:\nReturn the desk lamp from order "
                           "#W1234567, refund to your gift card.\n\nKnown info:\nYou are Ana Lopez, zip code 10001.")
    agent_turns = ["Sure. Your name and zip code, please?", "Thanks Ana. Order #W1234567, the desk lamp, refunded to "
                   "the gift card: correct?", "Done: the return is requested, the refund goes to your gift card."]
    if os.environ.get("OPENAI_API_KEY"):
        user = make_user("llm", model=os.environ.get("MUARL_USER_MODEL", "gpt-4o-mini"))
    else:  # client.chat.completions.create() answering by turn number: what a real model would say, no network
        canned = ["Hi, I'd like to return something from a recent order.", "Sure, it's Ana Lopez, zip code 10001.",
                  "Yes, please, back to the gift card.", "Great, that's all I needed. Thanks! " + STOP]

        def create(messages, **_):
            text = canned[sum(m["role"] == "assistant" for m in messages)]
            return SimpleNamespace(choices=[SimpleNamespace(message=SimpleNamespace(content=text))])

        client = SimpleNamespace(chat=SimpleNamespace(completions=SimpleNamespace(create=create)))
        user = make_user("llm", model="fake-customer", base_url="http://127.0.0.1/v1", client=client)
    history = [{"role": "user", "content": user.first_message(task)}]
    for said in agent_turns:
        print(f"[user ] {history[-1]['content']}\n[agent] {said}")
        history.append({"role": "assistant", "content": said})
        history.append({"role": "user", "content": user.reply(task, history)})
        if end := is_terminal(history[-1]["content"]):
            break
    print(f"[user ] {history[-1]['content']}\n-> conversation ends: {end}")
    print("\nThe last request, as the simulator saw it (roles swapped):")
    for m in simulator_messages(task.instructions, history[:-1])[1:]:
        print(f"  {m['role']:>9}: {m['content']}")
    print(f"\nAPI stats: {user.stats}; first message cached: {user.first_message(task) == history[0]['content']}")
