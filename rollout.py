"""Multi-turn rollouts: B tasks x G episodes of agent <-> customer <-> tools, the one episode loop.

MUA-RL's rollout (Zhao et al. 2025, arXiv:2508.18669, section 3): each episode is a live
conversation. The agent writes a turn; a tool call in it runs on the episode's own database and the
result comes back; a turn without one is a message to the customer, who answers (or ends it).
Training (muarl.py) and evaluation (eval.py) both run conversations through `rollout()` alone.

Every episode plays on its own thread, as one story (`play`), and never waits on another:

    agent turn -> a tool call runs on the episode's env  -> agent turn -> ...
               -> or a message: the customer answers     -> agent turn -> ...   until an ending
    then:   score(episodes, worlds)                       -> reward 1 iff the final database is right

The calling thread owns the engine (engine.Batcher): an agent turn goes to it the moment its
episode's tool result or customer reply is in, batched with whatever else is pending, so a slow
customer or a long turn delays only its own episode. `RolloutConfig.rounds` makes the engine wait
for every episode instead (lock-step rounds: the same batches on every run, so bit-for-bit repeatable).
`PolicyAgent`, the model being trained, owns each episode's token stream (chat.py builds the
pieces), exactly what the policy saw and sampled, never re-rendered: prompt (mask 0) | agent turn as
sampled, with its end-of-turn token (mask 1) | tool result or customer message + generation prompt
(mask 0) | agent turn (mask 1) | ... Log-probs ride on the mask-1 tokens; `Episode.spans` records
each piece's author. Message-level agents (evaluation/agents.py) play the same loop without tokens.

Seeds: episode j of a task's k-th draw in a call samples with episode_seed(cfg.seed, task id, k, j),
its turns with episode_seed(that, turn), its customer's replies with episode_seed(that, "user",
turn): not on its batch-mates nor on the order replies come back in, so evaluation and training,
and two runs, give the same episodes on one seed (up to the engine's numerics in a batch).

Stop reasons: user_stop (###STOP### or ###OUT-OF-SCOPE###), transfer (transfer_to_human_agents,
or ###TRANSFER###), max_turns (the agent's tool executions + customer replies reached the paper's
cap), max_messages and too_many_errors (tau2's caps: scored 0), context_full, malformed_call;
user_error / agent_error (an endpoint failed for good): the episode is *aborted*, never scored, and
the trainer drops its group instead of scoring it 0.

Departures from the paper:
1. Several tool calls in one turn: only the first runs (the paper's rule) unless `all_calls`.
2. A malformed call ends the episode (the paper's rule) unless `malformed="observe"`.
3. A turn cut off by `max_new_tokens` is closed with the end-of-turn token at mask 0 (the policy
   did not sample it, so it is not trained) and handled like any other turn.
4. Dual control (telecom): the customer's own tool calls (dual_control.Phone) are not turns of the
   paper's cap; they reach the readable `messages`, never the agent's stream: it hears only text.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import chat
from domains.base import Env, Task, World, customer_only
from domains.dual_control import Phone, too_many_errors
from engine import Batcher
from plumbing import chat_client
from plumbing.sampling import episode_seed
from tools import TRANSFER_TOOL, ParsedTurn, clean
from user_sim import OUT_OF_SCOPE, STOP, TRANSFER, User, UserError, concurrently, is_terminal

AGENT, USER, DONE = "agent", "user", "done"  # whom an episode waits on
ABORTED = ("user_error", "agent_error")  # stop reasons that say nothing about the agent: unscored
ENDS = {STOP: "user_stop", OUT_OF_SCOPE: "user_stop", TRANSFER: "transfer"}  # the customer's ends
ZERO = ("too_many_errors", "max_messages")  # endings tau2 scores 0, whatever the state reached

# --------------------------------------------------------------------------------------------------
# The episode record


@dataclass
class Episode:
    task: Task
    group: int  # the task's index in the batch: a group's episodes share a task and an opening
    ids: list[int] = field(default_factory=list)  # (T,) the token stream (message-level: empty)
    mask: list[int] = field(default_factory=list)  # (T,) 1 = sampled by the policy (trained)
    logprobs: list[float] = field(default_factory=list)  # (T,) sampling log-probs, 0.0 at mask 0
    spans: list[dict] = field(default_factory=list)  # one per piece: {"who", "start", "end"}
    messages: list[dict] = field(default_factory=list)  # readable: system, user, assistant, tool
    env: Env | None = None
    state: str = AGENT
    turns: int = 0  # the agent's tool executions + customer replies (the paper's turn count)
    agent_turns: int = 0
    tool_calls: list[str] = field(default_factory=list)  # names of executed calls, in order
    stop_reason: str | None = None
    reward: float = 0.0
    info: dict = field(default_factory=dict)
    timings: dict = field(default_factory=lambda: {"generate": 0.0, "tools": 0.0, "user": 0.0})
    seed: int | None = None  # this episode's sampling seed (None: unseeded)
    context_tokens: int = 0  # message-level agents: the endpoint's own count of the conversation
    key: int = 0  # the episode's place in its rollout

    @property
    def aborted(self) -> bool:
        return self.stop_reason in ABORTED

    def append(self, ids: list[int], mask: int | list[int], logprobs: list[float] | None = None,
               who: str = "context") -> None:
        """Grow ids, mask and logprobs together (the mask is built here, never inferred) and record
        the piece as a span: who is "prompt", "agent" (a sampled turn), "tool" or "user"."""
        self.spans.append({"who": who, "start": len(self.ids), "end": len(self.ids) + len(ids)})
        self.ids += ids
        self.mask += mask if isinstance(mask, list) else [mask] * len(ids)
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)

    def customer_history(self) -> list[dict]:
        """The conversation as the customer lives it: text turns, no agent tool calls or results;
        in dual control also its own tool calls and results (customer_only), kept as calls."""
        said = [m for m in self.messages if customer_only(m) or m["role"] == "user"
                or (m["role"] == "assistant" and not m.get("tool_calls") and m.get("content"))]
        return [m if customer_only(m) else {"role": m["role"], "content": m["content"]} for m in said]

    def stop(self, reason: str, error: str | None = None) -> None:  # (an aborted one keeps why, in info)
        self.state, self.stop_reason = DONE, reason
        self.info.update({reason: error} if error is not None else {})

    def to_json(self, with_tokens: bool = False) -> dict:
        keys = ("group", "seed", "reward", "info", "stop_reason", "turns", "agent_turns", "tool_calls", "timings")
        d = {"task_id": self.task.id, **{k: getattr(self, k) for k in keys},
             "messages": self.messages, "tokens": len(self.ids), "trained_tokens": sum(self.mask)}
        if with_tokens:
            d.update(ids=self.ids, mask=self.mask, logprobs=self.logprobs, spans=self.spans)
        return d


@dataclass
class RolloutConfig:
    max_turns: int = 30  # the agent's tool executions + customer replies (paper: 30)
    max_context: int = 32768  # tokens in one episode's stream (paper: 32,768)
    max_new_tokens: int = 1024  # per agent turn (paper: 1,024)
    temperature: float = 1.0
    top_p: float = 1.0
    all_calls: bool = False  # run every call of a turn instead of only the first
    malformed: str = "end"  # a malformed call: "end" the episode, or "observe" it (an error shown)
    tools_in_prompt: bool = True  # tool schemas in the system prompt (off: learned from SFT data)
    seed: int | None = None  # the rollout's seed: every episode's own derives from it
    max_messages: int = 0  # tau2's cap on a conversation's messages (its max_steps, 200); 0: none
    max_errors: int = 0  # tau2's cap on failed tool calls, both sides (10); 0: dual control's own
    lockstep: bool = False  # the engine waits for every episode (engine.Batcher): repeatable batches

    @classmethod
    def of(cls, cfg, greedy: bool = False, seed: int | None = None) -> "RolloutConfig":
        """A run's flags (config.Config) as the rollout takes them; `greedy` for evaluation."""
        return cls(cfg.max_turns, cfg.max_context, cfg.max_new_tokens,
                   0.0 if greedy else cfg.temperature, cfg.top_p, seed=seed,
                   tools_in_prompt=cfg.tools_in_prompt, malformed=cfg.malformed, lockstep=cfg.lockstep)


