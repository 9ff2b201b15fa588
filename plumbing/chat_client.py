"""One chat completion that survives a flaky endpoint: a whole-request deadline, retries, health
counters.

The simulated customer (user_sim.LLMUser) asks an OpenAI-compatible endpoint for every reply,
thousands of times a run. This file is what keeps one bad request from costing an episode, and a
dead endpoint from costing a run:

    ChatClient.complete(kwargs)   one request under a whole-request deadline (a daemon thread: a server that
                                  trickles a byte a second cannot hold it), retried with exponential
                                  backoff on connection errors, timeouts, 408, 429, 5xx and garbage
                                  (200 with no usable message); any other HTTP error fails at once.
                                  Failure: UserError, one line.
    reply_text / reply_turn       what came back, checked: a non-empty message (a leading <think> block cut),
                                  or, when tools were offered, (text, [(name, arguments)]); a reply that
                                  opened a <think> it never closed is garbage, never a message
    thinking_switch(url, on)      what every request adds so that a thinking model answers without its
                                  reasoning (chat_template_kwargs, where the endpoint takes them)
    take_stats()                  calls, retries, failures, deadlines and latency percentiles since last asked
    STOP                          set on Ctrl-C (user_sim.concurrently, rollout.py): every request in flight
                                  and every retry gives up within 0.1 s, so no run waits on a hung customer
                                  to stop, and no thread outlives it

Departure from the openai client's own retries: switched off (max_retries=0), or our counts would be
a lie.
"""

from __future__ import annotations

import json
import random
import re
import threading
import time
from urllib.parse import urlparse


class UserError(Exception):
    """The user simulator failed for good (retries exhausted or a non-retryable API error): abort
    the episode."""


class Garbage(Exception):
    """The server answered 200 but the answer holds no usable message (retried like a 5xx)."""


class _Deadline(Exception):
    """An attempt ran past the whole-request deadline (retried like a timeout)."""


# --------------------------------------------------------------------------------------------------
# A thinking customer: asked not to think, and never believed when it did anyway

# Qwen3's chat template (and others') reads `enable_thinking`: false puts an empty <think></think>
# in the prompt, so the model answers at once. vLLM's server passes chat_template_kwargs to the
# template and drops names the template does not use, so a model that never thinks is unaffected.
THINKING_OFF = {"chat_template_kwargs": {"enable_thinking": False}}


def thinking_switch(base_url: str | None, thinking: bool = False) -> dict:
    """The extra arguments of every request to `base_url`: thinking switched off, unless `thinking`
    asks for the model's own default. OpenAI's own API is sent nothing: it answers HTTP 400 to a
    request field it does not know, and its models keep their reasoning out of the message anyway."""
    host = urlparse(base_url or "").hostname or ""
    if thinking or host == "api.openai.com" or host.endswith(".openai.com"):
        return {}
    return {"extra_body": THINKING_OFF}


def without_reasoning(text: str) -> str:
    """`text` after its leading reasoning block: `<think>...</think>` (a thinking model served
    without a reasoning parser), or `...</think>` (a template that opened the block in the prompt).
    A block opened and never closed is what `max_tokens` cut mid-thought: Garbage, so the request
    is retried and, failing again, the episode aborts; the agent never reads the customer's notes."""
    start = text.find("<think>")
    end = text.find("</think>", max(start, 0))
    if start >= 0 and end < 0:
        raise Garbage("the reply opened <think> and never closed it (cut while thinking: is the model's "
                      "thinking on? see --user_thinking)")
    if end >= 0 and not text[:max(start, 0)].strip():  # leading: nothing but the block before </think>
        text = text[end + len("</think>"):]
    return text.strip()


def reply_text(resp, verbatim: bool = False) -> str:
    """choices[0].message.content as a non-empty string, or Garbage. The openai client returns the
    raw body text (a str) when the server does not send JSON, so every step uses getattr."""
    choices = getattr(resp, "choices", None)
    if not choices:
        raise Garbage(f"no choices in the response ({type(resp).__name__})")
    content = getattr(getattr(choices[0], "message", None), "content", None)
    if not isinstance(content, str):
        raise Garbage(f"message content is {type(content).__name__}, not a string")
    if not content.strip():
        raise Garbage("empty message content")
    text = without_reasoning(content)  # (Garbage on a block never closed, verbatim or not)
    if verbatim:  # a benchmark that passes the reply on as it came (ACEBench)
        return content
    if not text:
        raise Garbage("empty message content once its <think> block is cut")
    # A reply cut by max_tokens (finish_reason "length") outside any reasoning is still a usable
    # customer message: its words are the customer's own.
    return text


def reply_turn(resp) -> tuple[str, list[tuple]]:
    """A reply to a request that offered tools: (text, [(name, arguments), ...]). With no calls it
    must be text (reply_text); with calls, any text beside them stays private to the customer (as in
    tau2)."""
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
        return reply_text(resp), []
    text = getattr(msg, "content", None)
    try:  # the text beside calls is private to the customer: an unclosed block is simply dropped
        return (without_reasoning(text) if isinstance(text, str) else ""), calls
    except Garbage:
        return "", calls


