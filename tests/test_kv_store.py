"""plumbing/hf_engine.py: KVStore's prefix lookup, supersession and LRU on dummy keys/values (no model). How HFEngine uses
the store, against a full re-prefill: tests/test_engine.py."""

import numpy as np
import torch

from plumbing.hf_engine import CachedSeq, KVStore


def kv(tokens, width=1):
    """A CachedSeq with dummy keys/values: 2 layers x (1 head, n tokens, `width` dims) of float32."""
    n = len(tokens)
    t = [torch.zeros(1, n, width) for _ in range(2)]
    return CachedSeq(np.array(tokens, dtype=np.int64), t, [x.clone() for x in t])


def test_kvstore_prefix_lookup_supersession_and_lru():
    store = KVStore(max_bytes=10**6)
    a, b = kv([1, 2, 3, 4]), kv([1, 2, 7])
    store.put(a)
    store.put(b)
    assert store.longest_prefix(np.array([1, 2, 3, 9])) == (a, 3)  # longest common prefix, not whole entries
    assert store.longest_prefix(np.array([1, 2, 7, 7, 7]))[1] == 3
    assert store.longest_prefix(np.array([5, 1, 2])) == (None, 0)
    c = kv([1, 2, 3, 4, 5, 6])
    store.put(c, parent=a)  # c extends a: a can never answer better than c, so it goes
    assert list(store.seqs.values()) == [b, c]
    store.put(kv([1, 2, 7, 8]), parent=c)  # not an extension of c: c stays
    assert len(store.seqs) == 3
    store.put(kv([1, 2, 7, 8]))  # the same tokens again: one entry
    assert len(store.seqs) == 3 and store.nbytes == sum(s.nbytes for s in store.seqs.values())
    # LRU under a byte budget: a lookup refreshes an entry, the least recently used goes first
    small = KVStore(max_bytes=3 * kv([0] * 10).nbytes)
    seqs = [kv([i] * 10) for i in range(3)]
    for s in seqs:
        small.put(s)
    small.longest_prefix(np.array([0] * 10))  # touch seqs[0]
    small.put(kv([3] * 10))
    assert set(small.seqs) == {seqs[0].key, seqs[2].key, kv([3] * 10).key}
    assert small.nbytes <= small.max_bytes
    small.put(kv([4] * 40))  # bigger than the whole budget: not kept
    assert kv([4] * 40).key not in small.seqs