# --------------------------------------------------------------------------------------------------
# Agents: who writes the agent's turns


class Agent(Protocol):
    """The agent side of the loop: rollout() calls begin() once per episode, then, on the episode's
    own thread, act() for each of its turns and observe() with what came back (tool results, or the
    customer's reply). act() returns a tools.ParsedTurn (text, calls, parse errors) or, if the agent
    itself failed, an Exception. An agent with an engine also has serve(), which rollout() runs on
    the calling thread while the episodes play (PolicyAgent's batches their turns), and leave(ep),
    called as each episode ends."""

    def begin(self, ep: Episode, rules: str, schemas: list[dict], first: str) -> None: ...

    def act(self, ep: Episode, cfg: RolloutConfig) -> ParsedTurn | Exception: ...

    def observe(self, ep: Episode, messages: list[dict]) -> None: ...


class PolicyAgent:
    """The model being trained, through a token engine (engine.py) that a Batcher shares among the
    episodes. It owns each episode's token stream: training updates exactly the tokens that were
    sampled."""

    def __init__(self, engine, tokenizer):
        self.engine, self.tok, self.eot = engine, tokenizer, chat.end_of_turn_id(tokenizer)
        self.batcher = Batcher(engine)

    def begin(self, ep, rules, schemas, first):  # system + tools + the first message (mask 0)
        ep.append(chat.prompt_ids(self.tok, rules, schemas, first), 0, who="prompt")

    def act(self, ep, cfg):
        budget = min(cfg.max_new_tokens, cfg.max_context - len(ep.ids))
        seed = None if ep.seed is None else episode_seed(ep.seed, ep.agent_turns)
        s = self.batcher.ask(ep.key, ep.ids, budget, seed)  # waits for the engine's next batch
        ids, lps = list(s.token_ids), list(s.logprobs)  # (at most `budget`: the Batcher cuts them)
        closed = bool(ids) and ids[-1] == self.eot
        text = self.tok.decode(ids[:-1] if closed else ids, skip_special_tokens=False)
        shut = [] if closed else [self.eot]  # cut off: the turn is closed, unsampled (mask 0)
        ep.append(ids + shut, [1] * len(ids) + [0] * len(shut), lps + [0.0] * len(shut), who="agent")
        return ep.env.world.parse_turn(ep.env, text)  # <tool_call> JSON, or a benchmark's own

    def observe(self, ep, messages):
        # tool results / a customer message + the next generation prompt, by the template (mask 0)
        ep.append(chat.delta_ids(self.tok, messages), 0, who=messages[-1]["role"])

    def leave(self, ep):  # the episode has ended: the engine waits for it no more
        self.batcher.leave()

    def serve(self, playing, cfg, progress=None):
        self.batcher.serve(playing, cfg.lockstep, dict(temperature=cfg.temperature, top_p=cfg.top_p,
                                                     stop_token_ids=[self.eot]), progress)


