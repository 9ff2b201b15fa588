"""GRPO, the update half of MUA-RL: group advantages, packed rows, per-token log-probs, the loss.

Every task is rolled out G times; its G binary rewards become advantages against their own group
(no value network). Each trained token of rollout i carries A_i through a PPO-style clipped ratio,
with a KL penalty towards the frozen cold-start policy in the loss, not the reward. Every number:
arXiv:2508.18669, "GRPO as the authors ran it".

Symbols: G = group size (rollouts per task), N = trajectories (tasks * G), B = rows in a batch,
T = tokens per row, H = hidden size, V = vocabulary size. Sections, in the order a step uses them:
  1. group_advantages: rewards (N,) -> A (N,); the REWARDS and ADVANTAGES tables; token_advantages
  2. pack_sequences: episodes end to end in rows, no padding (pad_sequences, for comparison)
  3. token_logprobs: model + rows -> log p of every given token (B, T), never holding (B, T, V)
  4. grpo_loss: log-probs + A + mask -> the scalar loss and plain-float stats; tis_weights, the
     sampler's correction

Departures from the paper / from verl, on purpose:
  1. Position t holds log p(ids[t] | ids[<t]), aligned with the ids and the loss mask; position 0
     (no predecessor) holds 0 and loses nothing: it is the system prompt, never trained.
  2. `grpo_loss` takes advantages per row (B,) or per token (B, T): a packed row holds several
     episodes, and a turn-level reward gives tokens of one episode different advantages.
  3. `num_tokens` lets every row divide by the whole step's token count, so the gradient is the
     same however the step is split (a per-row mean would weight short rows more).
  4. Entropy is measured (detached) for logging only: the paper uses no entropy bonus.
  5. Truncated importance sampling (w in the loss) corrects for the rollout engine's numerics, as
     verl, slime, OpenRLHF and NeMo-RL do; the paper does not (--tis_cap 0 gives its loss bit for
     bit).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from plumbing.sampling import sampler_logprobs

# --------------------------------------------------------------------------------------------------
# 1. Group-relative advantages


def group_advantages(rewards, group_size: int, scale_by_std: bool = True,
                     eps: float = 1e-6) -> torch.Tensor:
    """A_i = (r_i - mean(group)) / (std(group) + eps); rewards arrive group by group (G consecutive
    per task). The group mean is GRPO's baseline: a rollout is good only relative to its siblings on
    the same task; a group that all scored the same gets A = 0: it teaches nothing. std is the
    unbiased one (G - 1), as in verl."""
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


# The training reward --reward picks: episode -> the number its group advantages start from. A
# fork's reward is a row here; the evaluation's score (World.score, kept in e.reward) never changes
# with it, so pass^k stays comparable. A turn-level variant is token_advantages' turn_bonus
# (--turn_bonus): it adds to the advantage of the turns it rewards.
REWARDS = {
    "outcome": lambda e: e.reward,  # the paper's: 1 iff the final database (and required outputs) match the gold ones
}

# The estimators --advantage picks from: rewards (N,) in groups of G -> A (N,). To try another one,
# add a row.
ADVANTAGES = {
    "grpo": lambda r, G: group_advantages(r, G, scale_by_std=True),  # (r - mean) / (std + eps): GRPO, the paper's
    "no_std": lambda r, G: group_advantages(r, G, scale_by_std=False),  # r - mean: Dr. GRPO, no per-task scaling
}


def token_advantages(adv: float, spans: list[dict], n_tokens: int,
                     turn_bonus: float = 0.0) -> float | list[float]:
    """One episode's advantage, per token. Outcome-only (the paper, turn_bonus = 0): the number A
    itself, which pack_sequences spreads over the episode. Turn-level (turn_bonus > 0): each agent
    turn whose tool calls all succeeded (rollout.py notes them per span) gets A + turn_bonus, other
    tokens A; the mask decides what trains."""
    if turn_bonus == 0:
        return adv
    per_token = [adv] * n_tokens  # (T,)
    for s in spans:
        if s["who"] == "agent" and s.get("calls") and all(ok for _, ok in s["calls"]):
            per_token[s["start"] : s["end"]] = [adv + turn_bonus] * (s["end"] - s["start"])
    return per_token


# --------------------------------------------------------------------------------------------------
# 2. Rows for the update: packed (no padding) and padded
#
# Padding a micro-batch to its longest episode (a 30-turn exchange next to a short refusal) spends
# compute on pad tokens; packing lays episodes end to end in one row, position_ids restarting at 0
# for each. transformers (5.x) turns such position_ids into a block-diagonal causal mask
# (masking_utils.find_packed_sequence_indices), so attention stays inside each episode, but ONLY
# when attention_mask is None and there is no KV cache: models default to use_cache=True, whose
# (empty) cache silently lets episodes attend to each other, so token_logprobs passes
# use_cache=False (tests/test_grpo.py: packed == one at a time).


def _as_row(seq_ids, seqs, masks, extras, length, pad_id=0):
    """Concatenate the episodes seq_ids, then pad to `length` (as one more episode): a dict of (1,
    length) tensors."""
    pad = length - sum(len(seqs[k]) for k in seq_ids)

    # (1, length): one entry per episode, end to end, then padding
    def column(entries, padding, dtype=torch.long):
        vals = [x for k in seq_ids for x in (entries[k] if hasattr(entries[k], "__iter__")
                                             else [float(entries[k])] * len(seqs[k]))]
        return torch.tensor(vals + list(padding), dtype=dtype).view(1, -1)

    row = {"input_ids": column(seqs, [pad_id] * pad),  # (1, L)
           "position_ids": column({k: range(len(seqs[k])) for k in seq_ids}, range(pad)),  # (1, L): from 0 per episode
           "mask": column(masks, [0] * pad, torch.float32),  # (1, L)
           "seq_id": column({k: [k] * len(seqs[k]) for k in seq_ids}, [-1] * pad)}  # (1, L): episode index, -1 = pad
    # (1, L) each
    row.update({name: column(col, [0.0] * pad, torch.float32) for name, col in extras.items()})
    return row


def pack_sequences(seqs: list[list[int]], masks: list[list[int]], max_tokens: int,
                   **extras) -> list[dict]:
    """Pack episodes into rows of at most `max_tokens` tokens (first-fit decreasing), one dict of
    (1, L) tensors per row: input_ids, position_ids, mask, seq_id, extras. seqs[k], masks[k]: ids
    and loss mask of episode k; extras: name -> per episode a number (e.g. its advantage) or a
    per-token list (e.g. sampling log-probs). An episode longer than max_tokens gets a row of its
    own. A row of L tokens costs L^2 attention scores (sdpa/eager), most masked away: keep
    max_tokens near a long-ish episode's length (bench/bench_packing.py measures it)."""
    for k, (s, m) in enumerate(zip(seqs, masks)):
        if len(s) != len(m):
            raise ValueError(f"episode {k}: {len(s)} tokens but {len(m)} mask entries")
    rows, room = [], []  # rows[j] = episode indices in row j; room[j] = tokens still free there
    for k in sorted(range(len(seqs)), key=lambda k: -len(seqs[k])):  # longest first packs tightest
        j = next((j for j in range(len(rows)) if room[j] >= len(seqs[k])), len(rows))
        if j == len(rows):  # no row has room: open a new one
            rows.append([])
            room.append(max_tokens)
        rows[j].append(k)
        room[j] -= len(seqs[k])
    return [_as_row(r, seqs, masks, extras, sum(len(seqs[k]) for k in r)) for r in rows]


