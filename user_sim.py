"""The simulated user: the customer on the other side of every MUA-RL rollout.

MUA-RL's central idea (Zhao et al. 2025, section "Method") is to put a *user* inside the RL loop: while the policy
learns to call tools, a frozen LLM plays a customer who knows the task's hidden instructions and reveals them only
as the conversation asks. The reward still comes from the database, but the agent must earn its information by
asking. This file is that customer: `User`, the protocol rollout() and a run call; `LLMUser`, played by any
OpenAI-compatible chat endpoint (hosted, or a local vLLM server), sent what user_prompt.py builds (the conversation
with roles swapped, under a system prompt carrying the hidden instructions); `ScriptedUser`, a deterministic customer
for generated tasks, so the pipeline runs with no LLM; and USERS, the table `--user NAME` picks a row of.

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

Departures from the paper / tau2-bench (user_prompt.py lists those of the request itself):
1. The paper used GPT-4o-2024-11-20 at temperature 0 with the MUA-RL authors' prompt; any endpoint plays it here.
2. A reply's leading `<think>...</think>` block (a reasoning model served without a reasoning parser) is removed.
3. Dual-control: the opening message is text only (no tools offered), since the G rollouts of a task share it;
   tools are offered from the customer's second turn on. Tool-call ids are renumbered call_0, call_1, ... per request.
   A malformed call (arguments that are not JSON, an unknown tool) runs as an error observation, as in tau2.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

from domains import script_for
from domains.dual_control import Phone
from plumbing.preflight import OPENAI_URL, RunStopped, check_endpoint, endpoint  # noqa: F401 (endpoint, OPENAI_URL: re-exported)
from plumbing.sampling import episode_seed
from user_prompt import (GREETING, NO_REPLY, OUT_OF_SCOPE, STOP, TRANSFER, _LEADING_THINK,  # noqa: F401 (re-exported)
                         _content_of, _Garbage, _turn_of, is_terminal, simulator_messages, system_prompt)


class UserError(Exception):
    """The user simulator failed for good (retries exhausted or a non-retryable API error): abort the episode."""


# ---------------------------------------------------------------------------------------------------------------
# The User protocol: what rollout() and a run call on any customer


class User:
    """A simulated customer. rollout() calls the first two methods; a run (muarl.py, eval.py) the others, in order:
    check before it writes anything, start once its folder is ready, after at every step and evaluation, close at the
    end. A new simulator subclasses User, overrides `reply` (or `replies`) and `first_message`, and is one row of USERS.

    first_message(task, tools=False) -> str  the opening. Fixed per task: all G rollouts of a task share it, so a
                                             group's reward differences come from the agent.
    replies(requests) -> list                requests [(task, agent-side history, phone | None, seed | None)]: one
                                             answer each, in order, never raising: the text; None (the phone hit a
                                             cap: the customer says no more); or a UserError (that episode aborts,
                                             unscored). `seed` is the request's, from the episode's: reruns replay.
    check(tasks)                             what can fail before any work, without side effects (ValueError: 1 line)
    start(tasks, log)                        side effects, once the run's folder is ready (serve a model, gate it)
    after(where, report, log)                after a GRPO step (report: all_aborted, last_error) or an evaluation (its
                                             metrics): restart what died; RunStopped once down longer than down_s
    take_stats() -> dict, close()            health since the last call (log.jsonl); stop what was started
    """

    label = "a customer"  # how the results table names it
    down_s = float("inf")  # seconds every group may fail before the run stops (--user_down_s)
    workers = 1  # requests answered at once (threads)

    def first_message(self, task, tools: bool = False) -> str:
        raise NotImplementedError

    def reply(self, task, history: list[dict], phone: Phone | None = None, seed: int | None = None) -> str | None:
        raise NotImplementedError

    def replies(self, requests: list[tuple]) -> list:
        return _fan_out(self.reply, requests, self.workers)

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
            raise RunStopped(f"the customer endpoint has failed every conversation for {now - self._down_since:.0f} "
                             f"s (budget --user_down_s {self.down_s:g}); last error: "
                             f"{report.get('last_error', '')[:200].rstrip('.')}. Checkpoint saved: fix the endpoint, "
                             "then rerun with --resume")

    def take_stats(self) -> dict:
        return {}

    def close(self) -> None:
        pass


# ---------------------------------------------------------------------------------------------------------------
# LLMUser: a customer over an OpenAI-compatible endpoint


class _Deadline(Exception):
    """An attempt ran past the whole-request deadline (retried like a timeout)."""


class LLMUser(User):
    """A simulated customer played by a chat model behind any OpenAI-compatible /v1/chat/completions."""

    def __init__(self, model, base_url=None, api_key=None, temperature=0.0, seed=None, timeout=30.0,
                 max_retries=3, backoff=1.0, max_workers=16, max_tokens=512, client=None, allow_http=False,
                 down_s=float("inf"), preflight=True, prompt="auto"):
        import openai  # imported here so ScriptedUser runs without the package

        self._openai = openai
        if client is None:  # which key may go where (endpoint's rule), decided here and never by the openai client
            base_url, api_key = endpoint(base_url, api_key, allow_http)
        self.model, self.base_url, self.temperature, self.max_tokens = model, base_url, temperature, max_tokens
        self.seed, self.max_retries, self.backoff, self.max_workers = seed, max_retries, backoff, max_workers
        self.workers, self.down_s, self.preflight = max_workers, down_s, preflight
        self.label = f"{model} at T={temperature:g}"
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

    def check(self, tasks: list) -> None:
        """Preflight: the endpoint reachable, the model served, its longest opening request within its context."""
        if self.preflight and tasks:
            longest = max(tasks, key=lambda t: len(t.instructions)).instructions
            ok = check_endpoint("customer", self.model, simulator_messages(longest, []), self.max_tokens,
                                client=self.client)
            print(f"[preflight] customer {ok['model']} at {ok['base_url']}: ok ({ok})", flush=True)


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


class ScriptedUser(User):
    """Plays a generated task's spec deterministically with its domain's script (domains/synthetic.py, shop.py). A
    task with no spec (tau2's own) is played by its domain's script from the task itself, with the phone in
    dual-control worlds (domains/telecom_user.py: it performs the task's user-side gold actions when asked)."""

    def first_message(self, task, tools: bool = False) -> str:
        return script_for(task).scripted_first_message(task.spec if task.spec is not None else task)

    label = "the script"

    def reply(self, task, history: list[dict], phone: Phone | None = None, seed: int | None = None) -> str | None:
        if phone is not None:  # a dual-control world's script reads the customer's phone too
            return script_for(task).scripted_reply(task, history, phone)
        return script_for(task).scripted_reply(task.spec, history)


class SampledScriptUser(ScriptedUser):
    """The script, sampling its paraphrases: a world whose script takes a random generator (`sampled_reply(spec,
    history, rng)`, the store's) draws each reply with the request's own seed; any other plays as ScriptedUser. The
    control between a fixed script and a language model: stochastic wording, the script's decisions."""

    label = "the sampled script"

    def reply(self, task, history: list[dict], phone: Phone | None = None, seed: int | None = None) -> str | None:
        script = script_for(task)
        if phone is None and task.spec is not None and hasattr(script, "sampled_reply"):
            return script.sampled_reply(task.spec, history, random.Random(seed))
        return super().reply(task, history, phone, seed)


class FixedUser(User):
    """A customer that states the task's request and stops at the agent's first text reply (for the oracle). In a
    dual-control world (a phone comes with the request) the customer must act, so its domain's script plays it."""

    label = "a fixed line"

    def first_message(self, task, tools=False):
        if tools:
            return ScriptedUser().first_message(task)
        return task.instructions.split("\n\n")[1] if "\n\n" in task.instructions else task.instructions

    def reply(self, task, history, phone=None, seed=None):
        return "Thanks, that's all. " + STOP if phone is None else ScriptedUser().reply(task, history, phone)


# ---------------------------------------------------------------------------------------------------------------
# The table of user simulators: --user NAME picks a row; config.validate, eval.py and muarl.py read it


def _llm(model: str | None = None, **kw) -> User:
    """An LLM customer at an endpoint: model, base_url, api_key from kw, else MUARL_USER_MODEL and the environment's,
    under preflight.endpoint's rule. (A local model served for the run, --user_serve, is config.make_customer's.)"""
    model = model or os.environ.get("MUARL_USER_MODEL")
    if not model:
        raise ValueError("the LLM user needs a model: pass --user_model / model=... or set MUARL_USER_MODEL")
    return LLMUser(model, **kw)


@dataclass(frozen=True)
class UserKind:
    make: Callable[..., User]  # settings (muarl / eval flags, by LLMUser's names) -> a User; unused ones are ignored
    scripted: bool = False  # plays only worlds whose DOMAINS row has a script (config.validate checks the domains)
    endpoint: bool = False  # an LLM: the --user_model / _base_url / _api_key / _serve flags are for it


USERS = {
    "scripted": UserKind(lambda **kw: ScriptedUser(), scripted=True),
    "sampled": UserKind(lambda **kw: SampledScriptUser(), scripted=True),
    "llm": UserKind(_llm, endpoint=True),
    "fixed": UserKind(lambda **kw: FixedUser()),
}


def make_user(kind: str, **kw) -> User:
    """The User of row `kind` of USERS, built from the run's customer settings `kw`."""
    if kind not in USERS:
        raise ValueError(f"unknown user kind {kind!r}: expected one of {', '.join(USERS)}")
    return USERS[kind].make(**kw)


# ---------------------------------------------------------------------------------------------------------------
# Demo: a short exchange with OpenAI (if OPENAI_API_KEY is set) or a canned client; then what the simulator was sent

if __name__ == "__main__":
    from types import SimpleNamespace

    task = SimpleNamespace(id="demo/0", spec=None, instructions="Reason for call:\nReturn the desk lamp from order "
                           "#W1234567, refund to your gift card.\n\nKnown info:\nYou are Ana Lopez, zip code 10001.")
    canned = ["Hi, I'd like to return something from a recent order.", "Sure, it's Ana Lopez, zip code 10001.",
              "Yes, please, back to the gift card.", "Great, that's all I needed. Thanks! " + STOP]

    def create(messages, **_):  # a chat endpoint answering by turn number: what a model would say, no network
        text = canned[sum(m["role"] == "assistant" for m in messages)]
        return SimpleNamespace(choices=[SimpleNamespace(message=SimpleNamespace(content=text))])

    client = SimpleNamespace(chat=SimpleNamespace(completions=SimpleNamespace(create=create)))
    user = make_user("llm", model="fake-customer", base_url="http://127.0.0.1/v1", client=client)
    history = [{"role": "user", "content": user.first_message(task)}]
    for said in ["Your name and zip code, please?", "Order #W1234567, the desk lamp, refund to the gift card: correct?",
                 "Done: the return is requested."]:
        history += [{"role": "assistant", "content": said}, {"role": "user", "content": user.reply(task, history)}]
    print("\n".join(f"[{'agent' if m['role'] == 'assistant' else 'user '}] {m['content']}" for m in history))
    print("\nThe last request, as the simulator saw it (roles swapped):")
    for m in simulator_messages(task.instructions, history[:-1])[1:]:
        print(f"  {m['role']:>9}: {m['content']}")
    print(f"\nconversation ends: {is_terminal(history[-1]['content'])}; opening cached: "
          f"{user.first_message(task) == history[0]['content']}; USERS: {list(USERS)}; API stats: {user.stats}")
