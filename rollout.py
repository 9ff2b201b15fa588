"""Multi-turn rollouts: B tasks x G episodes of agent <-> simulated user <-> tools, as token streams with masks.

This is MUA-RL's rollout (paper, section 3): each episode is a live conversation. The policy writes a turn; if
the turn holds a tool call, the call runs on the episode's own database and the result comes back; if not, the
turn is a message to the simulated user, who answers (or ends the conversation). Rounds repeat until the
episode stops. All episodes advance together, one round at a time:

    round:  1. every live episode waiting on the agent     -> ONE batched engine.generate call
            2. tool calls                                   -> run on each episode's own env
            3. every episode waiting on the user            -> user.replies(...) concurrently
            4. caps: turns, context length                  -> stop reasons

The token stream of an episode (chat.py builds the pieces) is what the policy saw and sampled, never re-rendered:
prompt (mask 0) | agent turn as sampled, incl. its end-of-turn token (mask 1) | tool result or user message +
generation prompt (mask 0) | agent turn (mask 1) | ...  The sampler's log-probs travel with the mask-1 tokens.
Each episode samples from its own random streams (`turn_seed`: one per turn), so what it samples does not depend
on which other episodes share the batch.

Stop reasons: user_stop (the user said ###STOP### or ###OUT-OF-SCOPE###), transfer (transfer_to_human_agents
was called, or the user said ###TRANSFER###), max_turns (tool executions + user replies reached the cap, as in
the paper), context_full, malformed_call (when malformed calls end the episode), user_error (the user
simulator failed for good: the episode is *aborted*, and the trainer drops its group instead of scoring it 0).

Departures from the paper:
1. Several tool calls in one turn: only the first runs (the paper's rule) unless `all_calls=True`.
2. A malformed call ends the episode (the paper's rule) unless `malformed="observe"`, which returns the parse
   error to the agent as a tool message instead.
3. A turn cut off by `max_new_tokens` without its end-of-turn token is closed with that token at mask 0 (the
   policy did not sample it, so it is not trained) and handled like any other turn.
"""

from __future__ import annotations

import hashlib
import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import chat
from domains.base import Env, Task, World
from tools import TRANSFER_TOOL, parse_tool_calls
from user_sim import OUT_OF_SCOPE, STOP, TRANSFER, UserError, is_terminal

AGENT, USER, DONE = "agent", "user", "done"

# ---------------------------------------------------------------------------------------------------------------
# The episode record


@dataclass
class Episode:
    task: Task
    group: int  # index of the task in this batch: episodes of a group share a task (and a first user message)
    ids: list[int] = field(default_factory=list)  # (T,) the token stream
    mask: list[int] = field(default_factory=list)  # (T,) 1 = sampled by the policy (trained), 0 = context
    logprobs: list[float] = field(default_factory=list)  # (T,) sampling log-prob of each mask-1 token, 0.0 elsewhere
    messages: list[dict] = field(default_factory=list)  # readable: system, user, assistant (+tool_calls), tool
    env: Env | None = None
    state: str = AGENT  # who the episode waits on: AGENT, USER or DONE
    turns: int = 0  # tool executions + user replies (the paper's turn count)
    agent_turns: int = 0
    tool_calls: list[str] = field(default_factory=list)  # names of executed calls, in order
    stop_reason: str | None = None
    reward: float = 0.0
    info: dict = field(default_factory=dict)
    timings: dict = field(default_factory=lambda: {"generate": 0.0, "tools": 0.0, "user": 0.0})
    seed: int | None = None  # this episode's sampling seed: cfg.seed + its index in the rollout (None: unseeded)

    @property
    def aborted(self) -> bool:
        return self.stop_reason == "user_error"

    def append(self, ids: list[int], mask_value: int, logprobs: list[float] | None = None) -> None:
        # ids, mask and logprobs grow together: the mask is built here, never inferred later
        self.ids += ids
        self.mask += [mask_value] * len(ids)
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)

    def user_view(self) -> list[dict]:
        """The conversation as the user simulator may see it: text turns only, no tool calls or results."""
        out = []
        for m in self.messages:
            if m["role"] == "user" or (m["role"] == "assistant" and not m.get("tool_calls") and m.get("content")):
                out.append({"role": m["role"], "content": m["content"]})
        return out

    def stop(self, reason: str) -> None:
        self.state, self.stop_reason = DONE, reason

    def to_json(self, with_tokens: bool = False) -> dict:
        d = {
            "task_id": self.task.id,
            "group": self.group,
            "seed": self.seed,
            "reward": self.reward,
            "info": self.info,
            "stop_reason": self.stop_reason,
            "turns": self.turns,
            "agent_turns": self.agent_turns,
            "tool_calls": self.tool_calls,
            "tokens": len(self.ids),
            "trained_tokens": sum(self.mask),
            "timings": self.timings,
            "messages": self.messages,
        }
        if with_tokens:
            d.update(ids=self.ids, mask=self.mask, logprobs=self.logprobs)
        return d