def pad_sequences(seqs: list[list[int]], masks: list[list[int]], batch_size: int, pad_id=0,
                  **extras) -> list[dict]:
    """The usual alternative: micro-batches of `batch_size` episodes (in order), right-padded to the
    longest: dicts of (b, L) input_ids, attention_mask (1 = real token), mask (0 on padding, built,
    not inferred from pad_id), seq_id."""
    out = []
    for start in range(0, len(seqs), batch_size):
        idx = range(start, min(start + batch_size, len(seqs)))
        parts = [_as_row([k], seqs, masks, extras, max(len(seqs[i]) for i in idx), pad_id) for k in idx]
        batch = {key: torch.cat([p[key] for p in parts]) for key in parts[0] if key != "position_ids"}  # (b, L)
        batch["attention_mask"] = (batch["seq_id"] >= 0).long()  # (b, L): the padding we just added
        out.append(batch)
    return out


# --------------------------------------------------------------------------------------------------
# 3. Per-token log-probs without the (B, T, V) tensor
#
# For Qwen3 (V = 151,936) at T = 32,768 a float32 log-softmax over the vocabulary is 20 GB per row,
# to keep one number per token. So: run the transformer body once for hidden states (B, T, H), then
# lm_head + log_softmax on chunk_size tokens at a time. Forward and backward hold one chunk's
# (chunk_size, V) logits at a time (backward recomputes them with torch.utils.checkpoint: one extra
# lm_head matmul per chunk), plus the (V, H) lm_head gradient any method needs. Not bounded here:
# the body's own activations, (B, T, H) per layer.


