"""HFEngine: batched sampling with a transformers model, keeping each conversation's keys/values
across turns.

    CachedSeq        the keys/values computed for one token sequence, layer by layer
    KVStore          a bounded LRU of them, looked up by the longest common prefix with a new prompt
    weights_version  changes whenever the weights do (HFEngine then empties the store: it is stale)
    BufferLayer      one layer's keys/values during one generate() call, in a buffer written in place
    HFEngine         the decode loop over them

engine.py states the contract and holds ReferenceEngine, the same loop one prompt at a time: read it
first. Here it is made fast, and stays exact: greedy outputs equal a full re-prefill
(tests/test_engine.py).

Symbols: B = prompts in a batch, c_i = tokens of prompt i whose keys/values are reused (stored or
shared), C = max c_i, r_i = the rest of prompt i (run in this call), R = max r_i, H = key/value
heads, D = head size, V = vocab.
"""

from __future__ import annotations

import math
import os
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from transformers import AttentionInterface, DynamicCache
from transformers.cache_utils import DynamicLayer
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from plumbing.sampling import Sample, default_stop_ids, prompt_seeds, sample_step


# --------------------------------------------------------------------------------------------------
# The store: each conversation's keys/values, kept between turns, so the next turn runs only what was
# appended (a tool result or a customer message)


def weights_version(model) -> tuple:
    """Changes whenever a parameter is changed in place (torch's `_version`: an optimizer step,
    copy_, load_state_dict) or replaced (a new address); not on writes through `p.data` (its own
    counter): call reset_cache() after those."""
    return tuple((p.data_ptr(), p._version) for p in model.parameters())


@dataclass
class CachedSeq:
    tokens: np.ndarray  # (n,) int64: the sequence an earlier call computed keys/values for
    keys: list[torch.Tensor]  # keys[l]: layer l's, (H, n, D) (H = key/value heads, D = head size)
    values: list[torch.Tensor]  # values[l]: likewise

    def __post_init__(self):
        self.key = self.tokens.tobytes()  # the store's dict key: equal token sequences are one entry
        self.nbytes = sum(t.numel() * t.element_size() for t in self.keys + self.values)