@dataclass
class RolloutConfig:
    max_turns: int = 30  # tool executions + user replies (paper: 30)
    max_context: int = 32768  # tokens in one episode's stream (paper: 32,768)
    max_new_tokens: int = 1024  # per agent turn (paper: 1,024)
    temperature: float = 1.0
    top_p: float = 1.0
    all_calls: bool = False  # run every call of a turn instead of only the first
    malformed: str = "end"  # "end" the episode on a malformed call, or "observe" it as an error message
    check_outputs: bool = False  # add tau2's required-output check to the reward (MUA-RL trains without it)
    tools_in_prompt: bool = True  # render the tool schemas into the system prompt (off: learned from SFT data)
    seed: int | None = None  # episode k of a rollout samples with seed + k (see turn_seed)


def turn_seed(episode_seed: int, turn: int) -> int:
    """The engine seed of one agent turn: a hash of (episode seed, turn), so every turn of every episode draws
    from its own random stream. What an episode samples depends on its seed alone, not on which other episodes
    share the batch: episode k of rollout(tasks, G, cfg) samples the tokens that rollout([its task], 1, cfg with
    seed cfg.seed + k) samples (up to float rounding of batched matmuls; bench/bench_rollout.py relies on it)."""
    digest = hashlib.blake2b(f"{episode_seed}/{turn}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1  # 63 bits: a valid torch / vLLM seed


# ---------------------------------------------------------------------------------------------------------------
# One round's pieces


def _agent_step(ep: Episode, token_ids: list[int], logprobs: list[float], eot: int, tokenizer, cfg: RolloutConfig) -> list[dict]:
    """Append a sampled turn; return the messages it produces for the stream (tool results), or [] if it speaks."""
    ep.agent_turns += 1
    ep.append(token_ids, 1, logprobs)
    if not token_ids or token_ids[-1] != eot:
        ep.append([eot], 0)  # cut off by max_new_tokens: close the turn; the policy did not sample this token
    body = token_ids[:-1] if token_ids and token_ids[-1] == eot else token_ids
    text = tokenizer.decode(body, skip_special_tokens=False)
    parsed = parse_tool_calls(text, set(ep.env.world.tools))
    calls = parsed.calls if cfg.all_calls else parsed.calls[:1]
    msg: dict[str, Any] = {"role": "assistant", "content": parsed.content}
    if calls:
        msg["tool_calls"] = [{"type": "function", "function": c} for c in calls]
    if parsed.errors:
        msg["malformed"] = parsed.errors
    ep.messages.append(msg)

    if parsed.errors and (cfg.malformed == "end" or not calls):
        if cfg.malformed == "end":
            ep.stop("malformed_call")
            return []
        obs = [{"role": "tool", "name": "error", "content": "Error: " + "; ".join(parsed.errors)}]
        ep.messages += obs
        ep.turns += 1  # an observation, like a tool execution: counted, so a model stuck on bad calls hits the cap
        return obs
    if not calls:  # a message to the user
        ep.state = USER
        return []
    results = []
    t0 = time.perf_counter()
    for c in calls:
        out = ep.env.call(c["name"], c["arguments"])
        ep.tool_calls.append(c["name"])
        ep.turns += 1
        results.append({"role": "tool", "name": c["name"], "content": out})
        if c["name"] == TRANSFER_TOOL:
            break
    ep.timings["tools"] += time.perf_counter() - t0
    ep.messages += results
    if TRANSFER_TOOL in [r["name"] for r in results]:
        ep.stop("transfer")
        return []
    return results


def _extend(ep: Episode, new_messages: list[dict], tokenizer, cfg: RolloutConfig) -> None:
    """Append tool results / a user message + the next generation prompt (mask 0), then apply the caps."""
    ep.append(chat.delta_ids(tokenizer, new_messages), 0)
    if ep.turns >= cfg.max_turns:
        ep.stop("max_turns")
    elif len(ep.ids) >= cfg.max_context:
        ep.stop("context_full")


# ---------------------------------------------------------------------------------------------------------------
# The rollout


def rollout(
    tasks: list[Task],
    group_size: int,
    worlds: dict[str, World],
    engine,
    tokenizer,
    user,
    cfg: RolloutConfig,
    progress=None,
) -> list[Episode]:
    """Play len(tasks) x group_size episodes; return them scored, group by group (G consecutive per task)."""
    eot = chat.end_of_turn_id(tokenizer)
    # first user message: generated once per task and shared by the task's G episodes (user_sim caches it)
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(tasks)))) as pool:
        firsts = list(pool.map(_safe_first, [user] * len(tasks), tasks))

    episodes: list[Episode] = []
    for gi, (task, first) in enumerate(zip(tasks, firsts)):
        world = worlds[task.domain]
        schemas = world.tool_schemas() if cfg.tools_in_prompt else []
        for _ in range(group_size):
            ep = Episode(task=task, group=gi, env=world.new_env(),
                         seed=None if cfg.seed is None else cfg.seed + len(episodes))
            ep.messages.append({"role": "system", "content": world.policy})
            if isinstance(first, UserError):
                ep.stop("user_error")
                ep.info["user_error"] = str(first)
            else:
                ep.messages.append({"role": "user", "content": first})
                ep.append(chat.prompt_ids(tokenizer, world.policy, schemas, first), 0)
                if len(ep.ids) >= cfg.max_context:
                    ep.stop("context_full")
            episodes.append(ep)

    while any(e.state != DONE for e in episodes):
        # 1. every episode waiting on the agent: one batched generate call
        live = [e for e in episodes if e.state == AGENT]
        if live:
            t0 = time.perf_counter()
            budget = [min(cfg.max_new_tokens, cfg.max_context - len(e.ids)) for e in live]
            samples = engine.generate(
                [e.ids for e in live],
                max_new_tokens=max(budget),
                temperature=cfg.temperature,
                top_p=cfg.top_p,
                stop_token_ids=[eot],
                seed=None if cfg.seed is None else [turn_seed(e.seed, e.agent_turns) for e in live],
            )
            dt = (time.perf_counter() - t0) / len(live)
            for e, s, b in zip(live, samples, budget):
                e.timings["generate"] += dt
                ids, lps = list(s.token_ids)[:b], list(s.logprobs)[:b]  # one engine call serves many budgets
                # 2. tool calls, on each episode's own database
                new = _agent_step(e, ids, lps, eot, tokenizer, cfg)
                if new:
                    _extend(e, new, tokenizer, cfg)
                elif e.state == AGENT:  # spoke nothing and called nothing (should not happen): hand to user
                    e.state = USER
                if e.state == USER and len(e.ids) >= cfg.max_context:
                    e.stop("context_full")
        # 3. every episode waiting on the user: concurrent replies
        waiting = [e for e in episodes if e.state == USER]
        if waiting:
            t0 = time.perf_counter()
            replies = user.replies([(e.task, e.user_view()) for e in waiting])
            dt = (time.perf_counter() - t0) / len(waiting)
            for e, r in zip(waiting, replies):
                e.timings["user"] += dt
                if isinstance(r, UserError):
                    e.stop("user_error")
                    e.info["user_error"] = str(r)
                    continue
                e.turns += 1
                e.messages.append({"role": "user", "content": r})
                marker = is_terminal(r)
                if marker == STOP or marker == OUT_OF_SCOPE:
                    e.stop("user_stop")
                elif marker == TRANSFER:
                    e.stop("transfer")
                else:
                    e.state = AGENT
                    _extend(e, [{"role": "user", "content": r}], tokenizer, cfg)
        if progress is not None:
            progress(sum(e.state == DONE for e in episodes), len(episodes))

    # score: reward 1 iff the final database is the gold one (aborted episodes are not scored)
    for e in episodes:
        if not e.aborted:
            world = worlds[e.task.domain]
            e.reward, info = world.score(e.task, e.env, e.messages, check_outputs=cfg.check_outputs)
            e.info.update(info)
        e.env.close()
        e.env = None
    return episodes