# --------------------------------------------------------------------------------------------------
# The rollout: one episode's story, every episode on its thread, then the score


def _apply_turn(ep: Episode, turn: ParsedTurn, cfg: RolloutConfig) -> list[dict]:
    """Record an agent turn and run its tool calls; return what goes back to the agent (tool
    results), or [] when the turn is a message to the customer or ends the episode."""
    ep.agent_turns += 1
    calls = turn.calls if cfg.all_calls else turn.calls[:1]
    ep.messages.append({"role": "assistant", "content": turn.content}
                       | ({"tool_calls": [{"type": "function", "function": c} for c in calls]} if calls else {})
                       | ({"malformed": turn.errors} if turn.errors else {}))
    if why := ep.env.world.ends(ep):  # a domain's own stop rule (ACEBench: "finish conversation")
        ep.stop(why)
        return []
    if turn.errors and cfg.malformed == "end":
        ep.stop("malformed_call")
        return []
    if turn.errors and not calls:  # malformed="observe": the parse error goes back to the agent
        obs = [{"role": "tool", "name": "error", "content": "Error: " + "; ".join(turn.errors)}]
        ep.messages += obs
        ep.turns += 1  # counted like a tool execution: a model stuck on bad calls hits the cap
        return obs
    if not calls:  # a message to the customer
        ep.state = USER
        return []
    results, t0, n_calls = [], time.perf_counter(), len(ep.env.calls)
    for c in calls:
        out = ep.env.call(c["name"], c["arguments"])
        results.append({"role": "tool", "name": c["name"], "content": out})
        ep.tool_calls.append(c["name"])
        ep.turns += 1
        if c["name"] == TRANSFER_TOOL:
            break
    ep.timings["tools"] += time.perf_counter() - t0
    if ep.spans and ep.spans[-1]["who"] == "agent":  # for turn-level rewards: the calls it made,
        ep.spans[-1]["calls"] = [(c.name, not c.error) for c in ep.env.calls[n_calls:]]  # and fates
    ep.messages += results
    if ep.tool_calls[-1] == TRANSFER_TOOL or (why := ep.env.world.ends(ep)):
        ep.stop("transfer" if ep.tool_calls[-1] == TRANSFER_TOOL else why)
        return []
    return results


