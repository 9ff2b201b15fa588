"""Cold start: supervised fine-tuning on multi-turn tool-use conversations, with the same mask as
RL.

MUA-RL (paper, "Cold start") first fine-tunes the base model on ~2,000 synthesized multi-turn
trajectories (batch 128, 2 epochs, AdamW, lr 5e-6 cosine), the loss on the agent's own tokens only,
so RL starts from a policy that already speaks the tool-call format. Here chat.conversation_ids, the
code that grows rollout token streams, renders the conversations to (ids, mask), so SFT and RL train
the same tokens: the agent's turns including their end-of-turn token (mask 1), nothing else (mask
0).

    loss = - (1 / N_tok) * sum_t m_t * log p(y_t | y_<t)        token mean over the optimizer step's trained tokens

Data: a JSONL file, one conversation per line, {"messages": [...], "domain": "retail"} with
OpenAI-style messages (system optional, then user / assistant with tool_calls / tool); by default,
synthetic tasks' expert conversations.

Departures from the paper:
1. A short linear warm-up before the cosine; the batch counts conversations (16 by default for a
   CPU, 128 in the paper).
2. The default data are the scripted expert trajectories of this project's generator
   (domains/synthetic.py).
"""

from __future__ import annotations

import functools
import json
import math
import random
from pathlib import Path

import torch
from tqdm import tqdm

import chat
from plumbing.fsdp import all_sum, bf16_compute, compute_device, even_rows, is_sharded, sharded_call
from grpo import pack_sequences, token_logprobs

# --------------------------------------------------------------------------------------------------
# Data


def render_examples(tokenizer, conversations: list[dict], worlds: dict) -> list[tuple[list[int], list[int]]]:
    """conversations: [{"messages": [...], "domain": name, "system"?: str, "tools"?: [...]}] ->
    [(ids, mask)]."""
    out = []
    for conv in conversations:
        msgs = list(conv["messages"])
        world = worlds.get(conv.get("domain"))
        system = conv.get("system") or (world.rules if world else "")
        if msgs and msgs[0]["role"] == "system":
            system = msgs.pop(0)["content"]
        tools = conv["tools"] if conv.get("tools") is not None else (world.tool_schemas() if world else [])
        out.append(chat.conversation_ids(tokenizer, system, tools, msgs))
    return out


def load_jsonl(path: str | Path) -> list[dict]:
    rows = []
    for i, line in enumerate(Path(path).read_text().split("\n"), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                # the line a person must fix
                raise ValueError(f"{path}:{i}: not JSON ({e.msg})") from None
    return rows


def expert_conversations(tasks) -> list[dict]:
    """The scripted expert conversation of each generated task, in the JSONL shape above."""
    return [{"messages": t.expert, "domain": t.domain} for t in tasks if t.expert]


def conversations(source: str, tasks, seed: int = 0, n: int = 2000, tools: bool = True) -> list[dict]:
    """The cold start's conversations (--sft_data): "generated", `n` expert conversations generated
    in another shop on retail's tools (domains/synthetic.py: its own customers, products and
    orders), each carrying that shop's policy and tool schemas; "tasks" (or ""), the training tasks'
    own; else a JSONL file. `tools` false: no tool schemas in the prompt (--tools_in_prompt false)."""
    from plumbing.flags import ConfigError

    if source == "generated":
        from domains import cold_start_world

        world = cold_start_world(seed, n)
        rules, schemas = world.rules, world.tool_schemas()
        convs = [{**c, "system": rules, "tools": schemas} for c in expert_conversations(world.tasks("train"))]
    else:
        convs = expert_conversations(tasks) if source in ("", "tasks") else load_jsonl(source)
    if not convs:
        raise ConfigError(f"--sft_data {source}: no conversations for the cold start")
    return convs if tools else [dict(c, tools=[]) for c in convs]


# --------------------------------------------------------------------------------------------------
# Training


def lr_at(step: int, total: int, lr: float, warmup: int) -> float:
    # linear warm-up: AdamW's early moment estimates are noisy, so keep its first steps small
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return lr * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))  # then cosine to 0


