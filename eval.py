"""Evaluation: pass^k on held-out tasks, with the paper's diagnostics (turns, tool-call mix, stop reasons).

    python eval.py --model runs/muarl/final --domain synthetic --user scripted          # a local model, greedy
    python eval.py --agent openai --agent_model gpt-4.1 --domain retail --user llm ...   # any chat endpoint
    python eval.py --agent oracle --domain retail,airline --split test                 # replays gold actions

pass^k (tau-bench): run every task k times; with c successes out of n trials, a task contributes
C(c, k) / C(n, k), the chance that k trials drawn without replacement all succeed; pass^k is the mean over
tasks. pass^1 is the plain success rate. MUA-RL reports pass^1 (greedy agent, user at temperature 0, mean of 4
runs). A greedy local agent with the scripted user plays every trial identically; `--temperature 1` samples the
agent (trial j of task i with its own seed, reproducible with `--seed`), so pass^k measures consistency.

Three kinds of agent:
  local    a model through an engine (engine.py), token in / token out, exactly the rollout of training
  openai   any OpenAI-compatible chat endpoint (GPT-4.1, a `vllm serve` model): message-level, with the
           endpoint's own tool-calling, so the model's provider renders its own template
  oracle   replays each task's gold actions, one call per turn, then says the required outputs: a check of the
           harness itself (every task must score 1 on the DB check)

Departure from tau2's evaluation: the reward is the DB check plus, with --check_outputs (default on here),
the required-output check; tau2's newest NL assertions need an LLM judge and are not run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rollout import Episode, RolloutConfig, TrajectoryLog, rollout
from tools import TRANSFER_TOOL, GENERIC_TOOLS
from user_sim import OUT_OF_SCOPE, STOP, TRANSFER, UserError, is_terminal

GENERIC = {fn.__name__ for fn in GENERIC_TOOLS}

# ---------------------------------------------------------------------------------------------------------------
# Metrics


def pass_hat_k(successes: dict[str, list[bool]], k: int) -> float:
    """tau-bench's pass^k: mean over tasks of C(c, k) / C(n, k)."""
    vals = [math.comb(sum(s), k) / math.comb(len(s), k) for s in successes.values() if len(s) >= k]
    return sum(vals) / len(vals) if vals else float("nan")


def summarize(episodes: list[Episode], trials: int) -> dict:
    scored = [e for e in episodes if not e.aborted]
    by_task: dict[str, list[bool]] = {}
    for e in scored:
        by_task.setdefault(e.task.id, []).append(e.reward == 1.0)
    calls = Counter(c for e in scored for c in e.tool_calls)
    n_calls = max(1, sum(calls.values()))
    m = {f"pass^{k}": pass_hat_k(by_task, k) for k in range(1, trials + 1)}
    m.update(
        episodes=len(episodes),
        aborted=len(episodes) - len(scored),
        avg_turns=sum(e.turns for e in scored) / max(1, len(scored)),
        avg_agent_turns=sum(e.agent_turns for e in scored) / max(1, len(scored)),
        calls_per_episode=sum(calls.values()) / max(1, len(scored)),
        think_rate=calls["think"] / n_calls,
        calculate_rate=calls["calculate"] / n_calls,
        transfer_rate=calls[TRANSFER_TOOL] / n_calls,
        stop_reasons=dict(Counter(e.stop_reason for e in episodes)),
        tool_mix=dict(calls.most_common()),
    )
    return m


def format_table(rows: list[tuple[str, dict]], trials: int = 1) -> str:
    """Paper-style table: one row per (model, metrics)."""
    cols = [f"pass^{k}" for k in range(1, trials + 1)] + ["avg_turns", "calls_per_episode", "think_rate",
                                                           "calculate_rate", "transfer_rate", "aborted"]
    head = "| model | " + " | ".join(cols) + " | stop reasons |"
    lines = [head, "|" + "---|" * (len(cols) + 2)]
    for name, m in rows:
        cells = []
        for c in cols:
            v = m.get(c, float("nan"))
            cells.append(f"{100 * v:.1f}" if c.startswith("pass") else (f"{v:.3f}" if isinstance(v, float) else str(v)))
        stops = ", ".join(f"{k}:{v}" for k, v in sorted(m.get("stop_reasons", {}).items(), key=lambda kv: -kv[1]))
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {stops} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------
# Local model: the training rollout, greedy


