"""Rollouts: token-exact streams, masks built turn by turn, stop reasons, caps, and the expert reaching reward 1."""

import dataclasses

import pytest
import torch

import chat
from domains import load_world
from evaluation.agents import ExpertEngine
from engine import Sample
from plumbing.hf_engine import HFEngine
from demo.tiny_model import build_tiny
from rollout import PolicyAgent, RolloutConfig, rollout, score
from plumbing.sampling import episode_seed
from user_sim import ScriptedUser, UserError


@pytest.fixture(scope="module")
def world():
    return load_world("synthetic", seed=0, n_train=40, n_test=10)


def play(world, tasks, G, engine, tok, user, cfg, check_outputs=False):
    """rollout() with the policy agent on one world, then score(): what a training step does."""
    worlds = {world.name: world}
    return score(rollout(tasks, G, worlds, PolicyAgent(engine, tok), user, cfg), worlds, check_outputs)


@pytest.fixture(scope="module")
def tiny(world, tmp_path_factory):
    texts = [world.rules] + [str(t.expert) for t in world.tasks("train")]
    model, tok = build_tiny(tmp_path_factory.mktemp("tiny"), texts=texts, hidden=64, layers=2, heads=2, kv_heads=1,
                            intermediate=128)
    return model, tok


class RecordingEngine:
    """Wraps an engine and keeps every sample it returned, to check the stream against what was sampled."""

    def __init__(self, inner):
        self.inner, self.samples = inner, []

    def generate(self, prompts, **kw):
        out = self.inner.generate(prompts, **kw)
        self.samples += list(zip([list(p) for p in prompts], out))
        return out


def test_an_episode_samples_the_same_alone_or_in_a_batch(world, tiny):
    # episode j of a task samples with episode_seed(seed, task id, occurrence, j): its draws depend on its own seed
    # and turn, not on which episodes share the batch (bench/bench_rollout.py compares the two)
    model, tok = tiny
    tasks = world.tasks("train")[:3]
    cfg = RolloutConfig(max_new_tokens=24, max_turns=6, max_context=4096, malformed="observe", seed=5)
    eng = HFEngine(model, tok)
    batched = play(world, tasks, 2, eng, tok, ScriptedUser(), cfg)
    assert [e.seed for e in batched] == [episode_seed(5, t.id, 0, j) for t in tasks for j in range(2)]
    assert batched[0].ids != batched[1].ids  # the G copies of a task differ
    for k, task in enumerate(tasks):
        alone = play(world, [task], 2, eng, tok, ScriptedUser(), cfg)
        for a, e in zip(alone, batched[2 * k : 2 * k + 2]):
            assert a.ids == e.ids and a.mask == e.mask and a.spans == e.spans
            assert a.logprobs == pytest.approx(e.logprobs, abs=1e-4)
    twice = play(world, [tasks[0], tasks[0]], 1, eng, tok, ScriptedUser(), cfg)  # a task drawn twice: other seeds
    assert twice[0].seed != twice[1].seed and twice[0].ids == batched[0].ids


class ScriptEngine:
    """Returns fixed texts, one per call, to drive rollouts into exact situations."""

    def __init__(self, tok, texts):
        self.tok, self.texts, self.calls = tok, list(texts), 0

    def generate(self, prompts, max_new_tokens, stop_token_ids=None, **kw):
        text = self.texts[min(self.calls, len(self.texts) - 1)]
        self.calls += 1
        ids = chat.encode(self.tok, text) + [stop_token_ids[0]]
        return [Sample(ids, [-0.5] * len(ids), "stop") for _ in prompts]


def test_expert_through_token_pipeline_scores_one(world, tiny):
    _, tok = tiny
    tasks = world.tasks("test")[:10]
    eps = play(world, tasks, 2, ExpertEngine(tok, tasks), tok, ScriptedUser(),
                  RolloutConfig(max_context=8192), check_outputs=True)
    assert [e.reward for e in eps] == [1.0] * len(eps), [(e.task.id, e.stop_reason, e.info) for e in eps]
    assert all(e.stop_reason == "user_stop" for e in eps)
    # append-only template: the grown stream is exactly one full render of the conversation
    for e in eps:
        full = chat.render(tok, e.messages[:-1], world.tool_schemas())  # the closing ###STOP### message never enters the stream
        assert full.startswith(tok.decode(e.ids, skip_special_tokens=False))
        assert full[len(tok.decode(e.ids, skip_special_tokens=False)):] == chat._after_turn_suffix(tok)


