"""engine.py and plumbing/hf_engine.py: the HF sampling loop against plain forward passes and against ReferenceEngine
(the bare loop), its store of earlier calls' keys/values against a full re-prefill. Elsewhere: vLLM in
tests/test_vllm_engine.py (which imports make_prompts and forward_logprobs from here), the sampling step and the
seeds in tests/test_sampling.py, KVStore alone in tests/test_kv_store.py."""

import copy
import random

import numpy as np
import pytest
import torch

from engine import Engine, ReferenceEngine, check_vllm_model, make_engine
from plumbing.hf_engine import HFEngine, common_prefix_len
from plumbing.hf_engine import weights_version
from demo.tiny_model import build_tiny


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny-engine")
    # smaller than the default tiny model (tests run often), still head_dim 64 and grouped-query attention
    model, tok = build_tiny(d, seed=0, hidden=128, layers=2, heads=2, kv_heads=1, intermediate=256)
    return d, model, tok


def make_prompts(tok, n=4, seed=0):
    """Prompts of different lengths: chat-rendered ones and raw random ids (so left padding really happens)."""
    rng = random.Random(seed)
    msgs = [{"role": "user", "content": "Please cancel order #W1234567."}]
    chat = tok.encode(tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, enable_thinking=False))
    prompts = [chat, chat[:7]]
    prompts += [[rng.randrange(3, len(tok)) for _ in range(rng.randint(1, 40))] for _ in range(n - 2)]
    return prompts


def forward_logprobs(model, prompt, tokens, temperature):
    """Log-probs of `tokens` after `prompt` from ONE unpadded forward pass, at the given temperature."""
    ids = torch.tensor([prompt + tokens])  # (1, P + N)
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()  # (N, V) predictions of the N tokens
    t = temperature if temperature > 0 else 1.0
    return (logits / t).log_softmax(-1).gather(-1, torch.tensor(tokens)[:, None])[:, 0]  # (N,)


# ---------------------------------------------------------------------------------------------------------------
# HFEngine


def test_batched_greedy_equals_unbatched(tiny):
    _, model, tok = tiny
    eng = HFEngine(model, tok)
    prompts = make_prompts(tok)
    batched = eng.generate(prompts, max_new_tokens=16, temperature=0.0, stop_token_ids=[])
    for p, b in zip(prompts, batched):
        alone = eng.generate([p], max_new_tokens=16, temperature=0.0, stop_token_ids=[])[0]
        assert b.token_ids == alone.token_ids
        assert b.logprobs == pytest.approx(alone.logprobs, abs=1e-4)
        assert len(b.token_ids) == 16 and b.finish_reason == "length"


@pytest.mark.parametrize("temperature, top_p", [(0.0, 1.0), (1.0, 1.0), (1.0, 0.9)])
def test_reference_engine_samples_what_hfengine_samples(tiny, temperature, top_p):
    """ReferenceEngine (one prompt at a time, transformers' own cache and attention) and HFEngine (one padded
    batch, its own buffers, its attention function) draw the same uniforms from the same per-prompt streams: on
    the same seeds they sample the same tokens, and the log-probs differ by float rounding only."""
    _, model, tok = tiny
    prompts = make_prompts(tok, n=6, seed=1)  # chat-rendered and random, 1 to 40 tokens: real left padding
    assert len({len(p) for p in prompts}) >= 4
    stop = [tok.convert_tokens_to_ids("<|im_end|>")]
    for seed in (0, [5, 6, 7, 8, 9, 10]):  # one int for the call, and one seed per prompt
        ref = ReferenceEngine(model, tok).generate(prompts, 20, temperature, top_p, stop_token_ids=stop, seed=seed)
        hf = HFEngine(model, tok).generate(prompts, 20, temperature, top_p, stop_token_ids=stop, seed=seed)
        for a, b in zip(ref, hf):
            assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
            # (1e-3, not 1e-5: under top-p a token whose cumulative mass sits on the cut can fall inside the nucleus in
            # one engine's rounding and outside in the other's; the renormalised log-prob then moves by its mass:
            # 3.3e-4 seen on an AMD EPYC host, same tokens)
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-3 if top_p < 1 else 1e-5)
    assert len({tuple(s.token_ids) for s in hf}) == len(prompts)  # the check is not vacuous: six continuations