def messages(ep: Episode) -> int:
    """The conversation's messages as tau2 counts them against its cap: all but the system's."""
    return sum(m["role"] != "system" for m in ep.messages)


def _check_caps(ep: Episode, cfg: RolloutConfig) -> None:
    if ep.state == DONE:  # stopped already, for its own reason
        return
    errors = sum(c.error for c in ep.env.calls)  # tau2's rule: in dual control, and in tau2's evaluation
    if ep.env.world.user_tools and too_many_errors(ep.env) or cfg.max_errors and errors >= cfg.max_errors:
        ep.stop("too_many_errors")
    elif cfg.max_messages and messages(ep) >= cfg.max_messages:
        ep.stop("max_messages")
    elif ep.turns >= cfg.max_turns:
        ep.stop("max_turns")
    elif max(len(ep.ids), ep.context_tokens) >= cfg.max_context:
        ep.stop("context_full")


def _first_message(user, task, tools: bool = False):
    try:  # tools: the customer has a phone (its opening is still text)
        first = user.first_message(task, tools=True) if tools else user.first_message(task)
        return clean(first) if isinstance(first, str) else UserError(f"the opening is {type(first).__name__}")
    except UserError as err:
        return err
    except Exception as err:  # noqa: BLE001 - a broken simulator aborts its task, not the run
        return UserError(f"{type(err).__name__}: {err}")