def train(model, examples: list[tuple[list[int], list[int]]], epochs: float = 2.0, batch_size: int = 16,
          lr: float = 5e-6, weight_decay: float = 0.01, grad_clip: float = 1.0, micro_batch_tokens: int = 8192,
          chunk_size: int = 1024, warmup: int = 5, seed: int = 0, log=None, show_progress: bool = True,
          desc: str = "cold start (SFT)", world_size: int = 1, rank: int = 0, bf16: bool = False) -> list[float]:
    """Fine-tune `model` in place on (ids, mask) examples; return the loss of every step. Under FSDP
    (world_size > 1, `model` sharded by fsdp.shard) every rank draws the same batches and trains on
    its share of each; each adds masked sum / N_tok of the WHOLE batch and FSDP sums gradients over
    the ranks: one process's token mean. bf16: the forward computes in bf16, AdamW updates the fp32
    weights (fsdp.bf16_compute)."""
    rng = random.Random(seed)
    total = max(1, int(round(epochs * max(1, len(examples) // batch_size))))  # optimizer steps
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=weight_decay)
    # under FSDP the log-probs run as the sharded model's registered method (fsdp.shard), so its
    # hooks fire
    logprobs = functools.partial(sharded_call(token_logprobs) if is_sharded(model) else token_logprobs, model)
    dev = compute_device(model)  # rows are packed on the CPU
    model.train()
    order, losses = [], []  # order: example indices still to draw in this pass
    bar = tqdm(range(total), desc=desc, disable=not show_progress or rank != 0)
    for step in bar:
        if len(order) < batch_size:  # a fresh shuffled pass over the data
            perm = list(range(len(examples)))
            rng.shuffle(perm)
            order += perm
        idx, order = order[:batch_size], order[batch_size:]
        # N_tok of the whole batch (every rank drew the same one)
        n_tok = sum(sum(examples[i][1]) for i in idx)
        mine = idx[rank::world_size]
        rows = pack_sequences([examples[i][0] for i in mine], [examples[i][1] for i in mine], micro_batch_tokens)
        empty = pack_sequences([[0, 0]], [[0, 0]], 2)[0]  # FSDP: as many rows on every rank, empty ones mask 0
        rows = even_rows(rows, world_size, empty)
        step_lr = lr_at(step, total, lr, warmup)
        for g in opt.param_groups:
            g["lr"] = step_lr
        opt.zero_grad(set_to_none=True)
        loss = 0.0
        for row in rows:  # gradients accumulate row by row: one optimizer step per batch
            # ids and the mask the loss multiplies: on the model's device
            row = {k: v.to(dev) for k, v in row.items()}
            with bf16_compute(model, bf16):
                logp = logprobs(row["input_ids"], position_ids=row["position_ids"], chunk_size=chunk_size)  # (1, L)
            # this row's share of the batch's token mean
            row_loss = -(logp * row["mask"]).sum() / max(1, n_tok)
            row_loss.backward()
            loss += row_loss.item()
        loss = all_sum(loss, world_size)  # the whole batch's loss, every rank's rows
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        # a step with a non-finite loss or gradient is skipped
        if math.isfinite(loss) and torch.isfinite(gnorm):
            opt.step()
        losses.append(loss)
        bar.set_postfix(loss=f"{loss:.3f}")
        if log is not None:
            log({"phase": "sft", "step": step, "loss": loss, "grad_norm": float(gnorm), "lr": step_lr})
    model.eval()
    return losses

def cold_start(model, tokenizer, examples: list[tuple[list[int], list[int]]], path: Path, **train_kw) -> list[float]:
    """A run's cold start (muarl.py): train() on the rendered examples, then the model saved to `path`
    (out/cold-start: the KL reference and a --resume read it; a collective under FSDP)."""
    from plumbing.checkpoint import save_pretrained

    losses = train(model, examples, **train_kw)
    # The last step's fp32 gradients (4 bytes a parameter) are freed now, not at RL's first update:
    # the engine, the reference and the first rollout would otherwise start beside them.
    model.zero_grad(set_to_none=True)
    save_pretrained(model, tokenizer, path, train_kw.get("world_size", 1), train_kw.get("rank", 0))
    return losses


if __name__ == "__main__":
    # python sft.py MODEL_FOLDER: three epochs of the cold start on 32 generated tasks, for any small chat model
    # (the CPU demo builds one from nothing in seconds: python -m demo.tiny_model /tmp/tiny).
    import sys

    from domains import load_world
    from plumbing.models import load_policy

    if len(sys.argv) != 2:
        sys.exit("usage: python sft.py MODEL_FOLDER (a small chat model, e.g. python -m demo.tiny_model /tmp/tiny)")
    world = load_world("synthetic", seed=0)
    tasks = world.tasks("train")[:32]
    model, tok = load_policy(sys.argv[1])
    ex = render_examples(tok, expert_conversations(tasks), {world.name: world})
    ids, mask = ex[0]
    print(f"{len(ex)} conversations; the first has {len(ids)} tokens, {sum(mask)} trained")
    print("trained text of the first:", repr(tok.decode([i for i, m in zip(ids, mask) if m])[:300]))
    losses = train(model, ex, epochs=3, batch_size=8, lr=1e-3, micro_batch_tokens=4096)
    print("loss first -> last:", round(losses[0], 3), "->", round(losses[-1], 3))