def test_engines_keep_the_protocol(tiny):
    _, model, tok = tiny
    assert all(isinstance(e, Engine) for e in (HFEngine(model, tok), ReferenceEngine(model, tok)))
    assert not isinstance(object(), Engine)
    # ReferenceEngine's update_weights loads a separate copy, as HFEngine's does
    other = copy.deepcopy(model)
    with torch.no_grad():
        for q in other.parameters():
            q.add_(torch.randn_like(q) * 0.05)
    ref = ReferenceEngine(copy.deepcopy(model), tok)
    ref.update_weights(other.state_dict().items())
    prompts = make_prompts(tok)
    want = [s.token_ids for s in HFEngine(other, tok).generate(prompts, 8, temperature=0.0, stop_token_ids=[])]
    assert [s.token_ids for s in ref.generate(prompts, 8, temperature=0.0, stop_token_ids=[])] == want
    with pytest.raises(KeyError):
        ref.update_weights([("no.such.weight", torch.zeros(1))])


def test_rows_leaving_the_batch_change_nothing(tiny, monkeypatch):
    """Finished rows leave the decode batch (the last live row moves into their slot), and once the longest prompt
    has left, the left padding only it filled is no longer shown to the model (BufferLayer.skip_padding). Neither
    may change what the other rows sample."""
    _, model, tok = tiny
    eng = HFEngine(model, tok, cache_gib=0)  # no reuse across calls: every call lays its prompts out afresh
    rng = random.Random(3)
    prompts = [[rng.randrange(3, len(tok)) for _ in range(n)] for n in (90, 12, 40, 25, 60)]
    free = [s.token_ids for s in eng.generate(prompts, max_new_tokens=12, temperature=0.0, stop_token_ids=[])]

    def first(row, t):
        return row.index(t) if t in row else len(row)

    # a stop token that the longest prompt (row 0) samples before at least two other rows do
    stop = max(free[0][:6], key=lambda t: sum(first(r, t) > first(free[0], t) for r in free[1:]))
    assert sum(first(r, stop) > first(free[0], stop) for r in free[1:]) >= 2, "no stop token lets row 0 leave first"
    starts = []  # (start, padded) of every decode layout
    layout = HFEngine._layout
    monkeypatch.setattr(HFEngine, "_layout", staticmethod(lambda *a: starts.append(layout(*a)) or starts[-1]))
    batched = eng.generate(prompts, max_new_tokens=12, temperature=0.0, stop_token_ids=[stop])
    assert starts[0] == (0, True) and any(s > 0 for s, _ in starts[1:])  # the padding was skipped once row 0 left
    for p, b in zip(prompts, batched):
        alone = eng.generate([p], max_new_tokens=12, temperature=0.0, stop_token_ids=[stop])[0]
        assert b.token_ids == alone.token_ids and b.finish_reason == alone.finish_reason
        assert b.logprobs == pytest.approx(alone.logprobs, abs=1e-4)


def test_shared_prefix_is_computed_once_and_changes_nothing(tiny):
    _, model, tok = tiny
    from tools import GENERIC_TOOLS, function_schema

    tools = [function_schema(fn) for fn in GENERIC_TOOLS]

    def chat(user):
        msgs = [{"role": "system", "content": "Policy."}, {"role": "user", "content": user}]
        return tok.encode(tok.apply_chat_template(msgs, tools=tools, tokenize=False, add_generation_prompt=True))

    a, b = chat("Cancel my order."), chat("Where is my parcel? It was due on Monday.")
    prompts = [a, b, a, a[:-3]]  # two identical rows, and a row that is a prefix of the others
    assert common_prefix_len(prompts) > 100  # the system turn with the tools block is shared
    shared = HFEngine(model, tok).generate(prompts, 8, temperature=0.0, stop_token_ids=[])
    unshared = HFEngine(model, tok, min_shared_prefix=10**9).generate(prompts, 8, temperature=0.0, stop_token_ids=[])
    assert [s.token_ids for s in shared] == [s.token_ids for s in unshared]
    assert shared[0].token_ids == shared[2].token_ids
    for x, p in zip(shared[1:], prompts[1:]):
        alone = HFEngine(model, tok).generate([p], 8, temperature=0.0, stop_token_ids=[])[0]
        assert x.token_ids == alone.token_ids
        assert x.logprobs == pytest.approx(alone.logprobs, abs=1e-4)
    sampled = HFEngine(model, tok).generate(prompts, 8, temperature=1.0, stop_token_ids=[], seed=3)
    for p, s in zip(prompts, sampled):
        assert torch.allclose(torch.tensor(s.logprobs), forward_logprobs(model, p, s.token_ids, 1.0), atol=1e-4)


