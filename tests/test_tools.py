"""Hostile agent text never escapes the tool-call parser: every failure becomes the turn's parse error.

The cases of a hostile-user pass: JSON nested past Python's recursion limit (RecursionError) and integers of more
than 4,300 digits (ValueError) must not escape `parse_tool_calls`, or they crash rollout() and the training run.
"""

import random

import pytest

from tools import parse_tool_calls

KNOWN = {"get_order", "cancel_order"}
HOSTILE = {
    "deep_call": "<tool_call>" + "[" * 100_000 + "]" * 100_000 + "</tool_call>",
    "deep_arguments": '<tool_call>{"name": "get_order", "arguments": ' + "[" * 100_000 + "]" * 100_000 + "}</tool_call>",
    "huge_int": '<tool_call>{"name": "get_order", "arguments": {"id": ' + "9" * 5_000 + "}}</tool_call>",
    "deep_string_arguments": '<tool_call>{"name": "get_order", "arguments": "' + "[" * 100_000 + '"}</tool_call>',
    "huge_int_string_arguments": '<tool_call>{"name": "get_order", "arguments": "' + "9" * 5_000 + '"}</tool_call>',
    "lone_surrogate": '<tool_call>{"name": "get_order", "arguments": {"id": "\\ud800"}}</tool_call>',
    "unclosed": '<tool_call>{"name": "get_order", "arguments": {',
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_text_is_a_parse_error_not_an_exception(name):
    turn = parse_tool_calls(HOSTILE[name], KNOWN)  # must not raise
    assert turn.errors or turn.calls  # a defined outcome: an error the agent sees, or a (harmless) call


def test_seeded_fuzz_never_raises():
    # Random splices of tags, brackets, quotes, digits and JSON fragments: 3,000 seeded cases, none may raise.
    rng = random.Random(0)
    parts = ["<tool_call>", "</tool_call>", "{", "}", "[", "]", '"', ":", ",", '"name"', '"arguments"',
             '"get_order"', "9" * 5_000, "[" * 3_000, "null", "\\ud800", "\x00", "é", " ", "\n", "<think>"]
    for _ in range(3_000):
        text = "".join(rng.choice(parts) for _ in range(rng.randint(1, 40)))
        turn = parse_tool_calls(text, KNOWN)
        assert isinstance(turn.errors, list) and isinstance(turn.calls, list)