def play(ep: Episode, agent: Agent, user: User, cfg: RolloutConfig, customers: threading.Semaphore) -> None:
    """One conversation, from the customer's opening to its ending, on the episode's own thread."""
    while ep.state != DONE:
        # the agent's turn: its engine batches it with whatever other episodes have pending
        t0 = time.perf_counter()
        turn = agent.act(ep, cfg)
        ep.timings["generate"] += time.perf_counter() - t0
        if isinstance(turn, Exception):  # the endpoint failed, or said the context is full
            ep.stop("context_full" if getattr(turn, "context_full", False) else "agent_error",
                    f"{type(turn).__name__}: {turn}")
            break
        # a tool call runs on the episode's own database, and its result goes back to the agent
        if results := _apply_turn(ep, turn, cfg):
            agent.observe(ep, results)
        _check_caps(ep, cfg)
        if ep.state != USER:
            continue
        # a message to the customer, who answers at its own pace: nobody else waits for it. In dual
        # control a phone runs the customer's own calls on the env (as "user"); they are no turns of
        # the agent's, capped by tau2's message cap or else the turn cap
        t0, cap = time.perf_counter(), "max_messages" if cfg.max_messages else "max_turns"
        phone = Phone(ep.env, ep.messages, cfg.max_messages - messages(ep) if cfg.max_messages else cfg.max_turns,
                      cap) if ep.env.world.user_tools else None
        # the request carries the episode's seed: a sampled customer replies the same on a rerun
        with customers:  # at most user.workers requests in flight
            reply = _customer_reply(user, ep.task, ep.customer_history(), phone,
                                    None if ep.seed is None else episode_seed(ep.seed, "user", ep.turns))
        ep.timings["user"] += time.perf_counter() - t0
        if isinstance(reply, UserError):
            ep.stop("user_error", str(reply))
        elif phone is not None and (phone.stop or reply is None):  # a cap on its own calls ends it
            ep.stop(phone.stop or cap)
        else:
            ep.turns += 1
            reply = clean(reply) if isinstance(reply, str) else str(reply)  # the customer's text is data
            ep.messages.append({"role": "user", "content": reply})
            if marker := is_terminal(reply):
                ep.stop(ENDS[marker])
            elif why := ep.env.world.ends(ep):
                ep.stop(why)
            else:
                ep.state = AGENT
                agent.observe(ep, [{"role": "user", "content": reply}])
                _check_caps(ep, cfg)


def _customer_reply(user: User, task: Task, history: list[dict], phone, seed):
    """user.reply, never raising: a failure is a UserError (its episode aborts, the others go on)."""
    try:
        return user.reply(task, history, phone, seed)
    except Exception as e:  # noqa: BLE001 - one customer's failure must not take down the rollout
        return e if isinstance(e, UserError) else UserError(f"{type(e).__name__}: {e}")


def rollout(tasks: list[Task], group_size: int, worlds: dict[str, World], agent: Agent, user: User,
            cfg: RolloutConfig, progress=None, seeds: list[int] | None = None) -> list[Episode]:
    """Play len(tasks) x group_size episodes, G consecutive per task; they come back unscored,
    databases open: call score() next. `seeds`: one per episode, in order, for those from cfg.seed
    (a logged .seed replays its episode). `progress(done, total)` as episodes end."""
    if seeds is not None and len(seeds) != len(tasks) * group_size:
        raise ValueError(f"rollout: {len(seeds)} seeds for {len(tasks) * group_size} episodes")
    chat_client.STOP.clear()  # (a Ctrl-C of an earlier rollout set it)
    # the customer's opening: once per task, shared by the task's G episodes (LLMUser caches it)
    firsts = concurrently(lambda t: _first_message(user, t, bool(worlds[t.domain].user_tools)), tasks, 16)

    episodes: list[Episode] = []
    seen: Counter = Counter()  # a task drawn twice in one call gets other seeds the second time
    for gi, (task, first) in enumerate(zip(tasks, firsts)):
        world, k = worlds[task.domain], seen[task.id]
        seen[task.id] += 1
        for j in range(group_size):
            seed = seeds[len(episodes)] if seeds is not None else None if cfg.seed is None else \
                episode_seed(cfg.seed, task.id, k, j)
            ep = Episode(task=task, group=gi, env=world.new_env(task), seed=seed, key=len(episodes))
            ep.messages.append({"role": "system", "content": world.rules})
            if isinstance(first, UserError):
                ep.stop("user_error", str(first))
            else:
                ep.messages.append({"role": "user", "content": first})
                schemas = ep.env.tool_schemas(ep.messages) if cfg.tools_in_prompt else []
                agent.begin(ep, world.rules, schemas, first)
                _check_caps(ep, cfg)
            episodes.append(ep)

    # every episode still playing on its own thread; this one serves the agent's engine meanwhile
    live = [e for e in episodes if e.state != DONE]
    customers, crashed, left = threading.Semaphore(max(1, getattr(user, "workers", 1))), [], [len(live)]
    serve, ended = getattr(agent, "serve", None), threading.Condition()

    def story(ep):
        try:
            play(ep, agent, user, cfg, customers)
        except BaseException as e:  # noqa: BLE001 - a bug, or the engine stopped: raised below
            crashed.append(e)
        finally:
            if serve is not None:
                agent.leave(ep)
            with ended:
                left[0] -= 1
                ended.notify_all()

    threads = [threading.Thread(target=story, args=(e,), daemon=True, name=f"episode-{e.key}") for e in live]
    tick = None if progress is None else lambda: progress(len(episodes) - left[0], len(episodes))
    try:
        for t in threads:
            t.start()
        if serve is not None:
            serve(len(live), cfg, tick)
        with ended:  # (an agent without an engine: nothing to serve, only to wait for)
            while left[0]:
                ended.wait(timeout=1.0)
                tick and tick()
    except BaseException:  # Ctrl-C, or the engine failed: every request in flight gives up at once
        chat_client.STOP.set()
        deadline = time.monotonic() + 5.0
        for t in threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        if not any(t.is_alive() for t in threads):  # all gave up: later requests may be asked again
            chat_client.STOP.clear()
        raise
    for t in threads:
        while t.is_alive():  # (a timeout: a Ctrl-C meanwhile is raised at once)
            t.join(timeout=0.2)
    if crashed:
        raise crashed[0]
    if progress is not None:
        progress(len(episodes), len(episodes))
    return episodes