@pytest.mark.parametrize("temperature", [0.0, 1.0, 0.7])
def test_logprobs_equal_a_forward_pass(tiny, temperature):
    _, model, tok = tiny
    prompts = make_prompts(tok)
    samples = HFEngine(model, tok).generate(prompts, 16, temperature=temperature, stop_token_ids=[], seed=1)
    for p, s in zip(prompts, samples):
        ref = forward_logprobs(model, p, s.token_ids, temperature)
        assert torch.allclose(torch.tensor(s.logprobs), ref, atol=1e-4), (s.logprobs, ref)


def naive_top_p_logprob(logits, token, temperature, top_p):
    """Nucleus log-prob by hand: walk the sorted probabilities until their mass reaches top_p."""
    probs = (logits / temperature).softmax(-1).tolist()
    order = sorted(range(len(probs)), key=lambda i: -probs[i])
    kept, mass = [], 0.0
    for i in order:
        if mass >= top_p:
            break
        kept.append(i)
        mass += probs[i]
    assert token in kept, "sampled a token outside the nucleus"
    return torch.log(torch.tensor(probs[token] / sum(probs[i] for i in kept)))


def test_top_p_logprobs_match_naive_nucleus(tiny):
    _, model, tok = tiny
    m = copy.deepcopy(model)
    with torch.no_grad():
        m.lm_head.weight.mul_(30)  # a peaked distribution, so a 0.5 nucleus holds a few tokens, not hundreds
    prompt = make_prompts(tok)[0]
    s = HFEngine(m, tok).generate([prompt], 8, temperature=0.8, top_p=0.5, stop_token_ids=[], seed=0)[0]
    ids = torch.tensor([prompt + s.token_ids])
    with torch.no_grad():
        logits = m(ids).logits[0, len(prompt) - 1 : -1]  # (N, V)
    for i, (t, lp) in enumerate(zip(s.token_ids, s.logprobs)):
        assert lp == pytest.approx(naive_top_p_logprob(logits[i], t, 0.8, 0.5).item(), abs=1e-4)


def test_stop_token_included_and_finish_reason(tiny):
    _, model, tok = tiny
    eng = HFEngine(model, tok)
    prompts = make_prompts(tok)
    free = eng.generate(prompts, 12, temperature=0.0, stop_token_ids=[])
    # stop on the token row 0 produces at step 5: row 0 must end right there; others end at its first
    # occurrence in their own output, or run to the budget
    stop_id = free[0].token_ids[5]
    stopped = eng.generate(prompts, 12, temperature=0.0, stop_token_ids=[stop_id])
    for f, s in zip(free, stopped):
        if stop_id in f.token_ids:
            k = f.token_ids.index(stop_id)
            assert s.token_ids == f.token_ids[: k + 1] and s.token_ids[-1] == stop_id
            assert s.finish_reason == "stop"
            assert s.logprobs == pytest.approx(f.logprobs[: k + 1], abs=1e-4)
        else:
            assert s.token_ids == f.token_ids and s.finish_reason == "length"
    assert stopped[0].finish_reason == "stop" and len(stopped[0].token_ids) <= 6
    for p, s in zip(prompts, stopped):  # rows that kept going after others left the batch are still exact
        assert torch.allclose(torch.tensor(s.logprobs), forward_logprobs(model, p, s.token_ids, 0.0), atol=1e-4)
    # default stop set: <|im_end|> (the tokenizer's eos)
    assert eng.stop_token_ids == [tok.convert_tokens_to_ids("<|im_end|>")]


