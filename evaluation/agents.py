"""Agents other than the policy in training (rollout.PolicyAgent), for rollout.py's one loop (its
`Agent` Protocol).

    MessageAgent + openai_act  any OpenAI-compatible chat endpoint (GPT-4.1, a `vllm serve` model), message-level,
                               with the endpoint's own tool calling (the provider renders its own
                               template)
    OracleAgent                replays each task's gold actions and states the required outputs, to user_sim.FixedUser
                               (who leaves at the first reply): a check of the harness (every task
                               must score 1)
    ExpertEngine               a token *engine* that replays a generated task's scripted expert through
                               rollout.PolicyAgent: a check of the token pipeline (every episode
                               must score 1)

Message-level agents have no token stream: their episodes carry messages, tool calls and rewards, no
ids or mask (nothing to train). Their turns are asked for concurrently (threads: the endpoint is the
bottleneck).
"""

from __future__ import annotations

import inspect
import json
import threading

import chat
from domains.base import customer_only
from domains.dual_control import gold_requestors
from plumbing.sampling import Sample
from tools import ParsedTurn, as_text, check_call, clean

# --------------------------------------------------------------------------------------------------
# Message-level agents


class MessageAgent:
    """Wraps make_act(task) -> act(messages, tools[, max_tokens]) -> {"content", "tool_calls":
    [{"id", "function":
    {"name", "arguments"}}], "context": tokens so far (optional)} as a rollout Agent; one act per
    episode (the oracle keeps per-task state). max_tokens: max_new_tokens, or less when the
    endpoint's count nears max_context; a "context full" answer ends the episode context_full, any
    other failure aborts it (agent_error, kept in its transcript)."""

    def __init__(self, make_act, workers: int = 8):
        self.make_act, self.acts = make_act, {}
        self.slots = threading.Semaphore(workers)  # requests to the endpoint at once

    def begin(self, ep, rules, schemas, first):
        self.acts[id(ep)] = self.make_act(ep.task)

    def act(self, ep, cfg) -> ParsedTurn | Exception:
        act, budget = self.acts[id(ep)], max(1, min(cfg.max_new_tokens, cfg.max_context - ep.context_tokens))
        # the agent's view: never the customer's own tool calls and results (dual-control worlds);
        # the tools the episode shows now (BFCL reveals some later): an endpoint's tool calling
        # needs their schemas
        msgs, tools = [m for m in ep.messages if not customer_only(m)], ep.env.tool_schemas(ep.messages)
        try:  # an act(messages, tools) without a max_tokens parameter (the oracle's) is called without it
            takes = "max_tokens" in inspect.signature(act).parameters
            with self.slots:
                msg = act(msgs, tools, **({"max_tokens": budget} if takes else {}))
        except Exception as e:  # noqa: BLE001 - an endpoint failure aborts this episode, not the evaluation
            e.context_full = "maximum context length" in str(e)  # the phrase of vLLM's and OpenAI's HTTP 400
            return e
        ep.context_tokens = msg.get("context") or ep.context_tokens
        # The endpoint's native calls pass the same check (tools.check_call) as a local model's text.
        checked = [check_call(c.get("function") if isinstance(c, dict) else None, set(ep.env.world.tools))
                   for c in msg.get("tool_calls") or []]
        return ParsedTurn(content=clean(msg.get("content") or ""), calls=[c for c in checked if isinstance(c, dict)],
                          errors=[c for c in checked if isinstance(c, str)])

    def observe(self, ep, messages):
        pass  # no token stream: the episode's messages are the whole record


def _wire(messages: list[dict]) -> list[dict]:
    """Our messages -> the OpenAI wire format (arguments as JSON strings, an id on every call and
    tool result)."""
    def call(c):  # one tool call; our loop runs one call per turn, so one id serves ("call_0")
        return {"id": "call_0", "type": "function",
                "function": {"name": c["function"]["name"], "arguments": json.dumps(c["function"]["arguments"])}}

    # as_text: the server renders and tokenizes the contents; a customer's or a tool's marker
    # look-alikes stay text
    return [{"role": "tool", "tool_call_id": "call_0", "content": as_text(m["content"])} if m["role"] == "tool" else
            {"role": m["role"], "content": as_text(m.get("content") or "")}
            | ({"tool_calls": [call(c) for c in m["tool_calls"]]} if m.get("tool_calls") else {})
            for m in messages]


