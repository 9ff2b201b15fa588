"""The keys/values a multi-turn rollout reuses: after each turn, every conversation's keys/values
are kept, so the next turn of that conversation runs only what was appended (a tool result or a user
message).

    CachedSeq        the keys/values computed for one token sequence, layer by layer
    KVStore          a bounded LRU of them, looked up by the longest common prefix with a new prompt
    weights_version  changes whenever the weights do (hf_engine.HFEngine then empties the store: it is stale)
    BufferLayer      one layer's keys/values during one generate() call, in a buffer written in place

    python -m plumbing.kv_store   # a store of three conversations, looked up by prefix
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch
from transformers.cache_utils import DynamicLayer


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
# Demo: python -m plumbing.kv_store

if __name__ == "__main__":
    def seq(tokens, H=2, D=4):  # fake keys/values: one layer, token t's key = t
        keys = [torch.tensor(tokens, dtype=torch.float32)[None, :, None].expand(H, -1, D).clone()]
        return CachedSeq(np.asarray(tokens, dtype=np.int64), keys, [k.clone() for k in keys])

    store = KVStore(max_bytes=10_000)
    system = [1, 2, 3, 4]  # a system prompt every conversation shares
    first = seq(system + [10, 11, 12])
    store.put(first)
    store.put(seq(system + [20, 21]))
    found, m = store.longest_prefix(np.asarray(system + [10, 11, 12, 13, 14]))
    print(f"turn 2 of conversation 1: {m} of 9 tokens reused from {found.tokens.tolist()}")
    store.put(seq(system + [10, 11, 12, 13]), parent=first)  # it extends turn 1, which is dropped
    print(f"entries: {[s.tokens.tolist() for s in store.seqs.values()]}, {store.nbytes} bytes")
    print(f"a new conversation: {store.longest_prefix(np.asarray(system + [30]))[1]} tokens (the system prompt) reused")