def test_seeded_sampling_is_reproducible(tiny):
    _, model, tok = tiny
    eng = HFEngine(model, tok)
    prompts = make_prompts(tok)
    a = eng.generate(prompts, 16, temperature=1.0, seed=123)
    b = eng.generate(prompts, 16, temperature=1.0, seed=123)  # now most of each prompt comes from the store
    c = eng.generate(prompts, 16, temperature=1.0, seed=124)
    assert [s.token_ids for s in a] == [s.token_ids for s in b]
    for x, y in zip(a, b):  # cached keys/values were computed in another forward: equal up to float rounding
        assert x.logprobs == pytest.approx(y.logprobs, abs=1e-5)
    assert [s.token_ids for s in a] != [s.token_ids for s in c]
    eng.reset_cache()  # the same state as for `a`: bit for bit the same numbers
    assert [s.logprobs for s in eng.generate(prompts, 16, temperature=1.0, seed=123)] == [s.logprobs for s in a]
    # one uniform per prompt per step, in prompt order: a prompt's draw does not depend on its batch neighbours
    alone = HFEngine(model, tok, cache_gib=0).generate(prompts[:2], 16, temperature=1.0, seed=123)
    assert [s.token_ids for s in alone] == [s.token_ids for s in a[:2]]


def test_per_prompt_seeds(tiny):
    # a list gives each prompt its own stream: the same prompt and seed sample the same tokens in any batch
    _, model, tok = tiny
    prompts = make_prompts(tok)
    eng = HFEngine(model, tok, cache_gib=0)
    batch = eng.generate(prompts, 16, temperature=1.0, stop_token_ids=[], seed=[7, 8, 9, 10])
    alone = eng.generate([prompts[2]], 16, temperature=1.0, stop_token_ids=[], seed=[9])
    assert alone[0].token_ids == batch[2].token_ids
    swapped = eng.generate(prompts[::-1], 16, temperature=1.0, stop_token_ids=[], seed=[10, 9, 8, 7])
    assert [s.token_ids for s in swapped[::-1]] == [s.token_ids for s in batch]
    same = eng.generate([prompts[0]] * 2, 16, temperature=1.0, stop_token_ids=[], seed=[1, 2])
    assert same[0].token_ids != same[1].token_ids  # two seeds, two continuations of one prompt
    with pytest.raises(ValueError, match="3 seeds for 4 prompts"):
        eng.generate(prompts, 4, seed=[1, 2, 3])


def test_update_weights(tiny):
    _, model, tok = tiny
    trainer = copy.deepcopy(model)
    engine = HFEngine(copy.deepcopy(model), tok)  # a separate copy, like a separate rollout engine
    prompts = make_prompts(tok)
    before = engine.generate(prompts, 12, temperature=0.0, stop_token_ids=[])
    torch.manual_seed(0)
    with torch.no_grad():
        for p in trainer.parameters():
            p.add_(torch.randn_like(p) * 0.05)  # "a training step"
    assert engine.generate(prompts, 12, temperature=0.0, stop_token_ids=[])[0].token_ids == before[0].token_ids
    engine.update_weights(trainer.state_dict().items())
    after = engine.generate(prompts, 12, temperature=0.0, stop_token_ids=[])
    want = HFEngine(trainer, tok).generate(prompts, 12, temperature=0.0, stop_token_ids=[])
    assert [s.token_ids for s in after] == [s.token_ids for s in want]
    assert [s.token_ids for s in after] != [s.token_ids for s in before]
    # sharing the trainer's model: the update is a no-op and outputs are already current
    shared = HFEngine(trainer, tok)
    shared.update_weights(trainer.state_dict().items())
    assert shared.generate(prompts, 12, temperature=0.0, stop_token_ids=[])[0].token_ids == want[0].token_ids
    with pytest.raises(KeyError):
        engine.update_weights([("no.such.weight", torch.zeros(1))])


# ---------------------------------------------------------------------------------------------------------------
# HFEngine's store: keys/values kept across calls, as a multi-turn rollout uses them


