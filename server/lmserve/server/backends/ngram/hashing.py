"""A hash table of exact 64-bit keys held in numpy arrays, built and probed vectorised.

KenLM's fastest structure (`lm/search_hashed.cc`, "probing") is a linear-probing hash table keyed
by a hash of the n-gram. Ours keys exact integers instead: an n-gram's key is
`(index of its (n-1)-word prefix) << 32 | last word id`, so nothing is lost to collisions.

Probing many keys at once with linear probing costs one numpy round per probe step, and the
longest cluster sets the number of rounds (30-45 at load 1/2 on the KJV 5-gram). So the table is
laid out as buckets instead: keys sorted by home bucket, plus `bucket_start` (CSR over buckets).
With two buckets per key on average a bucket holds 0.5 keys, so one vectorised gather of a
key's first slot resolves ~80% of hits and ~90% of misses (a miss needs no walk to an empty
slot: the bucket's end says where to stop); one 2-D gather of the next `max_bucket - 1` slots
finishes the rest. Every lookup takes at most two rounds.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing: spreads sequential keys
_SHIFT32 = np.uint64(32)
BUCKETS_PER_KEY = 2.0
EMPTY = np.uint64(0xFFFFFFFFFFFFFFFF)  # never a key: prefix indices stay below 2**32 - 1

U64 = npt.NDArray[np.uint64]
I32 = npt.NDArray[np.int32]
I64 = npt.NDArray[np.int64]


def make_keys(prefix: npt.NDArray[np.integer], word: npt.NDArray[np.integer]) -> U64:
    """The exact key of an n-gram from its prefix's index and its last word."""
    return (prefix.astype(np.uint64) << _SHIFT32) | word.astype(np.uint64)


def home_buckets(keys: U64, n_buckets: int) -> I64:
    """Maps keys to [0, n_buckets): multiply-shift hash, then a multiply-high range reduction."""
    mixed = (keys * _MULTIPLIER) >> _SHIFT32
    return ((mixed * np.uint64(n_buckets)) >> _SHIFT32).astype(np.int64)


class HashTable:
    """Distinct uint64 keys -> int32 values (their positions in the key array it was built from).

    >>> t = HashTable.build(np.array([7, 3, 11], dtype=np.uint64))
    >>> t.lookup(np.array([11, 5], dtype=np.uint64)).tolist()
    [2, -1]
    """

    __slots__ = ("keys", "vals", "bucket_start", "max_bucket", "_n_buckets")

    def __init__(self, keys: U64, vals: I32, bucket_start: I64, max_bucket: int) -> None:
        self.keys, self.vals, self.bucket_start = keys, vals, bucket_start
        self.max_bucket = max_bucket
        self._n_buckets = len(bucket_start) - 1

    @classmethod
    def build(cls, keys: U64) -> HashTable:
        n_buckets = max(1, int(len(keys) * BUCKETS_PER_KEY))
        home = home_buckets(keys, n_buckets)
        order = np.argsort(home, kind="stable")
        per_bucket = np.bincount(home, minlength=n_buckets)
        bucket_start = np.zeros(n_buckets + 1, dtype=np.int64)
        np.cumsum(per_bucket, out=bucket_start[1:])
        max_bucket = int(per_bucket.max()) if len(keys) else 0
        # Padding past the end: a probe window may run over it without a bounds check.
        pad = max(max_bucket, 1)
        slot_keys = np.concatenate([keys[order], np.full(pad, EMPTY, dtype=np.uint64)])
        slot_vals = np.concatenate([order.astype(np.int32), np.full(pad, -1, dtype=np.int32)])
        return cls(slot_keys, slot_vals, bucket_start, max_bucket)

    def lookup(self, keys: U64) -> I32:
        """Values for `keys`, -1 where a key is absent."""
        if len(keys) == 0:
            return np.full(0, -1, dtype=np.int32)
        bucket = home_buckets(keys, self._n_buckets)
        lo = self.bucket_start[bucket]
        # Round 1: each key against its bucket's first slot. No bounds or bucket checks are
        # needed: a slot of another bucket never holds an equal key, and the end is padded.
        miss = self.keys[lo] != keys
        out = self.vals[lo]
        out[miss] = -1
        bucket += 1
        rest = np.flatnonzero(miss & (self.bucket_start[bucket] - lo > 1))
        if len(rest):  # Round 2: the rest of the few crowded buckets, in one 2-D gather.
            slot = lo[rest, None] + np.arange(1, self.max_bucket, dtype=np.int64)
            match = self.keys[slot] == keys[rest, None]
            found = match.any(axis=1)
            where = slot[np.arange(len(rest)), match.argmax(axis=1)]
            out[rest[found]] = self.vals[where[found]]
        return out

    def get(self, key: int) -> int:
        """One key, in plain Python (for the few words of a context)."""
        bucket = int(home_buckets(np.array([key], dtype=np.uint64), self._n_buckets)[0])
        lo, hi = int(self.bucket_start[bucket]), int(self.bucket_start[bucket + 1])
        k = np.uint64(key)
        for slot in range(lo, hi):
            if self.keys[slot] == k:
                return int(self.vals[slot])
        return -1