def openai_act(model: str, base_url: str | None, api_key: str | None, temperature: float = 0.0, max_tokens: int = 1024):
    """act() over any OpenAI-compatible chat endpoint, with the endpoint's native tool calling. A
    vLLM server needs `--enable-auto-tool-choice --tool-call-parser hermes` for tool calls (README
    "Endpoints"; preflight.py checks). Every request sends max_tokens (else a reply may fill the
    context); "context" is the endpoint's token count."""
    import openai  # optional dependency: only endpoint agents need it

    client = openai.OpenAI(base_url=base_url or None, api_key=api_key or "EMPTY", timeout=120, max_retries=3)

    def act(messages, tools, max_tokens=max_tokens):
        resp = client.chat.completions.create(model=model, messages=_wire(messages), tools=tools,
                                              temperature=temperature, max_tokens=max_tokens)
        msg = resp.choices[0].message
        return {"content": msg.content or "", "context": getattr(resp.usage, "total_tokens", 0), "tool_calls": [
            {"id": c.id, "function": {"name": c.function.name, "arguments": c.function.arguments}}
            for c in (msg.tool_calls or [])]}

    return act


class OracleAgent:
    """Replays the task's gold actions one per turn, then states the required outputs and says it is
    done. A gold action of the customer's (dual-control worlds) is asked for in words: only the
    customer can run it."""

    def __init__(self, task):
        self.todo, self.outputs = list(zip(task.actions, gold_requestors(task))), list(task.outputs)

    def __call__(self, messages, tools):
        if self.todo:
            a, who = self.todo.pop(0)
            if who == "user":
                return {"content": f"Please do this on your phone: {a['name']} {json.dumps(a['arguments'])}",
                        "tool_calls": []}
            return {"content": "", "tool_calls": [{"function": {"name": a["name"], "arguments": a["arguments"]}}]}
        return {"content": "Done. " + " ".join(self.outputs), "tool_calls": []}


# --------------------------------------------------------------------------------------------------
# A token engine that plays the scripted expert


class ExpertEngine:
    """Plays each generated task's scripted expert, token for token: it decodes the prompt, finds
    the task by its first customer message, counts the agent turns so far, and returns the expert's
    next assistant message (chat.assistant_ids) with log-prob 0."""

    def __init__(self, tokenizer, tasks):
        self.tok, self.header = tokenizer, "<|im_start|>assistant"
        self.script = {t.expert[0]["content"]: [chat.assistant_ids(tokenizer, m) for m in t.expert[1:]
                                                 if m["role"] == "assistant"] for t in tasks}

    def generate(self, prompts, max_new_tokens, temperature=1.0, top_p=1.0, stop_token_ids=None, seed=None):
        out = []
        for p in prompts:
            text = self.tok.decode(p, skip_special_tokens=False)
            key = next((k for k in self.script if k in text), None)
            k = text.count(self.header) - 1  # agent turns already taken
            ids = (self.script[key][k] if key is not None and k < len(self.script[key])
                   else self.tok.encode("Goodbye.") + [stop_token_ids[0]])
            out.append(Sample(token_ids=ids, logprobs=[0.0] * len(ids), finish_reason="stop"))
        return out

    update_weights = sleep = wake_up = lambda self, *args: None  # the rest of the Engine protocol: no weights here


if __name__ == "__main__":
    # The oracle on five generated retail tasks, through the one episode loop: every episode scores 1.
    from domains import load_world
    from rollout import RolloutConfig, rollout, score
    from user_sim import FixedUser

    world = load_world("synthetic", seed=0, n_train=0, n_test=5)
    for e in score(rollout(world.tasks("test"), 1, {"synthetic": world}, MessageAgent(OracleAgent), FixedUser(),
                           RolloutConfig()), {"synthetic": world}, check_outputs=True):
        print(f"{e.task.id}: reward {e.reward}  stop {e.stop_reason}  calls {e.tool_calls}")