def conversation_turns(eng, tok, prompts, turns=3, temperature=0.0, seed=None):
    """Play `turns` rounds like rollout.py: generate, then each prompt becomes prompt + sampled + a delta. The
    deltas differ in length (1 to 150 tokens, so the prefill runs in several groups of similar length); row 1
    keeps only part of its sample (rollout.py cuts a turn to its own budget: only a prefix of the stored
    sequence matches); row 3 starts a new conversation at turn 2 (nothing cached for it).
    Returns (samples, prompts, reused tokens) per turn."""
    rng = random.Random(7)
    out = []
    for t in range(turns):
        reused = eng.stats["reused_tokens"]
        samples = eng.generate(prompts, 12, temperature=temperature, stop_token_ids=[5, 9], seed=seed)
        out.append((samples, prompts, eng.stats["reused_tokens"] - reused))
        deltas = [[rng.randrange(3, len(tok)) for _ in range(n)] for n in (1, 9, 150, 70)]
        prompts = [p + s.token_ids + d for p, s, d in zip(prompts, samples, deltas)]
        prompts[1] = prompts[1][: len(prompts[1]) - len(deltas[1]) - len(samples[1].token_ids) // 2] + deltas[1]
        if t == 0:
            prompts[3] = [rng.randrange(3, len(tok)) for _ in range(33)]
    return out


def test_cached_turns_equal_a_full_prefill(tiny):
    _, model, tok = tiny
    cached, uncached = HFEngine(model, tok), HFEngine(model, tok, cache_gib=0)
    mode = model.training
    a = conversation_turns(cached, tok, make_prompts(tok))
    b = conversation_turns(uncached, tok, make_prompts(tok))
    for (turn_a, prompts, _), (turn_b, _, _) in zip(a, b):
        for p, x, y in zip(prompts, turn_a, turn_b):
            assert x.token_ids == y.token_ids and x.finish_reason == y.finish_reason
            assert x.logprobs == pytest.approx(y.logprobs, abs=1e-4)
            # and both equal one unpadded forward pass over the whole sequence
            assert torch.allclose(torch.tensor(x.logprobs), forward_logprobs(model, p, x.token_ids, 0.0), atol=1e-4)
    # What was reused, exactly: for each prompt, its longest common prefix with any sequence an earlier call
    # produced (prompt + sampled tokens but the last), keeping at least one token to run.
    done = []  # sequences whose keys/values were computed
    for samples, prompts, reused in a:
        want = sum(min(max([common_prefix_len([p, q]) for q in done] + [0]), len(p) - 1) for p in prompts)
        assert reused == want
        done += [p + s.token_ids[:-1] for p, s in zip(prompts, samples)]
    assert sum(r for _, _, r in a[1:]) > 400 and uncached.stats["reused_tokens"] == 0
    # Each turn's entry replaces the one it extends: rows 0, 2 and 3 hold one entry each, plus row 3's first
    # conversation. Row 1's next prompt cut its sample, so its older entries are not prefixes of the newer ones
    # (their tails still answer lookups) and stay until the LRU evicts them: 3 + 1 + 3 = 7.
    assert len(cached.store.seqs) == 7 and len(uncached.store.seqs) == 0
    assert model.config._attn_implementation == "sdpa" and model.training == mode  # restored after each call


def test_cached_turns_sample_the_same_tokens(tiny):
    _, model, tok = tiny
    a = conversation_turns(HFEngine(model, tok), tok, make_prompts(tok), temperature=1.0, seed=11)
    b = conversation_turns(HFEngine(model, tok, cache_gib=0), tok, make_prompts(tok), temperature=1.0, seed=11)
    assert [[s.token_ids for s in t] for t, _, _ in a] == [[s.token_ids for s in t] for t, _, _ in b]
    assert sum(r for _, _, r in a) > 400


def test_weight_changes_empty_the_store(tiny):
    _, model, tok = tiny
    prompts = make_prompts(tok)
    # (1) a separate copy synced with update_weights
    trainer = copy.deepcopy(model)
    eng = HFEngine(copy.deepcopy(model), tok)
    eng.generate(prompts, 8, temperature=0.0, stop_token_ids=[])
    assert len(eng.store.seqs) > 0
    torch.manual_seed(0)
    with torch.no_grad():
        for p in trainer.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    eng.update_weights(trainer.state_dict().items())
    assert len(eng.store.seqs) == 0
    want = HFEngine(trainer, tok, cache_gib=0).generate(prompts, 8, temperature=0.0, stop_token_ids=[])
    got = eng.generate(prompts, 8, temperature=0.0, stop_token_ids=[])
    assert [s.token_ids for s in got] == [s.token_ids for s in want]
    # (2) the trainer's own model, changed in place between calls: an optimizer step bumps the parameters'
    # versions, and the next call starts from an empty store
    shared = copy.deepcopy(model)
    eng = HFEngine(shared, tok)
    before = eng.generate(prompts, 8, temperature=0.0, stop_token_ids=[])
    v0 = weights_version(shared)
    opt = torch.optim.AdamW(shared.parameters(), lr=1e-2)
    shared(torch.tensor([prompts[0]]), labels=torch.tensor([prompts[0]])).loss.backward()
    opt.step()
    assert weights_version(shared) != v0
    reused = eng.stats["reused_tokens"]
    after = eng.generate(prompts, 8, temperature=0.0, stop_token_ids=[])
    assert eng.stats["reused_tokens"] == reused  # nothing reused: the store was emptied
    want = HFEngine(shared, tok, cache_gib=0).generate(prompts, 8, temperature=0.0, stop_token_ids=[])
    assert [s.token_ids for s in after] == [s.token_ids for s in want] != [s.token_ids for s in before]
    # (3) a write through .data is invisible to torch's version counter: reset_cache() is the way out
    v1 = weights_version(shared)
    with torch.no_grad():
        next(shared.parameters()).data.mul_(2.0)
    assert weights_version(shared) == v1 and len(eng.store.seqs) > 0
    eng.reset_cache()
    assert len(eng.store.seqs) == 0 and eng.store.nbytes == 0
    eng.generate(prompts, 8, temperature=0.0, stop_token_ids=[])
    eng.sleep()  # what the trainer calls after a rollout: frees the store
    assert len(eng.store.seqs) == 0 and eng.store.nbytes == 0


def test_store_stays_within_its_budget(tiny):
    _, model, tok = tiny
    per_token = 2 * 2 * 1 * 64 * 4  # K and V x 2 layers x 1 key/value head x head size 64 x float32
    prompts = make_prompts(tok, n=8, seed=3)
    budget = 200 * per_token
    free, tight = HFEngine(model, tok), HFEngine(model, tok, cache_gib=budget / 2**30)
    out = conversation_turns(tight, tok, prompts, turns=2)
    ref = conversation_turns(free, tok, prompts, turns=2)
    assert free.store.nbytes > 2 * budget  # what the turns produce: more than twice the budget ...
    assert 0 < tight.store.nbytes <= budget  # ... of which the tight store keeps what fits
    assert len(tight.store.seqs) < len(free.store.seqs)
    assert all(s.keys[0].shape == (1, len(s.tokens), 64) for s in tight.store.seqs.values())
    assert tight.store.nbytes == sum(s.nbytes for s in tight.store.seqs.values()) == len(
        np.concatenate([s.tokens for s in tight.store.seqs.values()])) * per_token
    assert [[s.token_ids for s in t] for t, _, _ in out] == [[s.token_ids for s in t] for t, _, _ in ref]


def test_factory_errors(tiny, tmp_path):
    d, model, tok = tiny
    assert isinstance(make_engine("hf", model, tok), HFEngine)
    with pytest.raises(ValueError, match="unknown engine"):
        make_engine("sglang", model, tok)
    # a head_dim the CPU kernel rejects is caught before vLLM starts, in one line
    build_tiny(tmp_path, vocab_size=600, hidden=64, layers=1, heads=4, kv_heads=4, head_dim=16, intermediate=64)
    with pytest.raises(ValueError, match="head_dim 16"):
        check_vllm_model(tmp_path, on_cpu=True)
    check_vllm_model(d, on_cpu=True)  # head_dim 64 passes
