"""Chat rendering as token ids, built incrementally: the token stream a rollout grows and SFT trains on.

The most common bug in agent RL is a gap between the tokens the policy sampled and the tokens it is trained on:
re-tokenising a conversation's text, or re-rendering it with a chat template that rewrites earlier turns
(Qwen3's drops old reasoning blocks), gives the trainer a sequence the sampler never produced. So we never
re-render a conversation. A stream starts as the rendered prompt and only ever grows:

    prompt      system (policy + tool schemas) + first user message + generation prompt       mask 0
    agent turn  exactly the tokens the engine sampled, ending with the end-of-turn token      mask 1
    delta       what the template puts between that turn and the next agent turn: a tool
                result or user message, then the generation prompt again                       mask 0

The delta is rendered by the model's own chat template against a fixed two-message stub, so a template's
local rules (role headers, <tool_response> wrapping, the empty <think> block of non-thinking mode) are
followed exactly without ever touching the real history. The stub trick needs the template to render a
message independently of the messages before it except for its immediate neighbour; tests/test_models.py checks
that for the tiny template the grown stream equals one full render (append-only); tests/test_qwen3_template.py
says where Qwen3's does not.

`assistant_ids` is the SFT side: the tokens the model *would* sample for a given assistant message, mask 1.
"""

from __future__ import annotations

import functools
import itertools

from tools import clean

STUB = [{"role": "user", "content": "."}, {"role": "assistant", "content": "."}]


def end_of_turn_id(tokenizer) -> int:
    """The token that ends an assistant turn: Qwen-style <|im_end|> when the vocabulary has it, else EOS."""
    tid = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if isinstance(tid, int) and tid != tokenizer.unk_token_id and tid is not None:
        return tid
    if tokenizer.eos_token_id is None:
        raise ValueError("tokenizer has neither <|im_end|> nor an eos token: cannot tell where a turn ends")
    return tokenizer.eos_token_id


def render(tokenizer, messages: list[dict], tools: list[dict] | None = None, add_generation_prompt=False) -> str:
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("the tokenizer has no chat template; muarl needs one to render conversations")
    return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                         add_generation_prompt=add_generation_prompt, enable_thinking=False)


def encode(tokenizer, text: str) -> list[int]:
    # add_special_tokens=False: the template text already carries every special token it needs (no BOS added).
    # clean(): a lone surrogate from a tool or a customer (JSON's "\ud800") stays text instead of breaking the encoder
    return tokenizer.encode(clean(text), add_special_tokens=False)


def prompt_ids(tokenizer, system: str, tools: list[dict], first_user: str) -> list[int]:
    """Tokens of the prompt: system (policy + tool schemas) + first user message + generation prompt. Mask 0."""
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": first_user}]
    return encode(tokenizer, render(tokenizer, msgs, tools, add_generation_prompt=True))


@functools.lru_cache(maxsize=8)
def _stub_renders(tokenizer) -> dict[str, str]:
    # The template's renders of the fixed stub, computed once per tokenizer: every turn of every episode needs them.
    eot = tokenizer.convert_ids_to_tokens(end_of_turn_id(tokenizer))
    base, user_only = render(tokenizer, STUB), render(tokenizer, STUB[:1])  # user + assistant; user alone
    return {"eot": eot, "user_only": user_only,
            "turns": base.count(eot),  # the stub's turns that end with the end-of-turn token (user, assistant)
            "suffix": base.rsplit(eot, 1)[1] if eot in base else "",  # what follows an assistant's end-of-turn token
            "gen_prompt": render(tokenizer, STUB[:1], add_generation_prompt=True)[len(user_only) :]}


def _after_turn_suffix(tokenizer) -> str:
    # What the template writes after an assistant's end-of-turn token (Qwen: "\n"). The agent stops sampling
    # at the end-of-turn token, so this suffix belongs to the next delta, not to the agent's turn.
    return _stub_renders(tokenizer)["suffix"]