def _safe_first(user, task):
    try:
        return user.first_message(task)
    except UserError as err:
        return err
    except Exception as err:  # noqa: BLE001 - a broken user simulator aborts the task's episodes, not the run
        return UserError(f"{type(err).__name__}: {err}")


class TrajectoryLog:
    """Append-only JSONL of finished episodes (one line each); a crash loses at most the line being written."""

    def __init__(self, path: str | Path, with_tokens: bool = False):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.with_tokens = with_tokens

    def write(self, episodes: list[Episode], **extra) -> None:
        with open(self.path, "a") as f:
            for e in episodes:
                f.write(json.dumps({**extra, **e.to_json(self.with_tokens)}) + "\n")
            f.flush()


if __name__ == "__main__":
    # Two synthetic tasks x G = 2, the scripted expert as the "policy" (eval.ExpertEngine replays its tokens) and
    # the scripted user: every episode should score 1. Then one episode, with its trained tokens in [[...]].
    import tempfile

    from domains import load_world
    from eval import ExpertEngine
    from models import build_tiny
    from user_sim import ScriptedUser

    world = load_world("synthetic", seed=0, n_train=20, n_test=10)
    tasks = world.tasks("test")[:2]
    _, tok = build_tiny(tempfile.mkdtemp(), texts=[world.policy] + [json.dumps(t.expert) for t in tasks])
    cfg = RolloutConfig(check_outputs=True, tools_in_prompt=False)
    eps = rollout(tasks, 2, {"synthetic": world}, ExpertEngine(tok, tasks), tok, ScriptedUser(), cfg)
    for e in eps:
        print(f"{e.task.id}: reward {e.reward}  stop {e.stop_reason}  turns {e.turns}  calls {e.tool_calls}  "
              f"tokens {len(e.ids)} (trained {sum(e.mask)})")
    print("\n" + chat.show_mask(tok, eps[0].ids, eps[0].mask))
