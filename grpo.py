"""GRPO, the update half of MUA-RL: group advantages, per-token log-probs, clipped surrogate + k3 KL, packing.

Each training step, every task is rolled out G times; the G binary rewards become advantages by comparing
each rollout to its own group (no value network). Each trained token of rollout i then carries A_i, and the
policy is pushed through a PPO-style clipped ratio, with a KL penalty towards the frozen cold-start policy
inside the loss (not the reward). The paper (arXiv:2508.18669, "GRPO as the authors ran it") gives every number used here.

Symbols: G = group size (rollouts per task), N = number of trajectories (tasks * G), B = rows in a batch,
T = tokens per row, H = hidden size, V = vocabulary size. Shapes in comments use these letters.

Contents, in the order a step uses them:
  group_advantages  rewards (N,) -> A (N,); ADVANTAGES, the table of estimators; token_advantages
  pack_sequences    episodes -> rows that hold several episodes end to end, no padding (and pad_sequences,
                    the padded alternative, kept for comparison and for tests)
  token_logprobs    model + rows -> log p of every given token (B, T), without ever holding (B, T, V)
  grpo_loss         log-probs + A + mask -> scalar loss and plain-float stats

Departures from the paper / from verl, on purpose:
  1. Log-prob alignment: position t holds log p(ids[t] | ids[<t]), so log-probs line up with the token ids
     and with the rollout's loss mask; position 0 (no predecessor) holds 0. The first token of an episode is
     the system prompt, never trained, so nothing is lost.
  2. `grpo_loss` accepts advantages per row (B,) or per token (B, T); packed rows need the latter because
     one row holds episodes with different advantages.
  3. `num_tokens` lets micro-batches divide by the token count of the whole step, so a step's gradient is
     the same however it is split (a plain per-micro-batch mean would weight short micro-batches more).
  4. Entropy is measured (detached) for logging only: the paper uses no entropy bonus.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

# ---------------------------------------------------------------------------------------------------------------
# 1. Group-relative advantages


def group_advantages(rewards, group_size: int, scale_by_std: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """A_i = (r_i - mean(group)) / (std(group) + eps); rewards arrive group by group (G consecutive per task).

    The group mean is GRPO's baseline: a rollout is good only relative to its siblings on the same task.
    A group where every rollout scored the same (all 0 or all 1) gets A = 0 everywhere: it teaches nothing.
    std is the unbiased one (divide by G - 1), torch.std's default, as in verl.
    """
    r = torch.as_tensor(rewards, dtype=torch.float32).flatten()  # (N,)
    if group_size < 2:
        raise ValueError(f"group_size must be >= 2 to have a baseline, got {group_size}")
    if r.numel() % group_size != 0:
        raise ValueError(f"{r.numel()} rewards do not split into groups of {group_size}")
    groups = r.view(-1, group_size)  # (N/G, G)
    adv = groups - groups.mean(dim=1, keepdim=True)  # (N/G, G)
    if scale_by_std:
        adv = adv / (groups.std(dim=1, keepdim=True) + eps)  # (N/G, G)
    return adv.flatten()  # (N,)


# The advantage estimators a run can choose (--advantage): rewards (N,) in groups of G -> A (N,). Add a row to
# try another one; muarl.py looks it up by name and nothing else changes.
ADVANTAGES = {
    "grpo": lambda r, G: group_advantages(r, G, scale_by_std=True),  # (r - mean) / (std + eps): GRPO, the paper's
    "no_std": lambda r, G: group_advantages(r, G, scale_by_std=False),  # r - mean: Dr. GRPO, no per-task scaling
}


def token_advantages(adv: float, spans: list[dict], n_tokens: int, turn_bonus: float = 0.0) -> float | list[float]:
    """One episode's advantage, per token. Outcome-only (the paper, turn_bonus = 0): the number A itself, which
    pack_sequences spreads over the episode's tokens. A turn-level variant (turn_bonus > 0): every agent turn whose
    tool calls all succeeded gets A + turn_bonus on its tokens (rollout.py notes each agent span's calls and
    whether they succeeded); tokens outside those turns keep A. The mask still decides which tokens are trained."""
    if turn_bonus == 0:
        return adv
    per_token = [adv] * n_tokens  # (T,)
    for s in spans:
        if s["who"] == "agent" and s.get("calls") and all(ok for _, ok in s["calls"]):
            per_token[s["start"] : s["end"]] = [adv + turn_bonus] * (s["end"] - s["start"])
    return per_token


# ---------------------------------------------------------------------------------------------------------------
# 2. Rows for the update: packed (no padding) and padded
#
# Episodes have very different lengths (a short refusal, a 30-turn exchange). Padding every episode of a
# micro-batch to the longest one spends compute on pad tokens; packing lays episodes end to end in one row
# with position_ids restarting at 0 for each, so every token computed is a real one.
#
# How attention stays inside each episode: transformers (5.x) turns position_ids that restart at 0 into a
# block-diagonal causal mask (masking_utils.find_packed_sequence_indices), but ONLY when attention_mask is None
# and there is no KV cache. Models default to use_cache=True and then build an (empty) cache, which silently
# disables the detection and lets episodes attend to each other. token_logprobs therefore always passes
# use_cache=False; tests/test_grpo.py checks packed == one-at-a-time for "sdpa" and "eager" attention.


def _as_row(seq_ids, seqs, masks, extras, length, pad_id=0):
    """Concatenate the given episodes (and pad to `length` if asked) into tensors of shape (1, length)."""
    ids, pos, mask, seq = [], [], [], []
    cols = {name: [] for name in extras}
    for k in seq_ids:
        n = len(seqs[k])
        ids += list(seqs[k])
        pos += list(range(n))  # restarts at 0: a new episode
        mask += list(masks[k])
        seq += [k] * n
        for name, col in extras.items():
            v = col[k]
            cols[name] += list(v) if isinstance(v, (list, tuple, torch.Tensor)) else [float(v)] * n
    pad = length - len(ids)
    row = {
        "input_ids": torch.tensor(ids + [pad_id] * pad).view(1, -1),  # (1, L)
        "position_ids": torch.tensor(pos + list(range(pad))).view(1, -1),  # (1, L); the pad is one more "episode"
        "mask": torch.tensor(mask + [0] * pad, dtype=torch.float32).view(1, -1),  # (1, L)
        "seq_id": torch.tensor(seq + [-1] * pad).view(1, -1),  # (1, L): which episode each token is, -1 = pad
    }
    for name, col in cols.items():
        row[name] = torch.tensor(col + [0.0] * pad, dtype=torch.float32).view(1, -1)  # (1, L)
    return row


def pack_sequences(seqs: list[list[int]], masks: list[list[int]], max_tokens: int, **extras) -> list[dict]:
    """Pack episodes into rows of at most `max_tokens` tokens (first-fit decreasing), one dict per row.

    seqs[k], masks[k]: token ids and loss mask of episode k (same length; the mask comes from the rollout).
    extras: name -> one entry per episode, either a number (per episode, e.g. its advantage: repeated over
    its tokens) or a per-token list (e.g. sampling log-probs). Each row dict holds tensors of shape (1, L):
    input_ids, position_ids, mask, seq_id and every extra. An episode longer than max_tokens gets a row of
    its own (it cannot be split: its later tokens attend to all earlier ones).
    Choosing max_tokens: with sdpa/eager attention a row of L tokens costs L^2 attention scores, most of them
    masked away between episodes, so keep rows near the length of a long-ish episode rather than huge
    (bench/bench_packing.py measures it); flash-attention's varlen kernels do not have this cost.
    """
    for k, (s, m) in enumerate(zip(seqs, masks)):
        if len(s) != len(m):
            raise ValueError(f"episode {k}: {len(s)} tokens but {len(m)} mask entries")
    rows, room = [], []  # rows[j] = episode indices in row j; room[j] = tokens still free there
    for k in sorted(range(len(seqs)), key=lambda k: -len(seqs[k])):  # longest first packs tightest
        n = len(seqs[k])
        j = next((j for j in range(len(rows)) if room[j] >= n), None)
        if j is None:  # no row has room: open a new one
            rows.append([])
            room.append(max_tokens)
            j = len(rows) - 1
        rows[j].append(k)
        room[j] -= n
    return [_as_row(r, seqs, masks, extras, sum(len(seqs[k]) for k in r)) for r in rows]


def pad_sequences(seqs: list[list[int]], masks: list[list[int]], batch_size: int, pad_id: int = 0, **extras) -> list[dict]:
    """The usual alternative: micro-batches of `batch_size` episodes (in order), right-padded to the longest.

    Returns dicts of (b, L) tensors: input_ids, attention_mask (1 = real token), mask (0 on padding, built
    here, not inferred from pad_id), seq_id, extras; no position_ids (positions count from 0 in every row).
    """
    out = []
    for start in range(0, len(seqs), batch_size):
        idx = list(range(start, min(start + batch_size, len(seqs))))
        L = max(len(seqs[k]) for k in idx)
        parts = [_as_row([k], seqs, masks, extras, L, pad_id) for k in idx]
        batch = {key: torch.cat([p[key] for p in parts]) for key in parts[0] if key != "position_ids"}  # (b, L)
        batch["attention_mask"] = (batch["seq_id"] >= 0).long()  # (b, L): the padding we just added
        out.append(batch)
    return out


# ---------------------------------------------------------------------------------------------------------------
# 3. Per-token log-probs without the (B, T, V) tensor
#
# For Qwen3 (V = 151,936) at T = 32,768 a float32 log-softmax over the vocabulary is 20 GB per row, most of
# the step's memory, although only one number per token is kept. So: run the transformer body once to get
# hidden states (B, T, H), then apply lm_head + log_softmax to chunk_size tokens at a time.
# What is bounded: forward holds at most one chunk's (chunk_size, V) logits and log-softmax at a time; in
# backward, torch.utils.checkpoint recomputes each chunk's logits from its hidden states and frees them before
# the next chunk, so backward too holds one chunk's (chunk_size, V) tensors (plus the lm_head weight gradient,
# (V, H), which any method needs). The price is one extra lm_head matmul per chunk in backward.
# Not bounded here: the body's own activations (B, T, H) per layer, as in any forward pass.


def _chunk_logprobs(head, h, targets, temperature: float, want_entropy: bool):
    """log p(target) for n tokens from their hidden states h (n, H); optionally the entropy (detached)."""
    logits = head(h).float()  # (n, V): float32 even for a bf16 model, log_softmax needs the range
    if temperature != 1.0:
        logits = logits / temperature  # (n, V): the sampler divided by it, so scoring must too
    logp_all = torch.log_softmax(logits, dim=-1)  # (n, V)
    logp = logp_all.gather(-1, targets[:, None]).squeeze(-1)  # (n,)
    if not want_entropy:
        return logp
    with torch.no_grad():  # entropy is a diagnostic; no gradient flows through it
        entropy = -(logp_all.exp() * logp_all).sum(-1)  # (n,)
    return logp, entropy


def token_logprobs(model, input_ids, attention_mask=None, position_ids=None, chunk_size: int = 1024,
                   temperature: float = 1.0, return_entropy: bool = False):
    """(B, T) log-probs: out[:, t] = log p(input_ids[:, t] | input_ids[:, :t]); out[:, 0] = 0.

    Works with Hugging Face causal LMs whose logits are lm_head(final hidden state) (Qwen3, Llama, ...):
    the body is model.get_decoder(), the head model.get_output_embeddings(). Pass position_ids for packed
    rows (see section 2): wherever position_ids == 0 an episode starts, and its first token has no predecessor
    in that episode, so it gets 0 too (and the entropy there is 0). chunk_size counts tokens (rows flattened),
    so memory does not grow with B. With return_entropy, returns (logp, entropy), both (B, T).
    """
    body, head = model.get_decoder(), model.get_output_embeddings()
    B, T = input_ids.shape
    if T < 2:
        raise ValueError("need at least 2 tokens per row: the first one has no predecessor to score it")
    hidden = body(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                  use_cache=False).last_hidden_state  # (B, T, H); use_cache=False matters, see section 2
    h = hidden[:, :-1].reshape(B * (T - 1), -1)  # (B*(T-1), H): state at t predicts token t+1
    targets = input_ids[:, 1:].reshape(-1)  # (B*(T-1),)
    # Recompute-in-backward only when a gradient will be taken; under no_grad (old/ref log-probs) the
    # chunk loop alone already bounds memory.
    use_ckpt = torch.is_grad_enabled() and (h.requires_grad or any(p.requires_grad for p in head.parameters()))
    outs = []
    for s in range(0, h.shape[0], chunk_size):
        args = (head, h[s:s + chunk_size], targets[s:s + chunk_size], temperature, return_entropy)
        out = checkpoint(_chunk_logprobs, *args, use_reentrant=False) if use_ckpt else _chunk_logprobs(*args)
        outs.append(out if return_entropy else (out,))
    cols = []
    for parts in zip(*outs):  # logp chunks, then entropy chunks
        x = torch.cat(parts).view(B, T - 1)  # (B, T-1)
        x = F.pad(x, (1, 0))  # (B, T): position 0 has no predecessor -> 0
        if position_ids is not None:
            x = x.masked_fill(position_ids.expand(B, T) == 0, 0.0)  # (B, T): each packed episode's first token
        cols.append(x)
    return (cols[0], cols[1]) if return_entropy else cols[0]


# ---------------------------------------------------------------------------------------------------------------
# 4. The loss
#
# Maximised objective, per trained token t of row b (mask m_bt = 1), with A the trajectory's advantage:
#
#   ratio_bt = pi(y_bt) / pi_old(y_bt)  = exp(logp - old_logp)
#   surr_bt  = min( ratio_bt * A,  clip(ratio_bt, 1 - eps_low, 1 + eps_high) * A )     pessimistic side
#   kl_bt    = exp(ref - logp) - (ref - logp) - 1   clamped to [-10, 10]              k3 estimator, >= 0
#   J        = (1 / N_tok) * sum_bt m_bt * ( surr_bt - beta * kl_bt )                 token mean
#   loss     = -J
#
# Why these pieces: the min makes the update pessimistic (a ratio already past the clip on the side that
# helps the objective gets no gradient); the paper updates once per batch, so ratio == 1 and the clip never
# bites, and the surrogate's gradient is exactly REINFORCE with the group mean as baseline. k3 is an unbiased,
# always non-negative estimate of KL(pi || pi_ref) from samples of pi; its gradient 1 - exp(ref - logp) is zero
# when the policy equals the reference. N_tok is the number of trained tokens (of the whole step, if given).


def grpo_loss(logp, old_logp, ref_logp, advantages, mask, clip_low: float = 0.2, clip_high: float = 0.2,
              kl_coef: float = 0.001, num_tokens=None, entropy=None):
    """Clipped-surrogate GRPO loss with k3 KL, token mean over mask. Returns (loss, stats of plain floats).

    logp (grad), old_logp (sampling policy), ref_logp (frozen reference, or None), mask, entropy: (B, T);
    advantages: (B,) or (B, T). num_tokens: divide the masked sum by this instead of mask.sum(); pass the
    trained-token count of the whole optimizer step when summing micro-batch losses.
    """
    mask = mask.to(logp.dtype)  # (B, T): 1 = token sampled by the policy
    adv = advantages[:, None] if advantages.dim() == 1 else advantages  # (B, 1) or (B, T)
    n_tok = mask.sum()
    denom = n_tok.clamp(min=1) if num_tokens is None else num_tokens

    ratio = torch.exp(logp - old_logp.detach())  # (B, T)
    clipped = torch.clamp(ratio, 1 - clip_low, 1 + clip_high)  # (B, T)
    surr = torch.min(ratio * adv, clipped * adv)  # (B, T)
    objective = surr  # (B, T)
    use_kl = ref_logp is not None and kl_coef != 0
    if use_kl:
        d = ref_logp.detach() - logp  # (B, T)
        kl = torch.clamp(torch.exp(d) - d - 1, -10.0, 10.0)  # (B, T)
        objective = objective - kl_coef * kl  # (B, T)
    loss = -(objective * mask).sum() / denom  # sign flipped last: optimisers minimise

    with torch.no_grad():  # stats: masked means over this call's tokens, as plain floats
        on = mask > 0
        n = max(int(n_tok.item()), 1)
        stats = {
            "clip_frac": float(((clipped * adv < ratio * adv) & on).sum()) / n,  # share where the clip zeroed grad
            "kl": float((kl * mask).sum()) / n if use_kl else 0.0,
            "ratio_min": float(ratio[on].min()) if on.any() else 1.0,
            "ratio_max": float(ratio[on].max()) if on.any() else 1.0,
            "tokens": float(n_tok),
        }
        if entropy is not None:
            stats["entropy"] = float((entropy * mask).sum()) / n
    return loss, stats


# ---------------------------------------------------------------------------------------------------------------
# 5. Demo: one toy group

if __name__ == "__main__":
    torch.manual_seed(0)
    G, T = 4, 6
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])  # one task, G = 4 rollouts, two solved it
    adv = group_advantages(rewards, G)
    print("rewards    ", rewards.tolist())
    print("advantages ", [round(a, 4) for a in adv.tolist()], "(mean 0, unbiased std 1)")

    mask = torch.tensor([[0, 0, 1, 1, 1, 0]] * G, dtype=torch.float32)  # prompt, 3 sampled tokens, a tool result
    old_logp = -torch.rand(G, T) * 2  # (G, T): what the sampler reported
    ref_logp = old_logp + 0.05 * torch.randn(G, T)  # (G, T): reference a little away from the policy
    logp = (old_logp + 0.3 * torch.randn(G, T)).requires_grad_()  # (G, T): as if the policy had already moved
    loss, stats = grpo_loss(logp, old_logp, ref_logp, adv, mask)
    loss.backward()
    torch.set_printoptions(precision=3, sci_mode=False)
    ratio = torch.exp(logp - old_logp).detach()  # (G, T)
    print("ratio on trained tokens (nan = not trained)\n", ratio.masked_fill(mask == 0, float("nan")))
    print("loss", round(loss.item(), 5), "stats", {k: round(v, 4) for k, v in stats.items()})
    print("d loss / d logp: 0 where masked; where clipped only the small KL part is left\n", logp.grad)