def evaluate(tasks, worlds, engine, tokenizer, user, cfg: RolloutConfig, trials: int = 1, batch: int = 64,
             log: TrajectoryLog | None = None, progress: bool = True) -> tuple[dict, list[Episode]]:
    """Run every task `trials` times (in batches of `batch` tasks); return (metrics, episodes)."""
    from tqdm import tqdm

    episodes = []
    bar = tqdm(total=len(tasks) * trials, desc="eval", disable=not progress, leave=False)
    for s in range(0, len(tasks), batch):
        chunk = tasks[s : s + batch]
        seeded = cfg if cfg.seed is None else dataclasses.replace(cfg, seed=cfg.seed + s * trials)  # no repeats
        eps = rollout(chunk, trials, worlds, engine, tokenizer, user, seeded)
        if log is not None:
            log.write(eps, phase="eval")
        episodes += eps
        bar.update(len(eps))
    bar.close()
    return summarize(episodes, trials), episodes


# ---------------------------------------------------------------------------------------------------------------
# Message-level agents: an OpenAI-compatible endpoint, or the oracle


def message_episode(task, world, act, user, cfg: RolloutConfig) -> Episode:
    """One conversation where the agent is a function act(messages, tools) -> assistant message dict
    ({"content", "tool_calls": [{"id", "function": {"name", "arguments"}}]}). Same caps, stops and reward."""
    ep = Episode(task=task, group=0, env=world.new_env())
    schemas = world.tool_schemas()
    ep.messages = [{"role": "system", "content": world.policy}]
    try:
        ep.messages.append({"role": "user", "content": user.first_message(task)})
        while ep.stop_reason is None:
            msg = act(ep.messages, schemas)
            ep.agent_turns += 1
            calls = msg.get("tool_calls") or []
            ep.messages.append({"role": "assistant", "content": msg.get("content") or "", **({"tool_calls": calls[:1]} if calls else {})})
            if calls:
                c = calls[0]["function"]
                args = c["arguments"]
                if isinstance(args, str):
                    try:
                        args = json.loads(args)
                    except json.JSONDecodeError:
                        ep.stop("malformed_call")
                        break
                out = ep.env.call(c["name"], args)
                ep.tool_calls.append(c["name"])
                ep.turns += 1
                ep.messages.append({"role": "tool", "tool_call_id": calls[0].get("id", "call_0"), "name": c["name"], "content": out})
                if c["name"] == TRANSFER_TOOL:
                    ep.stop("transfer")
            else:
                reply = user.reply(task, ep.user_view())
                ep.turns += 1
                ep.messages.append({"role": "user", "content": reply})
                marker = is_terminal(reply)
                if marker in (STOP, OUT_OF_SCOPE):
                    ep.stop("user_stop")
                elif marker == TRANSFER:
                    ep.stop("transfer")
            if ep.stop_reason is None and ep.turns >= cfg.max_turns:
                ep.stop("max_turns")
    except UserError as err:
        ep.stop("user_error")
        ep.info["user_error"] = str(err)
    if not ep.aborted:
        ep.reward, info = world.score(task, ep.env, ep.messages, check_outputs=cfg.check_outputs)
        ep.info.update(info)
    ep.env.close()
    ep.env = None
    return ep