class KVStore:
    """After each call: every row's prompt + sampled tokens but the last (sampled, never fed: no
    keys/values). The episode's next prompt is that + the last sampled token + a delta, so the next
    call prefills only the delta. An entry's first m tokens serve any prompt starting with them
    (causal attention: G episodes of a task share a first prompt, a domain's episodes the system
    prompt). Beyond `max_bytes` the least recently used go; an entry a newer one extends goes at
    once: a conversation holds one entry, not one a turn."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.seqs: OrderedDict[bytes, CachedSeq] = OrderedDict()  # least recently used first
        self.nbytes = 0

    def longest_prefix(self, tokens: np.ndarray) -> tuple[CachedSeq | None, int]:
        """(entry, m): the entry sharing the longest prefix with `tokens`, and that length (0:
        none)."""
        best, best_m = None, 0
        for seq in self.seqs.values():  # tens of entries (one per live conversation): a scan is cheap enough
            n = min(len(tokens), len(seq.tokens))
            diff = np.flatnonzero(tokens[:n] != seq.tokens[:n])  # positions where they differ
            m = int(diff[0]) if diff.size else n
            if m > best_m:
                best, best_m = seq, m
        if best is not None:
            self.seqs.move_to_end(best.key)  # recently used
        return best, best_m

    def put(self, seq: CachedSeq, parent: CachedSeq | None = None) -> None:
        """Keep `seq`; drop `parent` if `seq` extends it; evict the least recently used beyond
        max_bytes."""
        if seq.nbytes > self.max_bytes:
            return  # bigger than the whole budget (or the store is off: max_bytes 0)
        if seq.key in self.seqs:
            self.seqs.move_to_end(seq.key)  # the same tokens again (e.g. G identical greedy rows)
        else:
            self.seqs[seq.key] = seq
            self.nbytes += seq.nbytes
        p = parent  # dropped if seq extends it (a p longer than seq fails array_equal: the shapes differ)
        if p is not None and p.key != seq.key and np.array_equal(seq.tokens[: len(p.tokens)], p.tokens):
            self.discard(p)
        while self.nbytes > self.max_bytes:
            self.discard(next(iter(self.seqs.values())))

    def discard(self, seq: CachedSeq) -> None:
        if self.seqs.pop(seq.key, None) is not None:
            self.nbytes -= seq.nbytes

    def clear(self) -> None:
        self.seqs.clear()
        self.nbytes = 0


class BufferLayer(DynamicLayer):
    """One layer's keys/values in a buffer for the cached tokens, prompt rests and decode budget.
    DynamicLayer's torch.cat copies the whole cache every step (a third of a CPU decode step here);
    here each forward writes its columns in place and the filled part is exposed as a view, an
    ordinary DynamicLayer to transformers."""

    def __init__(self, k_buf: torch.Tensor, v_buf: torch.Tensor, n: int, start: int = 0):
        super().__init__()
        self.lazy_initialization(k_buf, v_buf)  # dtype, device, is_initialized
        self._k, self._v = k_buf, v_buf  # (B, H, capacity, D)
        self.end = n
        self.skip_padding(start)  # self.keys, self.values: views of the filled columns

    def skip_padding(self, start: int) -> None:
        """Show the model columns start .. end - 1 (no row has a real one before start), (B, H, end
        - start, D)."""
        self.start = start
        self.keys, self.values = self._k[:, :, start : self.end], self._v[:, :, start : self.end]

    def update(self, key_states, value_states, *args, **kwargs):
        n, k = self.end, key_states.shape[-2]
        self._k[:, :, n : n + k] = key_states  # a full buffer is a shape error here, never a silent copy
        self._v[:, :, n : n + k] = value_states
        self.end = n + k
        self.skip_padding(self.start)  # the views, over the grown columns
        return self.keys, self.values

    def move_rows(self, holes: list[int], movers: list[int], b: int) -> None:
        """Rows leave the batch: row movers[i] is copied into the slot holes[i] (its filled columns
        only), then the batch is cut to its first b rows, a view. One row's copy per departure, not
        a copy of the whole cache."""
        self._k[holes, :, : self.end] = self._k[movers, :, : self.end]  # holes < b <= movers: no overlap
        self._v[holes, :, : self.end] = self._v[movers, :, : self.end]
        self._k, self._v = self._k[:b], self._v[:b]  # (b, H, capacity, D)
        self.skip_padding(self.start)

    def copy_row(self, j: int, spans: list[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Row j's keys and values in the buffer columns [a, b) of each span, in order: a copy, (H,
        n, D) each."""
        return tuple(torch.cat([buf[j][:, a:b] for a, b in spans], dim=1) for buf in (self._k, self._v))  # (H, n, D)


# --------------------------------------------------------------------------------------------------
# The transformers engine: a hand-written decode loop over a KV cache


def common_prefix_len(seqs: list[list[int]]) -> int:
    """Length of the longest prefix all sequences share (os.path.commonprefix compares any
    sequences)."""
    return len(os.path.commonprefix(seqs))


GQA_SDPA = "muarl_sdpa_gqa"


def sdpa_gqa_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """transformers' "sdpa" attention minus a copy. With grouped-query attention (Hq query heads
    share Hkv key/value heads, G = Hq / Hkv) and a mask, transformers copies each key/value head G
    times (repeat_kv: on CUDA, SDPA's fast kernels take no mask with enable_gqa); on a CPU torch's
    SDPA takes both. In a decode step the G query heads of a key/value head become G queries of one
    head: each key/value is read once (equal up to rounding, ~1e-7)."""
    B, Hq, q, D = query.shape  # key, value: (B, Hkv, k, D)
    Hkv = key.shape[1]
    if q == 1 and Hq != Hkv:  # decode: fold the groups into the query axis; the mask (B, 1, 1, k) broadcasts
        out = F.scaled_dot_product_attention(query.view(B, Hkv, Hq // Hkv, D), key, value,
                                             attn_mask=attention_mask, scale=scaling)  # (B, Hkv, G, D)
        return out.reshape(B, 1, Hq, D), None  # query head h = kv head h // G, as in repeat_kv
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, scale=scaling,  # (B, Hq, q, D)
                                         is_causal=attention_mask is None and q > 1,  # no mask: unpadded prefill
                                         enable_gqa=Hq != Hkv)
    return out.transpose(1, 2).contiguous(), None  # (B, q, Hq, D), no attention weights


