"""grpo.py against hand-computed numbers, naive references and gradient identities (tiny random Qwen3, CPU)."""

import math

import pytest
import torch

import grpo

# ---------------------------------------------------------------------------------------------------------------
# helpers


def tiny_qwen3(attn="sdpa", seed=0):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                      head_dim=64, intermediate_size=256, vocab_size=512, attn_implementation=attn)
    return Qwen3ForCausalLM(cfg).float()


def naive_logprobs(model, ids, attention_mask=None, temperature=1.0):
    """The textbook way: full (B, T, V) log-softmax, then gather; position 0 set to 0 as in grpo."""
    logits = model(ids, attention_mask=attention_mask, use_cache=False).logits.float() / temperature  # (B, T, V)
    logp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)  # (B, T-1)
    return torch.nn.functional.pad(logp, (1, 0))  # (B, T)


def episodes(n=8, seed=1, vocab=512):
    g = torch.Generator().manual_seed(seed)
    lens = [int(x) for x in torch.randint(4, 30, (n,), generator=g)]
    seqs = [torch.randint(0, vocab, (L,), generator=g).tolist() for L in lens]
    # loss mask built like a rollout's: prompt untrained, then alternating sampled / observed spans
    masks = [[0] * 3 + [int((t // 4) % 2 == 0) for t in range(L - 3)] for L in lens]
    return seqs, masks


# ---------------------------------------------------------------------------------------------------------------
# 1. advantages


def test_group_advantages_hand_numbers():
    # group [1,0,0,1]: mean .5, unbiased var = 4 * .25 / 3 = 1/3   -> +-.5 / (sqrt(1/3) + 1e-6) = +-0.8660239
    # group [1,0,0,0]: mean .25, unbiased var = (.5625 + 3 * .0625) / 3 = .25, std .5 -> 1.5, -.5 (/(.5+1e-6))
    # group [1,1,1,1]: std 0 -> 0 / 1e-6 = 0: a group that all agrees teaches nothing
    adv = grpo.group_advantages([1, 0, 0, 1, 1, 0, 0, 0, 1, 1, 1, 1], group_size=4)
    a = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    b = 0.500001
    want = [a, -a, -a, a, 0.75 / b, -0.25 / b, -0.25 / b, -0.25 / b, 0, 0, 0, 0]
    assert adv.shape == (12,)
    assert torch.allclose(adv, torch.tensor(want), atol=1e-6)
    assert abs(a - 0.8660239) < 1e-6  # not 1.0, which the biased std (1/2) would give
    raw = grpo.group_advantages([1, 0, 0, 1], group_size=4, scale_by_std=False)
    assert raw.tolist() == [0.5, -0.5, -0.5, 0.5]


def test_group_advantages_validates():
    with pytest.raises(ValueError, match="groups of 4"):
        grpo.group_advantages([1, 0, 1], group_size=4)
    with pytest.raises(ValueError, match=">= 2"):
        grpo.group_advantages([1, 0], group_size=1)


# ---------------------------------------------------------------------------------------------------------------
# 2. loss values

LOGP = torch.tensor([[-1.0, -2.0, -0.5, -3.0]])
OLD = torch.tensor([[-1.0, -2.2, -0.2, -3.0]])  # ratio = 1, e^.2 = 1.221403, e^-.3 = 0.740818, (masked)
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0]])


def test_loss_hand_numbers_positive_advantage():
    # A = +1: surr = 1, min(1.221403, 1.2) = 1.2, min(0.740818, 0.8) = 0.740818 -> J = 2.940818 / 3
    loss, st = grpo.grpo_loss(LOGP, OLD, None, torch.tensor([1.0]), MASK)
    assert loss.item() == pytest.approx(-0.980273, abs=1e-6)
    assert st["clip_frac"] == pytest.approx(1 / 3)  # token 2 was clipped
    assert st["ratio_min"] == pytest.approx(0.740818, abs=1e-6)
    assert st["ratio_max"] == pytest.approx(1.221403, abs=1e-6)
    assert st["tokens"] == 3 and st["kl"] == 0


def test_loss_hand_numbers_negative_advantage():
    # A = -1: surr = -1, min(-1.221403, -1.2) = -1.221403, min(-0.740818, -0.8) = -0.8 -> J = -3.021403 / 3
    loss, st = grpo.grpo_loss(LOGP, OLD, None, torch.tensor([-1.0]), MASK)
    assert loss.item() == pytest.approx(1.007134, abs=1e-6)
    assert st["clip_frac"] == pytest.approx(1 / 3)  # now token 3 is the clipped one


def test_loss_hand_numbers_kl_and_num_tokens():
    # ref - logp = .5, 0, -.5, (9, masked): k3 = e^.5 - 1.5 = 0.148721, 0, e^-.5 - .5 = 0.106531
    ref = LOGP + torch.tensor([[0.5, 0.0, -0.5, 9.0]])
    loss, st = grpo.grpo_loss(LOGP, OLD, ref, torch.tensor([1.0]), MASK, kl_coef=0.1)
    assert st["kl"] == pytest.approx(0.255252 / 3, abs=1e-6)
    assert loss.item() == pytest.approx(-(2.940818 - 0.1 * 0.255252) / 3, abs=1e-6)
    # ref - logp = 3 -> k3 = e^3 - 4 = 16.09, clamped to 10
    _, st = grpo.grpo_loss(LOGP, LOGP, LOGP + 3.0, torch.tensor([0.0]), MASK)
    assert st["kl"] == pytest.approx(10.0)
    # num_tokens replaces this call's token count: the masked sum over 6 instead of 3
    loss, _ = grpo.grpo_loss(LOGP, OLD, None, torch.tensor([1.0]), MASK, num_tokens=6)
    assert loss.item() == pytest.approx(-2.940818 / 6, abs=1e-6)
    # kl_coef = 0 is "no KL" even with a reference
    loss0, st0 = grpo.grpo_loss(LOGP, OLD, ref, torch.tensor([1.0]), MASK, kl_coef=0.0)
    assert loss0.item() == pytest.approx(-0.980273, abs=1e-6) and st0["kl"] == 0


# ---------------------------------------------------------------------------------------------------------------
# 3. gradient identities


def _rand(B=3, T=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    logp = (-torch.rand(B, T, generator=g) * 3).requires_grad_()
    ref = logp.detach() + 0.3 * torch.randn(B, T, generator=g)
    mask = (torch.rand(B, T, generator=g) > 0.3).float()
    adv = torch.randn(B, generator=g)
    return logp, ref, mask, adv


def test_on_policy_gradient_is_reinforce_plus_kl():
    logp, ref, mask, adv = _rand()
    beta = 0.05
    loss, st = grpo.grpo_loss(logp, logp.detach(), ref, adv, mask, kl_coef=beta)
    loss.backward()
    N = mask.sum()
    reinforce = -(adv[:, None] * mask) / N  # d/dlogp of -(1/N) sum adv * logp
    kl_grad = beta * mask * (1 - torch.exp(ref - logp.detach())) / N  # d/dlogp of beta * k3 / N
    assert torch.allclose(logp.grad, reinforce + kl_grad, atol=1e-7)
    assert st["clip_frac"] == 0 and st["ratio_min"] == st["ratio_max"] == 1.0


# Truncated importance sampling: w = min(pi_old / mu, C), detached, on the surrogate only

SAMPLED = torch.tensor([[-1.0, -2.0 - math.log(3.0), -0.5 + 0.25, -7.0]])  # mu: pi_old / mu = 1, 3, e^-.25, (masked)


def test_tis_weights_hand_numbers():
    w, st = grpo.tis_weights(LOGP, SAMPLED, MASK, cap=2.0)
    assert w[0, :3].tolist() == pytest.approx([1.0, 2.0, math.exp(-0.25)], abs=1e-6)  # 3 truncated at C = 2
    assert st["is_max"] == pytest.approx(2.0) and st["is_truncated"] == pytest.approx(1 / 3)
    assert st["is_mean"] == pytest.approx((1 + 2 + math.exp(-0.25)) / 3, abs=1e-6)
    # k3 of KL(mu || pi_old) from mu's samples: r - 1 - log r per token, averaged over the 3 trained ones
    k3 = [0.0, 3 - 1 - math.log(3.0), math.exp(-0.25) - 1 + 0.25]
    assert st["sampler_kl"] == pytest.approx(sum(k3) / 3, abs=1e-6)
    # a token outside the trainer's nucleus (log pi_old = -inf) weighs nothing, and the stats stay finite
    w, st = grpo.tis_weights(torch.tensor([[float("-inf"), -1.0]]), torch.tensor([[-1.0, -1.0]]),
                             torch.ones(1, 2), cap=2.0)
    assert w.tolist() == [[pytest.approx(math.exp(-20.0)), 1.0]] and math.isfinite(st["sampler_kl"])


def test_tis_weighted_gradient_is_w_times_reinforce_and_the_kl_is_not_weighted():
    logp, ref, mask, adv = _rand()
    g = torch.Generator().manual_seed(3)
    sampled = logp.detach() + 0.8 * torch.randn(logp.shape, generator=g)  # a sampler that disagrees
    w, _ = grpo.tis_weights(logp.detach(), sampled, mask, cap=1.5)
    assert (w < 1.5).any() and (w == 1.5).any()  # some weights truncated, some not
    beta, N = 0.05, mask.sum()
    loss, _ = grpo.grpo_loss(logp, logp.detach(), ref, adv, mask, kl_coef=beta, is_weight=w)
    loss.backward()
    expect = -(w * adv[:, None] * mask) / N + beta * mask * (1 - torch.exp(ref - logp.detach())) / N
    assert torch.allclose(logp.grad, expect, atol=1e-7)


def test_without_weights_the_loss_is_the_papers_bit_for_bit():
    logp, ref, mask, adv = _rand(seed=5)
    old = logp.detach() + 0.1
    paper, _ = grpo.grpo_loss(logp, old, ref, adv, mask, kl_coef=0.05)
    ones, _ = grpo.grpo_loss(logp, old, ref, adv, mask, kl_coef=0.05, is_weight=torch.ones_like(logp))
    assert paper.item() == ones.item()  # w = 1 exactly (a sampler that agrees) changes no bit either


def test_on_policy_gradient_is_reinforce_through_a_model():
    model = tiny_qwen3()
    ids = torch.randint(0, 512, (2, 16))
    mask = torch.ones(2, 16)
    mask[:, :4] = 0
    adv = torch.tensor([0.7, -1.3])
    logp = grpo.token_logprobs(model, ids, chunk_size=8)
    grpo.grpo_loss(logp, logp.detach(), None, adv, mask)[0].backward()
    g1 = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    logp = grpo.token_logprobs(model, ids, chunk_size=8)
    (-(adv[:, None] * logp * mask).sum() / mask.sum()).backward()  # REINFORCE with group baseline
    for a, b in zip(g1, model.parameters()):
        assert torch.allclose(a, b.grad, atol=1e-7)


def test_kl_zero_when_policy_is_reference():
    logp, _, mask, adv = _rand()
    old = logp.detach() - 0.1
    with_kl, st = grpo.grpo_loss(logp, old, logp.detach(), adv, mask, kl_coef=1.0)
    (g_with,) = torch.autograd.grad(with_kl, logp)
    without, _ = grpo.grpo_loss(logp, old, None, adv, mask)
    (g_without,) = torch.autograd.grad(without, logp)
    assert st["kl"] == 0.0
    assert with_kl.item() == without.item()
    assert torch.equal(g_with, g_without)


def test_masked_tokens_get_exactly_zero_gradient():
    logp, ref, mask, adv = _rand()
    old = logp.detach() + 0.1 * torch.randn_like(logp)  # off-policy, so ratios and KL are all non-trivial
    loss, _ = grpo.grpo_loss(logp, old, ref, adv, mask, kl_coef=0.5)
    loss.backward()
    assert (logp.grad[mask == 0] == 0).all()
    assert (logp.grad[mask == 1] != 0).any()


@pytest.mark.parametrize("log_ratio, adv, zero", [
    (math.log(1.5), 1.0, True),    # ratio 1.5 > 1.2 and A > 0: already pushed up enough -> clipped, no grad
    (math.log(0.5), -1.0, True),   # ratio 0.5 < 0.8 and A < 0: already pushed down enough -> clipped
    (math.log(1.5), -1.0, False),  # ratio 1.5, A < 0: the unclipped term is the pessimistic one -> grad flows
    (math.log(0.5), 1.0, False),   # ratio 0.5, A > 0: same, grad flows to undo the mistake
])
def test_clipping(log_ratio, adv, zero):
    logp = torch.full((1, 2), -1.0, requires_grad=True)
    old = logp.detach() - log_ratio
    loss, st = grpo.grpo_loss(logp, old, None, torch.tensor([adv]), torch.ones(1, 2))
    loss.backward()
    if zero:
        assert (logp.grad == 0).all() and st["clip_frac"] == 1.0
    else:  # d/dlogp of -(1/2) * ratio * A = -(1/2) * ratio * A
        assert torch.allclose(logp.grad, torch.full((1, 2), -0.5 * math.exp(log_ratio) * adv))
        assert st["clip_frac"] == 0.0


# ---------------------------------------------------------------------------------------------------------------
# 4. chunked log-probs


@pytest.mark.parametrize("chunk", [1, 5, 16, 1024])
def test_chunked_logprobs_equal_naive(chunk):
    model = tiny_qwen3()
    ids = torch.randint(0, 512, (2, 23))  # 2 * 22 = 44 scored tokens: 5 and 16 do not divide it
    attn = torch.ones(2, 23, dtype=torch.long)
    attn[1, 17:] = 0  # right padding on the second row
    for temp in (1.0, 0.7):
        want = naive_logprobs(model, ids, attn, temp)
        got, ent = grpo.token_logprobs(model, ids, attn, chunk_size=chunk, temperature=temp, return_entropy=True)
        assert got.shape == ids.shape and (got[:, 0] == 0).all()
        assert torch.allclose(got, want, atol=1e-5)
    # entropy, checked against the naive distribution (temperature 0.7 from the loop's last pass)
    lp = torch.log_softmax(model(ids, attention_mask=attn).logits[:, :-1] / 0.7, -1)  # (B, T-1, V)
    assert torch.allclose(ent[:, 1:], -(lp.exp() * lp).sum(-1), atol=1e-4)


def test_chunked_backward_equals_naive_and_stays_chunked():
    model, chunk, V = tiny_qwen3(), 8, 512
    ids = torch.randint(0, 512, (2, 30))
    w = torch.randn(2, 30)
    (naive_logprobs(model, ids) * w).sum().backward()
    want = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()

    head_rows, saved = [], []  # every lm_head call's row count; every tensor autograd saves with a vocab axis
    hook = model.get_output_embeddings().register_forward_hook(lambda m, i, o: head_rows.append(o.shape[0]))
    with torch.autograd.graph.saved_tensors_hooks(lambda t: (saved.append(t.numel() if t.shape[-1:] == (V,) else 0), t)[1],
                                                  lambda t: t):
        logp = grpo.token_logprobs(model, ids, chunk_size=chunk)
    (logp * w).sum().backward()
    hook.remove()
    for a, p in zip(want, model.parameters()):
        assert torch.allclose(a, p.grad, atol=1e-5)
    n_chunks = math.ceil(2 * 29 / chunk)
    assert len(head_rows) == 2 * n_chunks  # once in forward, once recomputed in backward
    assert max(head_rows) <= chunk  # the head never saw more than one chunk of tokens
    assert max(saved) < 2 * 29 * V  # nothing of size (B, T, V) was kept for backward (the (V, H) weights are)


# ---------------------------------------------------------------------------------------------------------------
# 5. packing


def test_pack_sequences_layout():
    seqs, masks = episodes()
    adv = [float(k) for k in range(len(seqs))]
    old = [[-0.5] * len(s) for s in seqs]
    rows = grpo.pack_sequences(seqs, masks, max_tokens=40, adv=adv, old_logp=old)
    seen = []
    for row in rows:
        L = row["input_ids"].shape[1]
        assert L <= 40 and all(row[k].shape == (1, L) for k in ("position_ids", "mask", "seq_id", "adv", "old_logp"))
        ids = row["seq_id"][0]
        for k in ids.unique().tolist():
            sel = ids == k
            assert row["input_ids"][0, sel].tolist() == seqs[k]
            assert row["mask"][0, sel].tolist() == masks[k]
            assert row["position_ids"][0, sel].tolist() == list(range(len(seqs[k])))
            assert (row["adv"][0, sel] == k).all()
            seen.append(k)
    assert sorted(seen) == list(range(len(seqs)))
    assert sum(r["input_ids"].shape[1] for r in rows) == sum(map(len, seqs))  # not a single pad token
    with pytest.raises(ValueError, match="mask entries"):
        grpo.pack_sequences([[1, 2, 3]], [[0, 1]], max_tokens=8)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_logprobs_equal_one_at_a_time(attn):
    model = tiny_qwen3(attn)
    seqs, masks = episodes()
    rows = grpo.pack_sequences(seqs, masks, max_tokens=64)
    assert any(len(r["seq_id"].unique()) > 1 for r in rows)  # some row really holds several episodes
    with torch.no_grad():
        for row in rows:
            packed = grpo.token_logprobs(model, row["input_ids"], position_ids=row["position_ids"], chunk_size=7)
            for k in row["seq_id"][0].unique().tolist():
                alone = grpo.token_logprobs(model, torch.tensor([seqs[k]]))  # (1, L_k)
                assert torch.allclose(packed[0, row["seq_id"][0] == k], alone[0], atol=1e-5)


def test_step_gradient_independent_of_split():
    """One optimizer step's gradient: 1 padded batch == 4 padded micro-batches == packed rows (num_tokens)."""
    model = tiny_qwen3()
    seqs, masks = episodes()
    g = torch.Generator().manual_seed(3)
    adv = torch.randn(len(seqs), generator=g).tolist()
    old = [(-torch.rand(len(s), generator=g)).tolist() for s in seqs]
    ref = [(-torch.rand(len(s), generator=g)).tolist() for s in seqs]
    total = sum(sum(m) for m in masks)

    def step_grad(batches):
        model.zero_grad()
        for b in batches:
            logp = grpo.token_logprobs(model, b["input_ids"], b.get("attention_mask"), b.get("position_ids"), chunk_size=16)
            loss, _ = grpo.grpo_loss(logp, b["old"], b["ref"], b["adv"], b["mask"], num_tokens=total, kl_coef=0.1)
            loss.backward()
        return [p.grad.clone() for p in model.parameters()]

    one = step_grad(grpo.pad_sequences(seqs, masks, batch_size=8, adv=adv, old=old, ref=ref))
    four = step_grad(grpo.pad_sequences(seqs, masks, batch_size=2, adv=adv, old=old, ref=ref))
    packed = step_grad(grpo.pack_sequences(seqs, masks, max_tokens=64, adv=adv, old=old, ref=ref))
    for a, b, c in zip(one, four, packed):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-5)
        assert torch.allclose(a, c, atol=1e-6, rtol=1e-5)
