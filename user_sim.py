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

The customer acts (dual-control worlds, tau2's telecom: `world.user_tools`). A customer turn may call its own tools
before it speaks: `LLMUser` offers them through the OpenAI tools API (`tools=`, `tool_calls`, `tool` messages back,
asked again until it writes text), as a hosted model or `vllm serve --enable-auto-tool-choice --tool-call-parser
hermes` speaks it. The calls run on the episode's env as requestor "user" (domains/dual_control.Phone, with tau2's
caps); the customer remembers them (its later requests carry them, role-swapped), the agent never sees them.

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
5. Dual-control: the opening message is text only (no tools offered), since the G rollouts of a task share it;
   tools are offered from the customer's second turn on. Tool-call ids are renumbered call_0, call_1, ... per request.
   A malformed call (arguments that are not JSON, an unknown tool) runs as an error observation, as in tau2.
"""

from __future__ import annotations

import ipaddress
import itertools
import json
import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlparse

from domains import script_for
from sampling import episode_seed
from domains.dual_control import Phone
from user_prompt import (GREETING, NO_REPLY, OUT_OF_SCOPE, STOP, TRANSFER, _LEADING_THINK,  # noqa: F401 (re-exported)
                         is_terminal, simulator_messages, system_prompt)

class UserError(Exception):
    """The user simulator failed for good (retries exhausted or a non-retryable API error): abort the episode."""


# ---------------------------------------------------------------------------------------------------------------
# LLMUser: a customer over an OpenAI-compatible endpoint


class _Garbage(Exception):
    """The server answered 200 but the answer holds no usable message (retried like a 5xx)."""


class _Deadline(Exception):
    """An attempt ran past the whole-request deadline (retried like a timeout)."""


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


class LLMUser:
    """A simulated customer played by a chat model behind any OpenAI-compatible /v1/chat/completions."""

    def __init__(self, model, base_url=None, api_key=None, temperature=0.0, seed=None, timeout=30.0,
                 max_retries=3, backoff=1.0, max_workers=16, max_tokens=512, client=None, allow_http=False):
        import openai  # imported here so ScriptedUser runs without the package

        self._openai = openai
        if client is None:  # which key may go where (endpoint's rule), decided here and never by the openai client
            base_url, api_key = endpoint(base_url, api_key, allow_http)
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

    def complete(self, messages: list[dict], tools: list[dict] | None = None, sampling: dict | None = None,
                 verbatim: bool = False, seed: int | None = None):
        """One chat completion with retries; returns the reply text or raises UserError. With `tools` (the OpenAI
        tools API), returns (text, calls) instead: see _turn_of. `seed`: this request's sampling seed (the
        episode's, from rollout.py), else the customer's own; the OpenAI API and vLLM's server take one per request,
        so a rerun of one seed meets the same customer replies."""
        kwargs = dict(model=self.model, messages=messages, temperature=self.temperature, max_tokens=self.max_tokens)
        kwargs.update(sampling or {})  # a benchmark's own customer settings (ACEBench: temperature 0.001, top_p 1)
        if tools:
            kwargs["tools"] = tools
        if seed is not None or self.seed is not None:
            kwargs["seed"] = (seed if seed is not None else self.seed) % 2**31  # (any endpoint takes an int32)
        oa, last, who = self._openai, None, f"user simulator {self.model!r} at {self.base_url}"
        for attempt in range(self.max_retries + 1):
            if attempt:  # exponential backoff; the jitter keeps 16 threads from retrying in lockstep
                self._count("retries")
                time.sleep(self.backoff * 2 ** (attempt - 1) * (1 + 0.25 * random.random()))
            self._count("calls")
            try:
                resp = self._attempt(kwargs)
                return _content_of(resp, verbatim) if not tools else _turn_of(resp)
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

    def first_message(self, task, tools: bool = False) -> str:
        """The customer's opening for this task: generated once, then shared by every rollout of the task (`tools`:
        the customer has a phone; its rules are in the prompt, but the opening is text, see departure 5)."""
        with self._guard:
            lock = self._locks.setdefault(task.id, threading.Lock())
        with lock:  # concurrent callers for one task queue here; the first one generates, the rest read the cache
            if task.id not in self._first:
                v = _variant(task)  # a fixed opening (ACEBench's multi-step question) needs no model
                # Not cached on failure: a later call (e.g. next epoch) tries again instead of failing forever.
                self._first[task.id] = v["opening"] if v and "opening" in v else self.complete(
                    simulator_messages(task.instructions, [], v, tools), sampling=(v or {}).get("sampling"),
                    verbatim=bool(v), seed=None if self.seed is None else episode_seed(self.seed, "opening", task.id))
            return self._first[task.id]

    def reply(self, task, history: list[dict], phone: Phone | None = None, seed: int | None = None) -> str | None:
        """The customer's next message, given the agent-side text conversation so far. With a `phone` (dual-control)
        the model may first call its tools: they run, their results go back, and it is asked again until it writes
        text. None: the phone hit a cap mid-turn (phone.stop says which) and the customer says nothing more."""
        if phone is None:
            v = _variant(task)
            return self.complete(simulator_messages(task.instructions, history, v), sampling=(v or {}).get("sampling"),
                                 verbatim=bool(v), seed=seed)
        for k in itertools.count():  # bounded: each round runs >= 1 call; the phone stops at the episode's turns left
            text, calls = self.complete(simulator_messages(task.instructions, history + phone.new, tools=True),
                                        tools=phone.env.world.user_tool_schemas(),
                                        seed=None if seed is None else episode_seed(seed, k))
            if not calls:
                return text
            phone.run(calls, text)
            if phone.stop:
                return None

    def replies(self, requests: list[tuple]) -> list:
        """reply() for many (task, history[, phone]) requests at once; order kept; a failure comes back as a
        UserError."""
        return _fan_out(self.reply, requests, self.max_workers)


def _variant(task) -> dict | None:
    spec = getattr(task, "spec", None)
    return spec.get("simulator") if isinstance(spec, dict) else None


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
    """Plays a generated task's spec deterministically with its domain's script (domains/synthetic.py, shop.py). A
    task with no spec (tau2's own) is played by its domain's script from the task itself, with the phone in
    dual-control worlds (domains/telecom_user.py: it performs the task's user-side gold actions when asked)."""

    def first_message(self, task, tools: bool = False) -> str:
        return script_for(task).scripted_first_message(task.spec if task.spec is not None else task)

    def reply(self, task, history: list[dict], phone: Phone | None = None, seed: int | None = None) -> str | None:
        if phone is not None:
            return script_for(task).scripted_reply(task, history, phone)
        return script_for(task).scripted_reply(task.spec, history)

    def replies(self, requests: list[tuple]) -> list:
        return _fan_out(self.reply, requests, 1)  # pure Python and fast: threads would only add overhead


class SampledScriptUser(ScriptedUser):
    """The script, sampling its paraphrases: a world whose script takes a random generator (`sampled_reply(spec,
    history, rng)`, the store's) draws each reply with the request's own seed; any other plays as ScriptedUser. The
    control between a fixed script and a language model: stochastic wording, the script's decisions."""

    def reply(self, task, history: list[dict], phone: Phone | None = None, seed: int | None = None) -> str | None:
        script = script_for(task)
        if phone is None and task.spec is not None and hasattr(script, "sampled_reply"):
            return script.sampled_reply(task.spec, history, random.Random(seed))
        return super().reply(task, history, phone, seed)


# ---------------------------------------------------------------------------------------------------------------
# Factory


OPENAI_URL = "https://api.openai.com/v1"  # the openai client's default endpoint


def _is_loopback(url: str | None) -> bool:
    host = urlparse(url).hostname if url else None
    try:
        return host == "localhost" or (host is not None and ipaddress.ip_address(host).is_loopback)
    except ValueError:  # a host name other than localhost
        return False


def endpoint(base_url: str | None, api_key: str | None, allow_http: bool = False, flag: str = "--user",
             env=os.environ) -> tuple[str, str]:
    """(base_url, key) for a client, or ValueError (one line, no key in it). A key goes only to its own host: one given
    with the URL (`{flag}_api_key`, a served customer's) to that URL; $OPENAI_API_KEY only to $OPENAI_BASE_URL (unset:
    OpenAI's). Loopback needs none ("EMPTY"). Plain http off this machine (key and words readable on the way) only
    with `allow_http` (--allow_insecure_http). Both come back explicit, or the openai client reads the variables."""
    own_url = env.get("OPENAI_BASE_URL") or OPENAI_URL
    url = (base_url or own_url).rstrip("/")
    where = urlparse(url)
    if where.scheme not in ("http", "https") or not where.hostname:
        raise ValueError(f"{flag}_base_url {url!r} is not an http(s) URL (e.g. http://127.0.0.1:8000/v1)")
    same = (where.scheme, where.hostname, where.port) == (lambda u: (u.scheme, u.hostname, u.port))(urlparse(own_url))
    key = api_key or (env.get("OPENAI_API_KEY") if same else None) or ("EMPTY" if _is_loopback(url) else None)
    if key is None:
        raise ValueError(f"the LLM endpoint {url} needs an API key: pass {flag}_api_key (the environment's "
                         f"OPENAI_API_KEY is sent only to {own_url}, where it belongs)")
    if where.scheme == "http" and not _is_loopback(url) and not allow_http:
        raise ValueError(f"{flag}_base_url {url} is plain http to another machine: the key and the conversations "
                         "would cross the network readable; use https, or pass --allow_insecure_http")
    return url, key


def make_user(kind: str, **kw):
    """"llm" -> LLMUser (model/base_url/api_key from kw, else MUARL_USER_MODEL and the environment's endpoint and key,
    under endpoint()'s rule); "scripted" -> ScriptedUser, "sampled" -> SampledScriptUser (LLM settings in kw are
    ignored, so callers can pass one set of arguments)."""
    if kind in ("scripted", "sampled"):
        return ScriptedUser() if kind == "scripted" else SampledScriptUser()
    if kind != "llm":
        raise ValueError(f"unknown user kind {kind!r}: expected 'llm', 'scripted' or 'sampled'")
    model = kw.pop("model", None) or os.environ.get("MUARL_USER_MODEL")
    if not model:
        raise ValueError("the LLM user needs a model: pass --user_model / model=... or set MUARL_USER_MODEL")
    return LLMUser(model, **kw)


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