class HFEngine:
    """Why not `model.generate`? We need each token's log-prob under the exact distribution it was
    drawn from, finished rows to stop costing compute, and the next turn to start from this turn's
    keys/values. A short loop does all three. Its phases, and what each device buys on a CPU (demo
    model size, 1 thread; bench/bench_rollout.py):

      lookup    each prompt's longest prefix in the store (KVStore: what earlier calls computed). On the synthetic
                workload, 200,314 of 228,946 prompt tokens came from the store instead of a prefill
      prefix    if several rows lack it, the prefix all prompts share (the system prompt) is computed once
      prefill   the rest of each prompt, right-aligned:  [ pad (C - c_i) | cached c_i ][ pad (R - r_i) | rest r_i ]
                attention_mask marks real columns and position_ids count real tokens only, so a
                padded row computes exactly what it would alone. Rows of similar rest length run as
                one forward (on slices of the same buffers): a short user message is not padded to a
                long tool result
      decode    one token per row per step, all rows in one forward: ~1.5 ms for one row (mostly transformers'
                fixed work per forward) + ~0.2 ms per extra row; the cache grows in place
                (BufferLayer). On a CPU, sdpa_gqa_attention: ~30 % faster attention (the repeat_kv
                copy it avoids was a third of a step). A ready-made padding mask, all-padding
                columns hidden: within noise (3.87x with them, 3.85x before)
      finish    a row that sampled a stop token (kept, with its log-prob) or used its budget stores its real
                keys/values and leaves the batch at once (the last unfinished row moves into its
                slot)

    Altogether, 32 episodes advanced together run 6.13x the episodes per second of one at a time on
    the shop world, 3.87x on the synthetic one (~1,000-token contexts make each row dearer). Not
    measured alone: the shared prefix, the prefill groups, rows leaving the batch, BufferLayer.

    The store is valid only for the weights that filled it: it is emptied when `weights_version`
    changes, on `sleep()` (after each rollout, freeing memory for the update) and `reset_cache()`;
    `cache_gib` bounds it (0: no reuse). With the trainer's own `model`, `update_weights` copies
    nothing (it checks); give it a copy to mimic a separate engine.
    """

    def __init__(self, model, tokenizer=None, stop_token_ids: list[int] | None = None, min_shared_prefix: int = 16,
                 cache_gib: float = 2.0):
        AttentionInterface.register(GQA_SDPA, sdpa_gqa_attention)  # for generate(); here, not on import (idempotent)
        AttentionMaskInterface.register(GQA_SDPA, sdpa_mask)  # the same boolean masks as "sdpa"
        self.model = model
        self.min_shared_prefix = min_shared_prefix  # shorter common prefixes are not worth a separate forward
        self.stop_token_ids = stop_token_ids if stop_token_ids is not None else default_stop_ids(tokenizer, model)
        self.pad_id = getattr(tokenizer, "pad_token_id", None) or 0  # any id works: padded positions are masked out
        self.store = KVStore(int(cache_gib * 2**30))
        self._version = None  # weights_version(model) when the store was filled
        self.stats = Counter()  # tokens and seconds, per phase, summed over calls (bench/bench_rollout.py prints them)

    def reset_cache(self) -> None:
        """Forget every stored key/value (call after changing the weights in a way torch does not
        version)."""
        self.store.clear()

    def generate(self, prompts: list[list[int]], max_new_tokens: int, temperature: float = 1.0, top_p: float = 1.0,
                 stop_token_ids: list[int] | None = None, seed: int | list[int] | None = None) -> list[Sample]:
        if any(len(p) == 0 for p in prompts):
            raise ValueError("HFEngine.generate: every prompt needs at least one token")
        stop = set(self.stop_token_ids if stop_token_ids is None else stop_token_ids)
        # One generator per prompt (sampling.prompt_seeds), as in ReferenceEngine: a prompt's draws do
        # not depend on its batch or on what the store held.
        gens = [torch.Generator().manual_seed(s) for s in prompt_seeds(seed, len(prompts))]
        version = weights_version(self.model)
        if version != self._version:  # new weights: what the store holds was computed with the old ones
            self.store.clear()
            self._version = version
        was_training = self.model.training
        self.model.eval()  # no dropout while sampling; restored after, since the trainer may share this model
        gqa = self.model.device.type == "cpu" and self.model.config._attn_implementation == "sdpa"
        if gqa:
            self.model.set_attn_implementation(GQA_SDPA)  # see sdpa_gqa_attention; restored below
        try:  # our attention function takes the decode mask ready-made (4D); other implementations get a 2D one
            return self._sample(prompts, max_new_tokens, temperature, top_p, stop, gens, mask_4d=gqa)
        finally:
            if gqa:
                self.model.set_attn_implementation("sdpa")
            self.model.train(was_training)

    # -- the phases of one call, in order
    # ------------------------------------------------------------------------

    def _lookup(self, tokens: list[int]) -> tuple[CachedSeq | None, int]:
        seq, m = self.store.longest_prefix(np.asarray(tokens, dtype=np.int64))
        m = min(m, len(tokens) - 1)  # keep one token to run: its logits start the decoding
        return (seq, m) if m > 0 else (None, 0)

    def _share_prefix(self, prompts, hits):
        """Compute the prefix all prompts share once, if two or more rows would otherwise each
        compute it."""
        P = min(common_prefix_len(prompts), min(len(p) for p in prompts) - 1) if len(prompts) > 1 else 0
        short = [i for i, (_, m) in enumerate(hits) if m < P]
        if P < self.min_shared_prefix or len(short) < 2:
            return hits
        prefix = prompts[0][:P]
        hit = self._lookup(prefix)  # the prefix itself may be partly stored (the system prompt, from an earlier call)
        cache, mask, _ = self._prefill([prefix], [hit], reserve=0)
        seq = self._cut(cache, mask, 0, prefix)
        self.store.put(seq, parent=hit[0])
        return [(seq, P) if i in short else h for i, h in enumerate(hits)]

    def _kv_shape(self) -> tuple[int, int, torch.dtype]:
        cfg = self.model.config
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        return cfg.num_key_value_heads, head_dim, next(self.model.parameters()).dtype

    def _new_cache(self, bufs, n: int, start: int = 0) -> DynamicCache:
        """A cache over bufs[l] = (keys, values) (b, H, capacity, D), written in place; the model
        sees start .. n-1."""
        cache = DynamicCache(config=self.model.config)
        cache.layers = [BufferLayer(k, v, n, start) for k, v in bufs]
        return cache

    def _prefill(self, prompts, hits, reserve: int, groups=None):
        """Lay out the cached keys/values, run the rest of every prompt: (cache, mask, last token's
        logits (B, V)). `groups`: ranges of rows run as separate forwards (padding a 20-token rest
        to 400 would cost 20x)."""
        dev, B = self.model.device, len(prompts)
        groups = groups or [(0, B)]
        t0 = time.perf_counter()
        c = torch.tensor([m for _, m in hits], device=dev)  # (B,) cached tokens per row
        r = [len(p) - m for p, (_, m) in zip(prompts, hits)]  # rest per row, >= 1: every row runs a token
        C, R = int(c.max()), max(r)
        H, D, dtype = self._kv_shape()
        # One buffer per layer for the whole call: [cached C | rest R | decode budget]. Padding
        # columns are masked out but must hold zeros, not garbage: a masked weight is 0, and 0 * NaN
        # would still be NaN.
        bufs = []
        for li in range(self.model.config.num_hidden_layers):
            k, v = (torch.empty(B, H, C + R + reserve, D, dtype=dtype, device=dev) for _ in range(2))  # (B, H, *, D)
            k[:, :, C : C + R], v[:, :, C : C + R] = 0, 0  # rests and the gaps before them (forwards fill the rests)
            for i, (s, m) in enumerate(hits):  # right-aligned: row i's cached tokens end at column C
                k[i, :, : C - m], v[i, :, : C - m] = 0, 0
                if m:
                    k[i, :, C - m : C], v[i, :, C - m : C] = s.keys[li][:, :m], s.values[li][:, :m]
            bufs.append((k, v))
        cached = (torch.arange(C, device=dev) >= C - c[:, None]).long()  # (B, C) 1 = a reused column
        t1 = time.perf_counter()
        masks, logits = [], []
        for a, b in groups:
            # rows a..b-1 run together on their slice of the buffers (a view: what they write lands
            # in place). Their rest is right-aligned at column C + R, so after all groups every row
            # ends at the same column.
            Rg = max(r[a:b])
            ids = torch.full((b - a, Rg), self.pad_id, dtype=torch.long, device=dev)  # (b, Rg)
            own = torch.zeros((b - a, Rg), dtype=torch.long, device=dev)  # (b, Rg) 1 = a real token of the rest
            for j, (p, (_, m)) in enumerate(zip(prompts[a:b], hits[a:b])):
                ids[j, Rg - (len(p) - m) :] = torch.tensor(p[m:], dtype=torch.long)
                own[j, Rg - (len(p) - m) :] = 1
            gap = own.new_zeros(b - a, R - Rg)  # (b, R - Rg) columns no row of this group uses
            mask = torch.cat([cached[a:b], gap, own], dim=1)  # (b, C + R) 1 = a token this row attends to
            pos = c[a:b, None] + (own.cumsum(-1) - 1).clamp(min=0)  # (b, Rg) each token's position in its prompt
            S = C - int(c[a:b].max())  # columns 0 .. S - 1 are padding for every row here: the model sees S on
            view = self._new_cache([(k[a:b], v[a:b]) for k, v in bufs], C + R - Rg, S)
            logits.append(self.model(input_ids=ids, attention_mask=mask[:, S:], position_ids=pos, use_cache=True,
                                     past_key_values=view, logits_to_keep=1).logits[:, -1])  # (b, V): last only
            masks.append(mask)
            self.stats.update(prefill_tokens=int(own.sum()), prefill_padded=own.numel())  # Counter.update adds
        self.stats.update(store_s=t1 - t0, prefill_s=time.perf_counter() - t1)
        return self._new_cache(bufs, C + R), torch.cat(masks), torch.cat(logits)  # (B, C + R), (B, V)

    @staticmethod
    def _layout(cache, attends: torch.Tensor, n: int) -> tuple[int, bool]:
        """Before a decode step: (start, padded). The cache hides the columns before start: padding
        in every row."""
        start = int(attends[:, :n].any(0).long().argmax())  # the first column some row attends to
        for layer in cache.layers:
            layer.skip_padding(start)
        return start, not bool(attends[:, start:n].all())  # padded: some row still has padding

    def _cut(self, cache, mask, j: int, tokens: list[int]) -> CachedSeq:
        """Row j's keys/values, real columns only (a copy: the batch's buffers are freed after the
        call)."""
        cols = mask[j].nonzero()[:, 0]  # (n,) the columns row j attends to, in order
        assert len(cols) == len(tokens), "every real column is one token of the row's sequence"
        # They form a few contiguous spans (cached | rest | sampled): copying span by span is ~5x
        # faster than indexing.
        cut = (torch.nonzero(cols[1:] - cols[:-1] != 1)[:, 0] + 1).tolist()  # where a new span starts
        spans = [(int(cols[a]), int(cols[b - 1]) + 1) for a, b in zip([0] + cut, cut + [len(cols)])]
        kv = [layer.copy_row(j, spans) for layer in cache.layers]  # per layer: keys, values (H, n, D) each
        return CachedSeq(np.asarray(tokens, dtype=np.int64), [k for k, _ in kv], [v for _, v in kv])

    def _keep(self, cache, mask, js, rows, prompts, samples, hits) -> None:
        """Store the sequences of live rows js: prompt + sampled tokens but the last (sampled, never
        fed)."""
        if self.store.max_bytes == 0:
            return
        t0 = time.perf_counter()
        for j in js:
            i = rows[j]
            self.store.put(self._cut(cache, mask, j, prompts[i] + samples[i].token_ids[:-1]), parent=hits[i][0])
        self.stats["store_s"] += time.perf_counter() - t0

    @torch.no_grad()
    def _sample(self, prompts, max_new_tokens, temperature, top_p, stop, gens, mask_4d: bool) -> list[Sample]:
        samples = [Sample() for _ in prompts]
        if not prompts or max_new_tokens <= 0:
            return samples
        uniforms = torch.stack([torch.rand(max_new_tokens, dtype=torch.float64, generator=g) for g in gens])  # (B, N)
        uniforms = uniforms.to(self.model.device)  # uniforms[i, t]: prompt i's draw for its t-th token
        t0 = time.perf_counter()
        # 1. what earlier calls computed, then 2. the prefix shared within this call
        hits = [self._lookup(p) for p in prompts]  # (CachedSeq | None, cached tokens) per prompt
        self.stats["store_s"] += time.perf_counter() - t0
        self.stats.update(reused_tokens=sum(m for _, m in hits), prompt_tokens=sum(map(len, prompts)))  # adds
        hits = self._share_prefix(prompts, hits)
        # 3. prefill, rows ordered by rest length, longest first; rests within a factor sqrt(2) (or
        #    all under ~45 tokens) run as one group: <= ~1.4x padding, for a few more forwards (each
        #    costs about 30-50 tokens here)
        rest = [len(p) - m for p, (_, m) in zip(prompts, hits)]
        rows = sorted(range(len(prompts)), key=lambda i: -rest[i])  # rows[j] = the prompt batch row j samples for
        size = [int(2 * math.log2(max(rest[i], 32))) for i in rows]  # rests within a factor sqrt(2) share a size
        groups = [(j, j + size.count(z)) for j, z in enumerate(size) if j == 0 or size[j - 1] != z]
        cache, mask, logits = self._prefill([prompts[i] for i in rows], [hits[i] for i in rows], max_new_tokens, groups)
        next_pos = mask.sum(-1)  # (B,) position of the token about to be sampled
        # Decode masks with room for the budget (a step marks one more column). attends: 1 = a real
        # column (what _cut keeps); bias = log(mask), 0 / -inf, what SDPA adds to the scores: a view
        # of it, not a mask rebuilt per layer.
        n = mask.shape[1]
        attends = F.pad(mask.bool(), (0, max_new_tokens))  # (B, capacity)
        bias = F.pad(mask.to(self._kv_shape()[2]).log(), (0, max_new_tokens))  # (B, capacity)
        start, padded = self._layout(cache, attends, n)

        # 4. decode: every row in the batch is still sampling (finished rows leave at once, below)
        t1 = time.perf_counter()
        for step in range(max_new_tokens):
            tok, lp = sample_step(logits, temperature, top_p, u=uniforms[rows, step])  # (b,) each
            done = []  # batch rows that sampled a stop token this step
            for j, (t, l) in enumerate(zip(tok.tolist(), lp.tolist())):
                s = samples[rows[j]]
                s.token_ids.append(t)
                s.logprobs.append(l)
                if t in stop:
                    s.finish_reason = "stop"
                    done.append(j)
            self._keep(cache, attends[:, :n], done, rows, prompts, samples, hits)  # finished rows, while valid
            if len(done) == len(rows) or step == max_new_tokens - 1:
                break  # all finished; or the budget is used and finish_reason stays "length" for rows still going
            if done:
                # Finished rows leave now: the last rows still sampling move into their slots (one row's
                # copy each with BufferLayer.move_rows, not the whole cache), and every tensor with a
                # batch dimension follows.
                b, finished = len(rows) - len(done), set(done)
                holes = [j for j in done if j < b]  # finished rows among the first b
                movers = [j for j in range(b, len(rows)) if j not in finished]  # rows still sampling beyond them
                keep = [dict(zip(holes, movers)).get(j, j) for j in range(b)]  # keep[new row] = old row
                for layer in cache.layers:
                    layer.move_rows(holes, movers, b)
                tok, next_pos, attends, bias = tok[keep], next_pos[keep], attends[keep], bias[keep]
                rows = [rows[j] for j in keep]
                start, padded = self._layout(cache, attends, n)
            attends[:, n] = True  # the column the token fed now writes (bias is already 0 there)
            n += 1
            # 4D (b, 1, 1, n - start) for our attention; 2D (b, n - start): transformers builds what
            # its attention needs
            mask = (bias[:, None, None, start:n] if mask_4d else attends[:, start:n]) if padded else None
            logits = self.model(input_ids=tok[:, None], attention_mask=mask, position_ids=next_pos[:, None],
                                past_key_values=cache, use_cache=True).logits[:, -1]  # (b, V)
            next_pos = next_pos + 1
            # decode_columns: the keys/values attention read, padding included
            self.stats.update(decode_steps=1, decode_row_steps=len(rows), decode_columns=len(rows) * (n - start))
        self.stats.update(decode_s=time.perf_counter() - t1, calls=1)
        # 5. the rows still sampling at the end
        self._keep(cache, attends[:, :n], [j for j in range(len(rows)) if j not in done], rows, prompts, samples, hits)
        return samples

    @torch.no_grad()
    def update_weights(self, named_tensors) -> None:
        """Copy (name, tensor) pairs into the model; tensors that already *are* its parameters
        (shared) are skipped."""
        params = {**dict(self.model.named_parameters(remove_duplicate=False)), **dict(self.model.named_buffers())}
        for name, t in named_tensors:
            if name not in params:
                raise KeyError(f"update_weights: the engine's model has no tensor named {name!r}")
            if params[name].data_ptr() != t.data_ptr():
                params[name].copy_(t)  # casts dtype / moves device as needed
                self.reset_cache()  # (weights_version would notice too: copy_ bumps the version)

    sleep = reset_cache  # the trainer calls it after a rollout: the weights change next, the update needs the memory

    def wake_up(self) -> None:  # same surface as VLLMEngine; nothing to restore
        pass