def test_mask_marks_exactly_the_sampled_tokens(world, tiny):
    model, tok = tiny
    torch.manual_seed(0)
    eng = RecordingEngine(HFEngine(model, tok))
    cfg = RolloutConfig(max_new_tokens=24, max_turns=6, max_context=4096, malformed="observe", seed=1)
    eps = play(world, world.tasks("train")[:3], 2, eng, tok, ScriptedUser(), cfg)
    eot = chat.end_of_turn_id(tok)
    for e in eps:
        # every mask-1 token belongs to a sample the engine produced for this episode's prompt, in order
        trained, i, turns = [], 0, []
        while i < len(e.ids):
            if e.mask[i] == 1:
                j = i
                while j < len(e.ids) and e.mask[j] == 1:
                    j += 1
                turns.append((i, j))
                i = j
            else:
                i += 1
        for (a, b) in turns:
            # several episodes of a group may share this prefix: one of the samples drawn for it is this span
            mine = [s for p, s in eng.samples if p == e.ids[:a] and list(s.token_ids)[: b - a] == e.ids[a:b]]
            assert mine, "a trained span is not a sample the engine drew for this prefix"
            assert e.logprobs[a:b] == pytest.approx(list(mine[0].logprobs)[: b - a])
            if mine[0].finish_reason == "stop":
                assert e.ids[b - 1] == eot  # the end-of-turn token is trained
        # and conversely: after every prefix of this episode that was sent to the engine, some sample follows
        # with mask 1 (nothing sampled for this episode was dropped or masked out)
        prefixes = {tuple(p) for p, _ in eng.samples if len(p) < len(e.ids) and e.ids[: len(p)] == p}
        assert prefixes == {tuple(e.ids[:a]) for a, _ in turns}
        assert all(lp == 0.0 for lp, m in zip(e.logprobs, e.mask) if m == 0)
        n_prompt = len(chat.prompt_ids(tok, world.rules, world.tool_schemas(), e.messages[1]["content"]))
        assert e.mask[:n_prompt] == [0] * n_prompt  # system + first user message + generation prompt: context


def test_malformed_call_ends_or_observes(world, tiny):
    _, tok = tiny
    task = world.tasks("train")[:1]
    bad = '<tool_call>{"name": "get_user_details", "arguments": {"user_id": }</tool_call>'
    eps = play(world, task, 2, ScriptEngine(tok, [bad]), tok, ScriptedUser(), RolloutConfig())
    assert all(e.stop_reason == "malformed_call" for e in eps)
    assert all(e.reward == 0.0 or e.info["db_match"] for e in eps)
    cfg = RolloutConfig(malformed="observe", max_turns=3)
    eps = play(world, task, 2, ScriptEngine(tok, [bad] * 3 + ["Bye."]), tok, ScriptedUser(), cfg)
    tool_msgs = [m for m in eps[0].messages if m["role"] == "tool"]
    assert tool_msgs and tool_msgs[0]["content"].startswith("Error: the tool call is not valid JSON")


def test_only_first_call_runs_and_turn_cap(world, tiny):
    _, tok = tiny
    two = ('<tool_call>{"name": "get_order_details", "arguments": {"order_id": "#first"}}</tool_call>'
           '<tool_call>{"name": "get_order_details", "arguments": {"order_id": "#second"}}</tool_call>')
    eps = play(world, world.tasks("train")[:1], 2, ScriptEngine(tok, [two]), tok, ScriptedUser(),
                  RolloutConfig(max_turns=4))
    for e in eps:
        assert e.stop_reason == "max_turns" and e.turns == 4
        assert e.tool_calls == ["get_order_details"] * 4
        calls = [m["tool_calls"] for m in e.messages if m["role"] == "assistant"]
        assert all(len(c) == 1 and c[0]["function"]["arguments"] == {"order_id": "#first"} for c in calls)


def test_context_cap_and_truncated_turn(world, tiny):
    _, tok = tiny
    long = "word " * 200
    eng = ScriptEngine(tok, [long])
    eps = play(world, world.tasks("train")[:1], 2, eng, tok, ScriptedUser(),
                  RolloutConfig(max_new_tokens=16, max_context=4096))
    e = eps[0]
    assert e.stop_reason in ("context_full", "user_stop", "max_turns")
    eot = chat.end_of_turn_id(tok)
    # a turn cut at max_new_tokens is closed by an end-of-turn token the policy did not sample: mask 0
    first_agent = e.mask.index(1)
    assert e.mask[first_agent: first_agent + 16] == [1] * 16 and e.ids[first_agent + 16] == eot and e.mask[first_agent + 16] == 0
    prompt_len = first_agent
    eps = play(world, world.tasks("train")[:1], 2, ScriptEngine(tok, [long]), tok, ScriptedUser(),
                  RolloutConfig(max_new_tokens=16, max_context=prompt_len + 20))
    assert all(e.stop_reason == "context_full" for e in eps)
    assert all(len(e.ids) <= prompt_len + 20 + 60 for e in eps)