def _chunk_logprobs(head, h, targets, temperature: float, want_entropy: bool, sampler=None):
    """(log p(target),) for n tokens from their hidden states h (n, H); with want_entropy, (logp,
    entropy); with sampler = (temperature, top_p) too, (logp, entropy, the target's log-prob under
    the sampler's distribution)."""
    raw = head(h).float()  # (n, V): fp32 for log_softmax's range
    logp_all = torch.log_softmax(raw / temperature, dim=-1)  # (n, V)
    logp = logp_all.gather(-1, targets[:, None]).squeeze(-1)  # (n,)
    if not want_entropy:
        return (logp,)
    with torch.no_grad():  # diagnostics; no gradient flows through them
        entropy = -(logp_all.exp() * logp_all).sum(-1)  # (n,)
        if sampler is None:
            return logp, entropy
        # the sampler drew from this distribution
        same = sampler[1] >= 1.0 and (sampler[0] or 1.0) == temperature
        seen = logp.detach() if same else sampler_logprobs(raw, *sampler).gather(-1, targets[:, None]).squeeze(-1)
    return logp, entropy, seen  # seen: (n,)


def token_logprobs(model, input_ids, attention_mask=None, position_ids=None, chunk_size: int = 1024,
                   temperature: float = 1.0, return_entropy: bool = False, sampler: tuple | None = None):
    """(B, T) log-probs: out[:, t] = log p(input_ids[:, t] | input_ids[:, :t]); out[:, 0] = 0. For
    Hugging Face causal LMs with logits = lm_head(final hidden state) (Qwen3, Llama, ...): body =
    model.get_decoder(), head = model.get_output_embeddings(). With position_ids (packed rows) each
    episode's first token gets 0 too (logp, entropy). chunk_size counts tokens (rows flattened):
    memory does not grow with B. return_entropy: (logp, ent); with sampler=(temperature, top_p) as
    well: (logp, ent, log-probs under the rollout sampler's distribution), what the engine reported
    for the same tokens (their gap checks that the engine holds the trainer's weights)."""
    body, head = model.get_decoder(), model.get_output_embeddings()
    B, T = input_ids.shape
    if T < 2:
        raise ValueError("need at least 2 tokens a row: the first has no predecessor to score it")
    hidden = body(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                  use_cache=False).last_hidden_state  # (B, T, H); use_cache=False matters, see section 2
    h = hidden[:, :-1].reshape(B * (T - 1), -1)  # (B*(T-1), H): state at t predicts token t+1
    targets = input_ids[:, 1:].reshape(-1)  # (B*(T-1),)
    # recompute in backward only if a gradient will be taken (old/ref log-probs: no_grad, the chunk
    # loop is enough)
    use_ckpt = torch.is_grad_enabled() and (h.requires_grad or any(p.requires_grad for p in head.parameters()))
    outs = []
    for s in range(0, h.shape[0], chunk_size):
        args = (head, h[s:s + chunk_size], targets[s:s + chunk_size], temperature, return_entropy, sampler)
        outs.append(checkpoint(_chunk_logprobs, *args, use_reentrant=False) if use_ckpt else _chunk_logprobs(*args))
    # (B, T) each: position 0 -> 0
    cols = [F.pad(torch.cat(parts).view(B, T - 1), (1, 0)) for parts in zip(*outs)]
    if position_ids is not None:
        # (B, T): each episode's first
        cols = [x.masked_fill(position_ids.expand(B, T) == 0, 0.0) for x in cols]
    return tuple(cols) if return_entropy else cols[0]