def score(episodes: list[Episode], worlds: dict[str, World], check_outputs: bool = False):
    """The outcome reward, its own step: r = 1 iff the final database equals the one the task's gold
    actions produce [and the required outputs were said]. Sets each episode's reward and info and
    closes its database. Aborted episodes are not scored (the trainer drops their groups)."""
    for e in [e for e in episodes if e.env is not None]:  # (env None: scored already)
        world = worlds[e.task.domain]
        if not e.aborted:  # (telecom scores the ending too: stop_reason)
            e.reward, info = world.score(e.task, e.env, e.messages, check_outputs=check_outputs,
                                         stop_reason=e.stop_reason)
            e.info.update(info)
            if e.stop_reason in ZERO:
                e.reward = 0.0
            if (bad := world.customer_mistakes(e.task, e.messages)) is not None:
                e.info["customer_mistakes"] = bad  # the customer's fidelity, where checkable
        e.env.close()
        e.env = None
    return episodes


class TrajectoryLog:
    """Append-only JSONL of finished episodes, one a line: a crash loses at most the last line."""

    def __init__(self, path: str | Path, with_tokens: bool = False):
        self.path, self.with_tokens = Path(path), with_tokens
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, episodes: list[Episode], **extra) -> None:
        with open(self.path, "a") as f:
            f.writelines(json.dumps({**extra, **e.to_json(self.with_tokens)}) + "\n" for e in episodes)


if __name__ == "__main__":
    # python rollout.py MODEL_FOLDER: a small untrained policy, the scripted customer, two tasks of the
    # synthetic shop x G = 2: the token stream, its spans and its mask (rewards are chance)
    import sys

    from domains import load_world
    from plumbing.hf_engine import HFEngine
    from plumbing.models import load_policy
    from user_sim import make_user

    if len(sys.argv) != 2:
        sys.exit("usage: python rollout.py MODEL_FOLDER (a small chat model; to build one: "
                 "python -m demo.tiny_model /tmp/tiny)")
    world = load_world("synthetic", seed=0)
    tasks = world.tasks("test")[:2]
    model, tok = load_policy(sys.argv[1])
    agent, cfg = PolicyAgent(HFEngine(model, tok), tok), RolloutConfig(6, 4096, 32, tools_in_prompt=False, seed=0)
    worlds = {world.name: world}
    for e in score(rollout(tasks, 2, worlds, agent, make_user("scripted"), cfg), worlds):
        print(f"{e.task.id}: reward {e.reward} stop {e.stop_reason} turns {e.turns} calls {e.tool_calls} "
              f"tokens {len(e.ids)} (trained {sum(e.mask)}) spans {[s['who'] for s in e.spans]}")
    eps = [e]
    print("\n" + chat.show_mask(tok, eps[0].ids, eps[0].mask))
