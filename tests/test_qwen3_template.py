"""The chat stream (chat.py, as rollout.py grows it) against Qwen3's real chat template, non-thinking mode.

MUA-RL trains Qwen3 (the paper, arXiv:2508.18669). Its template is not append-only: once another message follows an assistant
turn, it re-renders that turn without its <think> block (kept only for the turns after the last user query,
and for those only when the turn is the last message or has reasoning). In non-thinking mode every turn was
generated after the prompt `<|im_start|>assistant\n<think>\n\n</think>\n\n`, so a full render of a finished
conversation drops empty think blocks the model did see. The stream never re-renders, so it keeps them:

    stream text  ==  full render with `<think>\n\n</think>\n\n` put back after every assistant header
                     that lost it                                                    (and nothing else differs)

The template text is a fixture (tests/fixtures/qwen3_chat_template.jinja, its header says where it comes
from), attached to the tiny model's tokenizer, which has Qwen3's special tokens as single ids.
"""

import json
import re
from pathlib import Path

import pytest

import chat
from domains import load_world
from evaluation.agents import ExpertEngine
from demo.tiny_model import build_tiny
from plumbing.models import load_tokenizer
from rollout import PolicyAgent, RolloutConfig, rollout, score
from tools import GENERIC_TOOLS, function_schema
from user_sim import ScriptedUser

FIXTURE = Path(__file__).parent / "fixtures" / "qwen3_chat_template.jinja"
QWEN3_TEMPLATE = FIXTURE.read_text().split("-#}\n", 1)[1].rstrip("\n")  # without the provenance comment
GEN_PROMPT = "<|im_start|>assistant\n<think>\n\n</think>\n\n"  # Qwen3's non-thinking generation prompt
EMPTY_THINK = "<think>\n\n</think>\n\n"

# chat.delta_ids cuts the delta after the stub's whole render, which Qwen3 re-renders once a message follows
# (its assistant turn loses the think block): it raises "not append-only". The fix is described in the
# helper's report (cut after the stub's end-of-turn tokens instead); strict, so the marker must go with it.


@pytest.fixture(scope="module")
def world():
    return load_world("synthetic", seed=0, n_train=40, n_test=10)