def delta_ids(tokenizer, new_messages: list[dict]) -> list[int]:
    """Tokens that follow an agent turn's end-of-turn token when `new_messages` (tool results and/or a user message)
    arrive, up to and including the next generation prompt. Rendered by the model's template, mask 0.

    The delta is what follows the stub's last end-of-turn token, not what follows the stub's whole render: a
    template may redraw the stub's assistant turn once a message follows it (Qwen3 drops its empty think block),
    but what comes after an end-of-turn token does not depend on how the turn before it was drawn."""
    stub = _stub_renders(tokenizer)
    n = stub["turns"]
    parts = render(tokenizer, STUB + new_messages, add_generation_prompt=True).split(stub["eot"], n)
    if n == 0 or len(parts) <= n:
        raise ValueError("chat template does not end the stub's turns with the end-of-turn token; "
                         "cannot render a delta")
    return encode(tokenizer, parts[n])


def assistant_ids(tokenizer, message: dict) -> list[int]:
    """The tokens a model would sample for `message` after the generation prompt, ending with end-of-turn. Mask 1.

    Rendered by the template (so a tool call is laid out exactly as the model was shown in the system prompt),
    then cut between the generation prompt and the end-of-turn token."""
    stub = _stub_renders(tokenizer)
    gen_prompt = stub["gen_prompt"]
    body = render(tokenizer, STUB[:1] + [message])[len(stub["user_only"]) :]
    # strip the role header (and the empty think block that non-thinking mode puts in the generation prompt)
    for prefix in (gen_prompt, gen_prompt.split("<think>")[0]):
        if prefix and body.startswith(prefix):
            body = body[len(prefix) :]
            break
    return encode(tokenizer, body.rsplit(stub["eot"], 1)[0]) + [end_of_turn_id(tokenizer)]


def conversation_ids(tokenizer, system: str, tools: list[dict], messages: list[dict]) -> tuple[list[int], list[int]]:
    """A whole conversation (first message from the user) as (ids, mask), grown exactly as a rollout grows it.

    Used by SFT so the cold start trains the very tokens RL will train: assistant turns mask 1, all else 0."""
    assert messages and messages[0]["role"] == "user", "a conversation starts with the user's message"
    ids = prompt_ids(tokenizer, system, tools, messages[0]["content"])
    mask = [0] * len(ids)
    pending: list[dict] = []
    for m in messages[1:]:
        if m["role"] != "assistant":
            pending.append(m)  # tool results and user messages wait for the next agent turn
            continue
        # the delta for what arrived since the last agent turn (mask 0), then the agent turn itself (mask 1)
        for part, bit in ((delta_ids(tokenizer, pending) if pending else [], 0), (assistant_ids(tokenizer, m), 1)):
            ids += part
            mask += [bit] * len(part)
        pending = []
    return ids, mask


def show_mask(tokenizer, ids: list[int], mask: list[int]) -> str:
    """An episode as text with the trained spans (mask 1) in [[...]]: what the loss sees, for logs and eyes."""
    out = []
    for bit, run in itertools.groupby(zip(ids, mask), key=lambda p: p[1]):  # runs of equal mask
        text = tokenizer.decode([i for i, _ in run], skip_special_tokens=False)
        out.append(f"[[{text}]]" if bit else text)
    return "".join(out)


if __name__ == "__main__":
    import tempfile

    from models import build_tiny

    _, tok = build_tiny(tempfile.mkdtemp())
    call = {"type": "function", "function": {"name": "get_order_details", "arguments": {"order_id": "#W1"}}}
    msgs = [{"role": "user", "content": "Cancel order #W1, please."},
            {"role": "assistant", "content": "Checking.", "tool_calls": [call]},
            {"role": "tool", "name": "get_order_details", "content": '{"order_id": "#W1", "status": "pending"}'},
            {"role": "assistant", "content": "Done."}]
    ids, mask = conversation_ids(tok, "You are a helpful agent.", [], msgs)
    print(f"{len(ids)} tokens, {sum(mask)} trained (in [[...]]):\n{show_mask(tok, ids, mask)}")