def transient(e: Exception) -> bool:
    """A fault worth asking again, here and in the preflight: a connection refused or cut, a
    timeout, 408, 429 or a 5xx. A 400, 401 or 404 would say the same again."""
    import openai

    return isinstance(e, openai.APIConnectionError) or isinstance(e, openai.APIStatusError) and (
        e.status_code in (408, 429) or e.status_code >= 500)


# Set when a batch of requests is abandoned on Ctrl-C (user_sim.concurrently, rollout.py): every request in
# flight and every retry then gives up at once (UserError), instead of holding the process for its deadline.
STOP = threading.Event()


class ChatClient:
    """Requests to one endpoint's /v1/chat/completions through an openai client, with the guarantees
    above."""

    def __init__(self, client, who: str, timeout: float = 30.0, max_retries: int = 3, backoff: float = 1.0,
                 extra: dict | None = None):
        """`extra`: added to every request (thinking_switch's)."""
        import openai  # imported here so scripted runs need no package

        self.oa, self.client, self.who, self.extra = openai, client, who, dict(extra or {})
        self.timeout, self.max_retries, self.backoff = timeout, max_retries, backoff
        self._guard = threading.Lock()
        self.stats = {"calls": 0, "retries": 0, "failures": 0}  # for the training log: API health at a glance
        self._step: dict = {"calls": 0, "retries": 0, "failures": 0, "deadlines": 0, "latency": []}

    def _count(self, key: str) -> None:
        with self._guard:
            if key in self.stats:  # ("deadlines" is counted per step only)
                self.stats[key] += 1
            self._step[key] += 1

    def take_stats(self) -> dict:
        """The endpoint's health since the last call, for one log.jsonl record: calls, retries,
        failures, attempts cut by the deadline, and the latency of an attempt in seconds (p50 / p90
        / p99 / max, nearest rank)."""
        with self._guard:
            step, lat = self._step, sorted(self._step.pop("latency"))
            self._step = {"calls": 0, "retries": 0, "failures": 0, "deadlines": 0, "latency": []}
        pct = {f"latency_{q}": lat[min(len(lat) - 1, int(p * len(lat)))] if lat else None
               for q, p in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("max", 1.0))}
        return {**step, **pct}

    def _attempt(self, kwargs: dict):
        """One request under the whole-request deadline. The client's timeout bounds each read, so a
        server that trickles a byte a second would hold a request for ever; here it runs on a daemon
        thread and is given up at the deadline (the thread ends when the server or the client's own
        read timeout does)."""
        box, t0 = {}, time.monotonic()

        def run():
            try:
                box["reply"] = self.client.chat.completions.create(**{**self.extra, **kwargs})
            except Exception as e:  # noqa: BLE001 - handed to complete(), which sorts retryable from fatal
                box["error"] = e

        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        while worker.is_alive() and not STOP.is_set() and time.monotonic() - t0 < self.timeout:
            worker.join(min(0.1, max(0.0, self.timeout - (time.monotonic() - t0))))  # (STOP looked at 10 x a second)
        with self._guard:
            self._step["latency"].append(time.monotonic() - t0)
        if worker.is_alive() and STOP.is_set():
            raise UserError(f"{self.who}: stopped (the run was interrupted)")
        if worker.is_alive():
            self._count("deadlines")
            raise _Deadline(f"Timeout: no complete reply within the {self.timeout:g} s deadline")
        if "error" in box:
            raise box["error"]
        return box["reply"]

    def complete(self, kwargs: dict, read=reply_text):
        """One chat completion with retries: `read(response)` (reply_text, or reply_turn when tools
        were offered), or UserError."""
        oa, last = self.oa, None
        for attempt in range(self.max_retries + 1):
            if attempt:  # exponential backoff; the jitter keeps 16 threads from retrying in lockstep
                self._count("retries")
                if STOP.wait(self.backoff * 2 ** (attempt - 1) * (1 + 0.25 * random.random())):
                    raise UserError(f"{self.who}: stopped (the run was interrupted)")
            self._count("calls")
            try:
                return read(self._attempt(kwargs))
            except Garbage as e:
                last = f"garbage reply: {e}"
            except _Deadline as e:  # a hung or trickling server: retried like a timeout
                last = str(e)
            except oa.APIStatusError as e:
                last = f"HTTP {e.status_code}: {e}"
                if not transient(e):  # 400/401/404: asking again cannot help
                    self._count("failures")
                    raise UserError(f"{self.who}: HTTP {e.status_code} (not retried): {e}") from e
            except oa.APIConnectionError as e:  # includes APITimeoutError
                last = f"{type(e).__name__}: {e}"
            except (oa.APIResponseValidationError, json.JSONDecodeError) as e:  # a body that is not valid JSON
                last = f"garbage reply: {type(e).__name__}: {e}"
        self._count("failures")
        raise UserError(f"{self.who} failed after {self.max_retries + 1} attempts; last error: {last}")