@pytest.fixture(scope="module")
def tok(world, tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny-qwen3")
    texts = [world.rules] + [json.dumps(t.expert) for t in world.tasks("train")]
    build_tiny(d, texts=texts, hidden=64, layers=1, heads=1, kv_heads=1, intermediate=64)
    t = load_tokenizer(str(d))  # a fresh instance: chat.py caches its stub renders per tokenizer object
    t.chat_template = QWEN3_TEMPLATE
    return t


SYSTEM = "You are a customer service agent. Authenticate the user before any change."
TOOLS = [function_schema(fn) for fn in GENERIC_TOOLS]


def call(name, **arguments):
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


# A conversation with a tool call, two calls in one turn (their results share one user turn in Qwen3's
# layout), messages to the user, and a user reply after tool use.
MESSAGES = [
    {"role": "user", "content": "What is 17 * 23? Then cancel my order #W1, please."},
    {"role": "assistant", "content": "Let me compute that.", "tool_calls": [call("calculate", expression="17 * 23")]},
    {"role": "tool", "name": "calculate", "content": "391.0"},
    {"role": "assistant", "content": "", "tool_calls": [call("think", thought="Order first."),
                                                        call("calculate", expression="391 + 1")]},
    {"role": "tool", "name": "think", "content": ""},
    {"role": "tool", "name": "calculate", "content": "392.0"},
    {"role": "assistant", "content": "17 * 23 = 391. Which email is on the account?"},
    {"role": "user", "content": "sara@example.com"},
    {"role": "assistant", "content": "", "tool_calls": [call("transfer_to_human_agents", summary="Cancel #W1.")]},
    {"role": "tool", "name": "transfer_to_human_agents", "content": "Transfer successful"},
    {"role": "assistant", "content": "A colleague will finish the cancellation. Anything else?"},
]


def restore_think(text: str) -> str:
    """Put the empty think block back after every assistant header that lost it."""
    return re.sub(r"<\|im_start\|>assistant\n(?!<think>)", GEN_PROMPT, text)


def spans(ids, mask):
    """(start, end) of each run of mask-1 tokens."""
    out, i = [], 0
    while i < len(ids):
        if mask[i]:
            j = i
            while j < len(ids) and mask[j]:
                j += 1
            out.append((i, j))
            i = j
        else:
            i += 1
    return out


# ---------------------------------------------------------------------------------------------------------------
# The template itself: what it renders, and where it is not append-only


def test_fixture_renders_qwen3s_known_outputs(tok):
    # Published renders of Qwen3's template (model card / SkyRL's template notes): the last assistant turn
    # carries an empty think block, and enable_thinking=False pre-fills one in the generation prompt.
    msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    assert tok.apply_chat_template(msgs, tokenize=False) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nHello<|im_end|>\n")
    assert chat.render(tok, msgs[:1], add_generation_prompt=True) == "<|im_start|>user\nHi<|im_end|>\n" + GEN_PROMPT
    thinking = tok.apply_chat_template(msgs[:1], tokenize=False, add_generation_prompt=True, enable_thinking=True)
    assert thinking.endswith("<|im_start|>assistant\n")  # thinking mode: the model opens its own block
    # the think tags and Qwen3's markers are single tokens of the tiny tokenizer, as in Qwen3's
    for t in ("<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "<|im_start|>", "<|im_end|>"):
        assert len(tok.encode(t, add_special_tokens=False)) == 1, t


def test_template_is_append_only_except_for_empty_think_blocks(tok):
    msgs = [{"role": "system", "content": SYSTEM}] + MESSAGES
    renders = [chat.render(tok, msgs[:k], TOOLS) for k in range(2, len(msgs) + 1)]  # renders[k]: msgs[: k + 2]
    last, new = msgs[1:-1], msgs[2:]  # renders[k] ends with last[k]; renders[k + 1] adds new[k]
    grouped = [m["role"] == n["role"] == "tool" for m, n in zip(last, new)]  # a tool result after a tool result
    broken = [k for k, (a, b) in enumerate(zip(renders, renders[1:])) if not b.startswith(a)]
    # Not append-only: each time a message follows an assistant turn, that turn is re-rendered without its
    # block; and a tool result after a tool result reopens the user turn the first one closed (both Qwen3's
    # and the tiny template group them; rollout.py appends all results of a turn in one delta)
    assert broken == [k for k, m in enumerate(last) if m["role"] == "assistant" or grouped[k]]
    # ... and those are the only rewrites: with the empty blocks removed, every render extends the one before
    plain = [r.replace(EMPTY_THINK, "") for r in renders]
    for k, (a, b) in enumerate(zip(plain, plain[1:])):
        assert b.startswith(a.removesuffix("<|im_end|>\n") if grouped[k] else a)


# ---------------------------------------------------------------------------------------------------------------
# The stream


def test_tool_schemas_render_in_the_system_prompt(tok):
    ids = chat.prompt_ids(tok, SYSTEM, TOOLS, MESSAGES[0]["content"])
    text = tok.decode(ids, skip_special_tokens=False)
    system = text.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\n" + SYSTEM + "\n\n# Tools\n")
    tools_block = system.split("XML tags:\n<tools>")[1].split("</tools>")[0]  # (the intro names <tools></tools>)
    assert tools_block == "".join("\n" + json.dumps(t, ensure_ascii=False) for t in TOOLS) + "\n"
    assert text.endswith("<|im_start|>user\n" + MESSAGES[0]["content"] + "<|im_end|>\n" + GEN_PROMPT)
    # without tools: a plain system turn
    bare = tok.decode(chat.prompt_ids(tok, SYSTEM, [], "Hi"), skip_special_tokens=False)
    assert bare == f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n" + GEN_PROMPT


def test_assistant_turns_are_what_the_model_samples(tok):
    # assistant_ids: the tokens after the generation prompt, ending with <|im_end|>: no think block in them
    for m in MESSAGES:
        if m["role"] != "assistant":
            continue
        ids = chat.assistant_ids(tok, m)
        body = chat.render(tok, [MESSAGES[0], m])  # m is the last turn here: Qwen3 renders it whole
        assert body.endswith(GEN_PROMPT + tok.decode(ids, skip_special_tokens=False) + "\n")
        assert ids[-1] == chat.end_of_turn_id(tok) and "think>" not in tok.decode(ids, skip_special_tokens=False)


def test_stream_equals_full_render_with_the_dropped_think_blocks(tok):
    ids, mask = chat.conversation_ids(tok, SYSTEM, TOOLS, MESSAGES)  # grown exactly as rollout.py grows it
    stream = tok.decode(ids, skip_special_tokens=False)
    full = chat.render(tok, [{"role": "system", "content": SYSTEM}] + MESSAGES, TOOLS)
    assert stream + chat._after_turn_suffix(tok) != full  # not append-only: a full render is not the stream ...
    assert stream + chat._after_turn_suffix(tok) == restore_think(full)  # ... up to the dropped think blocks
    n_agent = sum(m["role"] == "assistant" for m in MESSAGES)
    assert full.count(EMPTY_THINK) == 1 and stream.count(EMPTY_THINK) == n_agent  # Qwen3 kept only the last one

    # What the model saw before each of its turns is the stream up to there; a server that re-renders the
    # history each turn would have sent the same text minus the earlier empty blocks.
    turns = spans(ids, mask)
    assert len(turns) == n_agent
    history = [{"role": "system", "content": SYSTEM}]
    k = 0
    for m in MESSAGES:
        if m["role"] == "assistant":
            seen = tok.decode(ids[: turns[k][0]], skip_special_tokens=False)
            rerendered = chat.render(tok, history, TOOLS, add_generation_prompt=True)
            assert seen == restore_think(rerendered) and seen.endswith(GEN_PROMPT)
            assert rerendered.count(EMPTY_THINK) == 1  # re-rendered: only the generation prompt's block
            k += 1
        history.append(m)


def test_generation_prompt_and_empty_think_block_are_masked_out(tok):
    ids, mask = chat.conversation_ids(tok, SYSTEM, TOOLS, MESSAGES)
    think = {tok.convert_tokens_to_ids("<think>"), tok.convert_tokens_to_ids("</think>")}
    gen = chat.encode(tok, GEN_PROMPT)
    eot = chat.end_of_turn_id(tok)
    turns = spans(ids, mask)
    for a, b in turns:
        assert ids[a - len(gen) : a] == gen  # every trained span follows the full generation prompt (mask 0)
        assert mask[a - len(gen) : a] == [0] * len(gen)
        assert ids[b - 1] == eot  # and ends with the end-of-turn token the agent sampled (trained)
    assert all(m == 0 for i, m in zip(ids, mask) if i in think)
    assert sum(i in think for i in ids) == 2 * len(turns)  # one empty block per generation prompt, none trained


def test_two_tool_results_form_one_user_turn(tok):
    delta = tok.decode(chat.delta_ids(tok, MESSAGES[4:6]), skip_special_tokens=False)
    assert delta == ("\n<|im_start|>user\n<tool_response>\n\n</tool_response>\n<tool_response>\n392.0\n"
                     "</tool_response><|im_end|>\n" + GEN_PROMPT)


# ---------------------------------------------------------------------------------------------------------------
# A rollout with this template: the scripted expert through the real token pipeline


def test_expert_rollout_with_qwen3_template(world, tok):
    tasks = world.tasks("test")[:3]
    worlds = {"synthetic": world}
    eps = score(rollout(tasks, 2, worlds, PolicyAgent(ExpertEngine(tok, tasks), tok), ScriptedUser(),
                        RolloutConfig(max_context=8192)), worlds, check_outputs=True)
    assert [e.reward for e in eps] == [1.0] * len(eps), [(e.task.id, e.stop_reason, e.info) for e in eps]
    for e in eps:
        stream = tok.decode(e.ids, skip_special_tokens=False)
        full = chat.render(tok, e.messages[:-1], world.tool_schemas())  # the closing ###STOP### is not streamed
        assert stream + chat._after_turn_suffix(tok) == restore_think(full)
        for a, _ in spans(e.ids, e.mask):  # every trained turn follows the non-thinking generation prompt
            assert tok.decode(e.ids[:a], skip_special_tokens=False).endswith(GEN_PROMPT)