def openai_agent(model: str, base_url: str | None, api_key: str | None, temperature: float = 0.0):
    """act() over any OpenAI-compatible chat endpoint, with the endpoint's native tool calling."""
    import openai

    client = openai.OpenAI(base_url=base_url or None, api_key=api_key or "EMPTY", timeout=120, max_retries=3)

    def act(messages, tools):
        wire = []
        for m in messages:  # the wire format wants arguments as JSON strings and an id on every call
            m = dict(m)
            if m.get("tool_calls"):
                m["tool_calls"] = [{"id": c.get("id", f"call_{i}"), "type": "function", "function": {
                    "name": c["function"]["name"], "arguments": json.dumps(c["function"]["arguments"])
                    if not isinstance(c["function"]["arguments"], str) else c["function"]["arguments"]}}
                    for i, c in enumerate(m["tool_calls"])]
            if m["role"] == "tool":
                m = {"role": "tool", "tool_call_id": m.get("tool_call_id", "call_0"), "content": m["content"]}
            wire.append(m)
        r = client.chat.completions.create(model=model, messages=wire, tools=tools, temperature=temperature)
        msg = r.choices[0].message
        calls = [{"id": c.id, "function": {"name": c.function.name, "arguments": c.function.arguments}}
                 for c in (msg.tool_calls or [])]
        return {"content": msg.content or "", "tool_calls": calls}

    return act


class OracleAgent:
    """Replays the task's gold actions one per turn, then states the required outputs and says it is done."""

    def __init__(self, task):
        self.todo = list(task.actions)
        self.outputs = list(task.outputs)

    def __call__(self, messages, tools):
        if self.todo:
            a = self.todo.pop(0)
            return {"content": "", "tool_calls": [{"id": "call_0", "function": {"name": a["name"], "arguments": a["arguments"]}}]}
        return {"content": "Done. " + " ".join(self.outputs), "tool_calls": []}


class FixedUser:
    """A user that states the task's request and stops at the agent's first text reply (for the oracle check)."""

    def first_message(self, task):
        return task.instructions.split("\n\n")[1] if "\n\n" in task.instructions else task.instructions

    def reply(self, task, history):
        return "Thanks, that's all. " + STOP

    def replies(self, requests):
        return [self.reply(t, h) for t, h in requests]


def evaluate_messages(tasks, worlds, make_act, user, cfg: RolloutConfig, trials: int = 1, workers: int = 8):
    jobs = [t for t in tasks for _ in range(trials)]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        eps = list(pool.map(lambda t: message_episode(t, worlds[t.domain], make_act(t), user, cfg), jobs))
    return summarize(eps, trials), eps


# ---------------------------------------------------------------------------------------------------------------
# Command line