class FailingUser(ScriptedUser):
    def reply(self, task, history, phone=None, seed=None):
        return UserError("endpoint down")


def test_user_failure_aborts_not_scores(world, tiny):
    _, tok = tiny
    eps = play(world, world.tasks("train")[:1], 2, ScriptEngine(tok, ["Hello!"]), tok, FailingUser(),
                  RolloutConfig())
    assert all(e.stop_reason == "user_error" and e.aborted for e in eps)
    assert all("db_match" not in e.info for e in eps)  # not scored


# ---------------------------------------------------------------------------------------------------------------
# tau2's caps: max_messages (the conversation's messages) and max_errors (failed tool calls); both endings score 0


def _gold_then(task, then):
    """A message-level agent: the task's gold actions (OracleAgent), then `then` (a tool call) every turn after."""
    from evaluation.agents import OracleAgent

    oracle = OracleAgent(task)
    return lambda messages, tools: oracle(messages, tools) if oracle.todo else {"content": "", "tool_calls": [then]}


def _write_task(world):
    task = next(t for t in world.tasks("test") if any(a["name"].startswith(("modify_", "cancel_", "return_",
                                                                             "exchange_")) for a in t.actions))
    read = next(a for a in task.actions if a["name"].startswith(("get_", "find_")))
    return task, {"function": {"name": read["name"], "arguments": read["arguments"]}}


def _play_messages(world, task, then, cfg):
    from evaluation.agents import MessageAgent
    from user_sim import FixedUser

    worlds = {world.name: world}
    return score(rollout([task], 1, worlds, MessageAgent(lambda t: _gold_then(t, then)), FixedUser(), cfg), worlds)[0]


def test_max_messages_stops_at_n_messages_and_scores_zero(world):
    from rollout import messages

    task, read = _write_task(world)
    n = len(task.actions)
    assert not world.user_tools  # a single-control world
    # the opening + 2 messages (call, result) per call: after the gold actions and 2 more reads, 1 + 2n + 4 messages
    cap = 1 + 2 * n + 4
    ep = _play_messages(world, task, read, RolloutConfig(max_messages=cap))
    assert ep.stop_reason == "max_messages" and messages(ep) == cap and ep.turns == n + 2
    assert len(ep.messages) == cap + 1 and ep.messages[0]["role"] == "system"  # the system prompt is not counted
    assert ep.info["db_match"] and ep.reward == 0.0  # the gold database reached, yet tau2's cap scores it 0
    # the same conversation, cut at the same place by the turn cap instead: scored by its database, 1
    same = _play_messages(world, task, read, RolloutConfig(max_turns=n + 2))
    assert same.stop_reason == "max_turns" and same.messages == ep.messages and same.reward == 1.0
    # one message short of the cap: the episode goes on
    longer = _play_messages(world, task, read, RolloutConfig(max_messages=cap + 2, max_turns=n + 2))
    assert longer.stop_reason == "max_turns" and messages(longer) == cap and longer.reward == 1.0


def test_max_errors_stops_after_k_failed_calls_in_a_single_control_world(world):
    task, read = _write_task(world)
    n = len(task.actions)
    bad = {"function": {"name": "get_order_details", "arguments": {"order_id": "#nope"}}}
    ep = _play_messages(world, task, bad, RolloutConfig(max_errors=3))
    assert ep.stop_reason == "too_many_errors" and ep.turns == n + 3
    assert ep.tool_calls == [a["name"] for a in task.actions] + ["get_order_details"] * 3
    results = [m["content"] for m in ep.messages if m["role"] == "tool"]
    assert [r.startswith("Error") for r in results] == [False] * n + [True] * 3
    assert ep.info["db_match"] and ep.reward == 0.0  # the gold database reached, yet the ending scores 0
    # successful calls are not errors: K failed calls after any number of good ones
    ep = _play_messages(world, task, read, RolloutConfig(max_errors=3, max_turns=n + 5))
    assert ep.stop_reason == "max_turns" and ep.reward == 1.0
    # max_errors 0: no cap in a single-control world, even past tau2's 10 of the dual-control worlds
    ep = _play_messages(world, task, bad, RolloutConfig(max_turns=n + 12))
    assert ep.stop_reason == "max_turns" and ep.turns == n + 12 and ep.reward == 1.0
    failed = [m for m in ep.messages if m["role"] == "tool" and m["content"].startswith("Error")]
    assert len(failed) == 12