# --------------------------------------------------------------------------------------------------
# 4. The loss
#
# Maximised objective, per trained token t of row b (mask m_bt = 1), with A the trajectory's
# advantage:
#
#   ratio_bt = pi(y_bt) / pi_old(y_bt)  = exp(logp - old_logp)
#   surr_bt  = min( ratio_bt * A,  clip(ratio_bt, 1 - eps_low, 1 + eps_high) * A )     pessimistic side
#   w_bt     = min( pi_old(y_bt) / mu(y_bt),  C )   detached; mu = the sampler          truncated IS
#   kl_bt    = exp(ref - logp) - (ref - logp) - 1   clamped to [-10, 10]              k3 estimator, >= 0
#   J        = (1 / N_tok) * sum_bt m_bt * ( w_bt * surr_bt - beta * kl_bt )          token mean
#   loss     = -J
#
# Why: the min makes the update pessimistic (a ratio already past the clip on the side that helps
# gets no gradient); the paper updates once per batch, so ratio == 1, the clip never bites, and the
# gradient is exactly REINFORCE with the group mean as baseline. k3 is an unbiased, non-negative
# estimate of KL(pi || pi_ref) from samples of pi; its gradient 1 - exp(ref - logp) is zero when pi
# == pi_ref. N_tok = trained tokens (of the whole step, if given).
#
# w is truncated importance sampling (TIS). The tokens were drawn by the rollout engine (mu: vLLM's
# bf16 kernels, or another copy of the weights), not by the trainer's forward (pi_old), and the two
# disagree token by token. Weighting each token by pi_old / mu makes the gradient the trainer's
# own policy gradient again; truncating at C keeps one token the sampler found unlikely from
# dominating the step (the variance of an untruncated weight has no bound). Without it (w = 1, the
# paper's loss) the gradient is that of the sampler's policy, biased by however far the two drift.


def tis_weights(old_logp, sample_logp, mask, cap: float) -> tuple[torch.Tensor, dict]:
    """w = min(pi_old / mu, C) per token, detached, and how far the sampler is from the trainer:
    `sampler_kl` (the k3 estimate of KL(mu || pi_old) from mu's own samples: r - 1 - log r with
    r = pi_old / mu), the weights' mean and max, and the share truncated at C. old_logp is the
    trainer's log-prob under the sampler's own temperature and top-p (sampling.sampler_logprobs),
    so the two are compared like for like; all (B, T)."""
    on = mask > 0  # (B, T)
    d = (old_logp - sample_logp).detach().clamp(-20.0, 20.0)  # (B, T): log r, finite (-inf: outside a nucleus)
    r = torch.exp(d)  # (B, T)
    w = r.clamp(max=cap)  # (B, T)
    n = max(int(on.sum().item()), 1)
    stats = {"sampler_kl": float((r - 1 - d)[on].sum()) / n,
             "is_mean": float(w[on].sum()) / n, "is_max": float(w[on].max()) if on.any() else 1.0,
             "is_truncated": float((r > cap)[on].sum()) / n}
    return w, stats