def main(argv=None):
    p = argparse.ArgumentParser(description="Evaluate an agent: pass^k, turns, tool mix, stop reasons")
    p.add_argument("--agent", default="local", choices=["local", "openai", "oracle"])
    p.add_argument("--model", default="", help="local model path / HF id (agent=local)")
    p.add_argument("--engine", default="hf", choices=["hf", "vllm"])
    p.add_argument("--agent_model", default="", help="model name at the endpoint (agent=openai)")
    p.add_argument("--agent_base_url", default="")
    p.add_argument("--agent_api_key", default="")
    p.add_argument("--domain", default="shop", help="comma-separated: retail, airline, synthetic, shop")
    p.add_argument("--split", default="test")
    p.add_argument("--tasks", type=int, default=0, help="first N tasks of the split (0 = all)")
    p.add_argument("--trials", type=int, default=1, help="k: runs per task (pass^1 ... pass^k)")
    p.add_argument("--user", default="scripted", choices=["scripted", "llm", "fixed"])
    p.add_argument("--user_model", default="")
    p.add_argument("--user_base_url", default="")
    p.add_argument("--user_api_key", default="")
    p.add_argument("--check_outputs", type=int, default=1)
    p.add_argument("--max_turns", type=int, default=30)
    p.add_argument("--max_new_tokens", type=int, default=1024)
    p.add_argument("--max_context", type=int, default=32768)
    p.add_argument("--tools_in_prompt", type=int, default=1)
    p.add_argument("--temperature", type=float, default=0.0,
                   help="the agent's: 0 = greedy (its k trials differ only through the user); > 0 samples, so "
                        "pass^k measures consistency over k sampled conversations")
    p.add_argument("--top_p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0, help="sampling seed: trial j of task i samples with seed + i * k + j")
    p.add_argument("--data_dir", default="")
    p.add_argument("--synthetic_seed", type=int, default=0, help="seed of the synthetic / shop world (as in muarl.py)")
    p.add_argument("--out", default="runs/eval/transcripts.jsonl")
    a = p.parse_args(argv)

    from domains import load_world
    from user_sim import make_user

    worlds = {}
    for d in a.domain.split(","):
        kw = {"data_dir": a.data_dir or None}
        if d == "synthetic":  # generated worlds: the held-out tasks are a function of the seed
            kw = {"seed": a.synthetic_seed}
        elif d == "shop":  # (no training tasks needed to evaluate)
            kw = {"seed": a.synthetic_seed, "n_train": 0}
        worlds[d] = load_world(d, **kw)
    tasks = [t for w in worlds.values() for t in w.tasks(a.split)]
    tasks = tasks[: a.tasks] if a.tasks else tasks
    if a.temperature < 0 or not 0 < a.top_p <= 1:
        p.error(f"--temperature must be >= 0 and --top_p in (0, 1], got {a.temperature} and {a.top_p}")
    cfg = RolloutConfig(max_turns=a.max_turns, max_new_tokens=a.max_new_tokens, max_context=a.max_context,
                        temperature=a.temperature, top_p=a.top_p, seed=a.seed, check_outputs=bool(a.check_outputs),
                        tools_in_prompt=bool(a.tools_in_prompt))
    if a.agent == "oracle" or a.user == "fixed":
        user = FixedUser()
    else:
        user = make_user(a.user, model=a.user_model or None, base_url=a.user_base_url or None, api_key=a.user_api_key or None)
    t0 = time.time()
    if a.agent == "local":
        from engine import make_engine
        from models import load_policy

        model, tok = load_policy(a.model)
        engine = make_engine(a.engine, model=model, tokenizer=tok, model_path=a.model)
        metrics, eps = evaluate(tasks, worlds, engine, tok, user, cfg, trials=a.trials)
        name = a.model
    else:
        if a.agent == "oracle":
            make_act, name = OracleAgent, "oracle (gold actions)"
        else:
            act = openai_agent(a.agent_model, a.agent_base_url, a.agent_api_key, a.temperature)
            make_act, name = (lambda t: act), a.agent_model
        metrics, eps = evaluate_messages(tasks, worlds, make_act, user, cfg, trials=a.trials)
    TrajectoryLog(a.out).write(eps, phase="eval", agent=name)
    print(f"{len(tasks)} tasks x {a.trials} trials on {a.domain}/{a.split} in {time.time() - t0:.1f}s; transcripts: {a.out}")
    print(format_table([(name, metrics)], a.trials))
    return metrics


if __name__ == "__main__":
    main()


class ExpertEngine:
    """An engine that plays each synthetic task's scripted expert, token for token, through the real rollout.

    It reads the prompt it is given (decoded), finds the task by its first user message and counts the agent
    turns so far, then returns the tokens of the expert's next assistant message (chat.assistant_ids) with
    log-prob 0. A check of the token pipeline end to end: with the scripted user, every episode must score 1.
    """

    def __init__(self, tokenizer, tasks):
        import chat

        self.tok = tokenizer
        self.header = "<|im_start|>assistant"
        self.script = {}
        for t in tasks:
            turns = [m for m in t.expert[1:] if m["role"] == "assistant"]
            self.script[t.expert[0]["content"]] = [chat.assistant_ids(tokenizer, m) for m in turns]

    def generate(self, prompts, max_new_tokens, temperature=1.0, top_p=1.0, stop_token_ids=None, seed=None):
        from engine import Sample

        out = []
        for p in prompts:
            text = self.tok.decode(p, skip_special_tokens=False)
            key = next((k for k in self.script if k in text), None)
            k = text.count(self.header) - 1  # agent turns already taken
            ids = self.script[key][k] if key is not None and k < len(self.script[key]) else self.tok.encode("Goodbye.") + [stop_token_ids[0]]
            out.append(Sample(token_ids=ids, logprobs=[0.0] * len(ids), finish_reason="stop"))
        return out

    def update_weights(self, named_tensors):
        pass

    def sleep(self):
        pass

    def wake_up(self):
        pass