# --------------------------------------------------------------------------------------------------
# Demo: python -m plumbing.hf_engine MODEL_FOLDER — a second turn reuses the first one's keys/values

if __name__ == "__main__":
    import sys

    from plumbing.models import load_policy

    if len(sys.argv) != 2:
        sys.exit("usage: python -m plumbing.hf_engine MODEL_FOLDER (a small chat model; to build one: "
                 "python -m demo.tiny_model /tmp/tiny)")
    model, tok = load_policy(sys.argv[1])
    hf = HFEngine(model, tok)
    turn = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"  # a user turn in Qwen's chat markup
    prompts = [tok.encode(turn.format(text)) for text in ("Cancel order #W1234567, please.", "Hello")]
    first = hf.generate(prompts, max_new_tokens=12, temperature=1.0, seed=0)
    # A second turn, as rollout.py makes it: prompt + what was sampled + a delta. Only the delta runs.
    delta = tok.encode("<|im_end|>\n<|im_start|>user\nYes, go ahead.<|im_end|>\n<|im_start|>assistant\n")
    hf.stats.clear()  # count turn 2 only
    hf.generate([p + s.token_ids + delta for p, s in zip(prompts, first)], max_new_tokens=12, seed=1)
    print(f"turn 2: {hf.stats['prompt_tokens']} prompt tokens, {hf.stats['reused_tokens']} reused from turn 1, "
          f"{hf.stats['prefill_tokens']} run; store: {len(hf.store.seqs)} sequences, {hf.store.nbytes / 2**20:.1f} MiB")