def grpo_loss(logp, old_logp, ref_logp, advantages, mask, clip_low: float = 0.2, clip_high: float = 0.2,
              kl_coef: float = 0.001, num_tokens=None, entropy=None, is_weight=None):
    """The loss above -> (loss, stats of plain floats). logp (grad), old_logp (the policy before this
    step), ref_logp (frozen, or None), mask, entropy: (B, T); advantages: (B,) or (B, T); num_tokens:
    N_tok, the whole step's (default mask.sum()); is_weight: w (B, T) from tis_weights, or None for
    the paper's loss (w = 1)."""
    mask = mask.to(logp.dtype)  # (B, T): 1 = token sampled by the policy
    adv = advantages[:, None] if advantages.dim() == 1 else advantages  # (B, 1) or (B, T)
    n_tok = mask.sum()
    denom = n_tok.clamp(min=1) if num_tokens is None else num_tokens

    ratio = torch.exp(logp - old_logp.detach())  # (B, T)
    clipped = torch.clamp(ratio, 1 - clip_low, 1 + clip_high)  # (B, T)
    surr = torch.min(ratio * adv, clipped * adv)  # (B, T)
    if is_weight is not None:
        surr = is_weight.detach() * surr  # (B, T): the sampler corrected for, never differentiated
    d = ref_logp.detach() - logp if ref_logp is not None and kl_coef != 0 else torch.zeros_like(logp)  # (B, T)
    kl = torch.clamp(torch.exp(d) - d - 1, -10.0, 10.0)  # (B, T); 0 without a reference
    objective = surr - kl_coef * kl  # (B, T)
    loss = -(objective * mask).sum() / denom  # sign flipped last: optimisers minimise

    with torch.no_grad():  # stats: masked means over this call's tokens, as plain floats
        on, n = mask > 0, max(int(n_tok.item()), 1)
        stats = {"clip_frac": float(((clipped * adv < ratio * adv) & on).sum()) / n,  # share the clip zeroed
                 "kl": float((kl * mask).sum()) / n, "ratio_min": float(ratio[on].min()) if on.any() else 1.0,
                 "ratio_max": float(ratio[on].max()) if on.any() else 1.0, "tokens": float(n_tok)}
        if entropy is not None:
            stats["entropy"] = float((entropy * mask).sum()) / n
    return loss, stats


# --------------------------------------------------------------------------------------------------
# 5. Demo: one toy group

if __name__ == "__main__":
    torch.manual_seed(0)
    torch.set_printoptions(precision=3, sci_mode=False)
    G, T = 4, 6
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])  # one task, G = 4 rollouts, two solved it
    adv = group_advantages(rewards, G)  # (G,)
    print("rewards", rewards.tolist(), "-> advantages", [round(a, 4) for a in adv.tolist()], "(mean 0, unbiased std 1)")
    # (G, T): prompt, 3 sampled, a tool result
    mask = torch.tensor([[0, 0, 1, 1, 1, 0]] * G, dtype=torch.float32)
    old_logp = -torch.rand(G, T) * 2  # (G, T): the trainer's log-probs before the update
    # (G, T): reference a little away from the policy
    ref_logp = old_logp + 0.05 * torch.randn(G, T)
    # (G, T): as if the policy had already moved
    logp = (old_logp + 0.3 * torch.randn(G, T)).requires_grad_()
    loss, stats = grpo_loss(logp, old_logp, ref_logp, adv, mask)
    loss.backward()
    ratio = torch.exp(logp - old_logp).detach().masked_fill(mask == 0, float("nan"))  # (G, T)
    print("ratio on trained tokens (nan = not trained)\n", ratio)
    print("loss", round(loss.item(), 5), "stats", {k: round(v, 4) for k, v in stats.items()})
    print("d loss / d logp: 0 where masked; where clipped only the small KL part is left\n", logp.grad)
    # (G, T): the rollout engine's own log-probs of the same tokens, off by its numerics (here a lot)
    sample_logp = old_logp + 0.4 * torch.randn(G, T)
    w, tis = tis_weights(old_logp, sample_logp, mask, cap=2.0)  # (G, T)
    print("importance weights min(pi_old / mu, 2) on trained tokens\n", w.masked_fill(mask == 0, float("nan")))
    print("sampler stats", {k: round(v, 4) for k, v in tis.items()})
