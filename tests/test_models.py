"""demo/tiny_model.py and plumbing/models.py: the tiny model and tokenizer build, save and load; the chat template
renders Qwen3's layout."""

import json

import pytest
import torch

from demo.tiny_model import SPECIAL_TOKENS, TAG_TOKENS, build_tiny
from plumbing.models import load_policy, load_reference, load_tokenizer, n_params
from tools import calculate, function_schema


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    model, tok = build_tiny(d, seed=0)
    return d, model, tok


TOOLS = [function_schema(calculate)]
CALL = {"type": "function", "function": {"name": "calculate", "arguments": {"expression": "2 * (3 + 4)"}}}
CONVERSATION = [
    {"role": "system", "content": "You are a helpful agent."},
    {"role": "user", "content": "What is 2 * (3 + 4)? And 1 + 1?"},
    {"role": "assistant", "content": "Let me compute.", "tool_calls": [CALL]},
    {"role": "tool", "name": "calculate", "content": "14.0"},
    {"role": "assistant", "content": "", "tool_calls": [CALL, {"name": "calculate", "arguments": '{"expression": "1 + 1"}'}]},
    {"role": "tool", "name": "calculate", "content": "14.0"},
    {"role": "tool", "name": "calculate", "content": "2.0"},
    {"role": "assistant", "content": "2 * (3 + 4) = 14 and 1 + 1 = 2."},
    {"role": "user", "content": "Thanks! ###STOP###"},
]


def render(tok, messages, gen=False, thinking=False, tools=TOOLS):
    return tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=gen,
                                   enable_thinking=thinking)


def test_build_sizes_and_roundtrip(tiny):
    d, model, tok = tiny
    cfg = model.config
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.head_dim) == (256, 4, 4, 64)
    assert cfg.tie_word_embeddings and cfg.vocab_size == len(tok) <= 4096
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert json.loads((d / "config.json").read_text())["dtype"] == "float32"
    assert (d / "model.safetensors").is_file()
    # what was saved is what was built: same weights, same tokenizer, same template
    policy, tok2 = load_policy(str(d))
    for (n, p), (n2, p2) in zip(model.state_dict().items(), policy.state_dict().items()):
        assert n == n2 and torch.equal(p, p2)
    text = render(tok, CONVERSATION)
    assert render(tok2, CONVERSATION) == text and tok2.encode(text) == tok.encode(text)
    assert n_params(model) < sum(p.numel() for p in model.state_dict().values())  # tied matrix counted once


def test_build_is_deterministic(tiny, tmp_path):
    _, model, tok = tiny
    model2, tok2 = build_tiny(tmp_path, seed=0)
    assert tok2.get_vocab() == tok.get_vocab()
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), model2.parameters()))
    model3, _ = build_tiny(tmp_path / "other", seed=1)
    assert not torch.equal(model.model.embed_tokens.weight, model3.model.embed_tokens.weight)


def test_special_tokens_are_single_ids(tiny):
    _, _, tok = tiny
    ids = {t: tok.encode(t, add_special_tokens=False) for t in SPECIAL_TOKENS + TAG_TOKENS}
    assert all(len(v) == 1 for v in ids.values()), ids
    assert len({v[0] for v in ids.values()}) == len(ids)
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    # inside running text too, and the tags survive skip_special_tokens (they are not "special", as in Qwen3)
    text = 'ok<tool_call>\n{"name": "x"}\n</tool_call><|im_end|>'
    enc = tok.encode(text, add_special_tokens=False)
    assert tok.convert_tokens_to_ids("<tool_call>") in enc and enc[-1] == tok.eos_token_id
    assert tok.decode(enc) == text
    assert tok.decode(enc, skip_special_tokens=True) == text.replace("<|im_end|>", "")


def test_byte_level_roundtrip(tiny):
    _, _, tok = tiny
    for s in ["Ünïcödé 東京 🚀", "  two  spaces\n\ttab", '{"order_id": "#W2378156", "price": 12.5}']:
        assert tok.decode(tok.encode(s, add_special_tokens=False)) == s


def test_template_renders_tools_and_calls(tiny):
    _, _, tok = tiny
    text = render(tok, CONVERSATION, thinking=True)  # thinking mode: no empty think blocks in the way
    assert text.startswith("<|im_start|>system\nYou are a helpful agent.\n\n# Tools\n")
    assert "<tools>\n" + json.dumps(TOOLS[0]) + "\n</tools>" in text
    assert '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' in text
    assert text.count("<|im_start|>system") == 1
    # content, newline, then the call; a call without content starts right after the header
    assert ('<|im_start|>assistant\nLet me compute.\n<tool_call>\n{"name": "calculate", "arguments": '
            '{"expression": "2 * (3 + 4)"}}\n</tool_call><|im_end|>\n') in text
    # two calls in one turn (the second with string arguments, passed through), one newline between them
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "calculate", "arguments": {"expression": "2 * (3 + 4)"}}\n'
            '</tool_call>\n<tool_call>\n{"name": "calculate", "arguments": {"expression": "1 + 1"}}\n</tool_call>'
            '<|im_end|>') in text
    # tool results are a user turn; consecutive results share one
    assert "<|im_start|>user\n<tool_response>\n14.0\n</tool_response><|im_end|>\n" in text
    assert ("<|im_start|>user\n<tool_response>\n14.0\n</tool_response>\n<tool_response>\n2.0\n</tool_response>"
            "<|im_end|>\n") in text
    assert text.endswith("<|im_start|>user\nThanks! ###STOP###<|im_end|>\n")
    # the tool call in a turn is exactly the JSON the model is told to produce (parseable by tools.py)
    from tools import parse_tool_calls

    turn = text.split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0]
    assert parse_tool_calls(turn).calls == [{"name": "calculate", "arguments": {"expression": "2 * (3 + 4)"}}]
    # non-thinking mode: every assistant turn opens with the empty think block, then the same text
    assert render(tok, CONVERSATION).count("<|im_start|>assistant\n<think>\n\n</think>\n\n") == 3


def test_template_without_tools_or_system(tiny):
    _, _, tok = tiny
    msgs = [{"role": "user", "content": "hi"}]
    assert render(tok, msgs, gen=True, tools=None, thinking=True) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    with_sys = render(tok, [{"role": "system", "content": "S"}] + msgs, tools=None)
    assert with_sys == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
    tools_only = render(tok, msgs)  # tools but no system message: a system turn holding only the tools block
    assert tools_only.startswith("<|im_start|>system\n# Tools\n") and "<|im_start|>user\nhi" in tools_only


@pytest.mark.parametrize("thinking", [False, True])
def test_template_is_append_only(tiny, thinking):
    _, _, tok = tiny
    for k in range(1, len(CONVERSATION)):
        prev, new = CONVERSATION[:k], CONVERSATION[k]
        if new["role"] == "tool" and prev[-1]["role"] == "tool":
            continue  # the one documented exception: grouped tool results share a turn
        assert render(tok, CONVERSATION[: k + 1], thinking=thinking).startswith(render(tok, prev, thinking=thinking)), k
        if new["role"] == "assistant":
            # the generation prompt plus what the model then writes is exactly the rendered history
            prompt = render(tok, prev, gen=True, thinking=thinking)
            assert render(tok, CONVERSATION[: k + 1], thinking=thinking).startswith(prompt), k
    # the grouped exception really is an exception (so the skip above is not hiding a pass)
    k = 6
    assert not render(tok, CONVERSATION[: k + 1]).startswith(render(tok, CONVERSATION[:k]))


def test_enable_thinking_false_adds_empty_think_block(tiny):
    _, _, tok = tiny
    msgs = CONVERSATION[:2]
    off = render(tok, msgs, gen=True, thinking=False)
    on = render(tok, msgs, gen=True, thinking=True)
    assert on.endswith("<|im_start|>assistant\n")
    assert off == on + "<think>\n\n</think>\n\n"
    # without enable_thinking at all, Qwen3 thinks: no pre-filled block
    assert tok.apply_chat_template(msgs, tools=TOOLS, tokenize=False, add_generation_prompt=True) == on
    # a reasoning_content is rendered inside the think block
    r = render(tok, msgs + [{"role": "assistant", "content": "Hi.", "reasoning_content": "be nice"}], thinking=True)
    assert r.endswith("<|im_start|>assistant\n<think>\nbe nice\n</think>\n\nHi.<|im_end|>\n")


def test_reference_is_frozen_copy(tiny):
    d, model, _ = tiny
    ref = load_reference(str(d))
    assert not ref.training and not any(p.requires_grad for p in ref.parameters())
    ref2 = load_reference(model=model)
    assert ref2 is not model and any(p.requires_grad for p in model.parameters())
    assert torch.equal(ref2.model.embed_tokens.weight, model.model.embed_tokens.weight)


def test_tokenizer_without_template_is_a_clear_error(tiny, tmp_path):
    _, _, tok = tiny
    tok2 = load_tokenizer(str(tiny[0]))
    tok2.chat_template = None
    tok2.save_pretrained(tmp_path)
    (tmp_path / "chat_template.jinja").unlink(missing_ok=True)
    with pytest.raises(ValueError, match="no chat template"):
        load_tokenizer(str(tmp_path))


def test_split_digits_tokenizer(tmp_path):
    # --tiny_split_digits: every digit its own token, so ids like "#W1234" tokenize the same way wherever they occur
    _, tok = build_tiny(tmp_path, texts=["order #W1234 zip 78701 user lena_diaz_42"] * 20, split_digits=True,
                        hidden=64, layers=1, heads=1, kv_heads=1, intermediate=64)
    pieces = [tok.decode([i]) for i in tok.encode("#W90817 and 78701", add_special_tokens=False)]
    digits = [p for p in pieces if any(c.isdigit() for c in p)]
    assert digits and all(len(p.strip()) == 1 for p in digits), pieces
