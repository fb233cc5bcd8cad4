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
_MULTIPLIER_INT = int(_MULTIPLIER)
_MASK64 = (1 << 64) - 1
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
        order = np.argsort(home)  # ties (same home) may go in any order
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


# -- the scoring table ---------------------------------------------------------------------------

# A context order's slot (orders 2..N-1): the exact key, then the entry's log-prob and backoff
# (natural logs). 16 bytes, so four slots share a 64-byte cache line and a lookup's key, prob
# and backoff arrive together.
SLOT_DTYPE = np.dtype([("key", "<u8"), ("prob", "<f4"), ("backoff", "<f4")])
# The highest order's slot: no backoff to keep, 12 bytes (packed: the key is not 8-aligned).
FINAL_SLOT_DTYPE = np.dtype([("key", "<u8"), ("prob", "<f4")])
# Slots per entry: load factor 1/1.5, KenLM's default `probing_multiplier`; so 24 bytes per
# context n-gram and 18 per highest-order one, KenLM's probing footprint.
SLOTS_PER_KEY = 1.5


def slot_dtype(final: bool) -> np.dtype[np.void]:
    """The slot layout of an order: the highest order's (`final`) keeps no backoff."""
    return FINAL_SLOT_DTYPE if final else SLOT_DTYPE


def home_slot(key: int, n_home: int) -> int:
    """`home_slots` of one key in plain integers: a single lookup pays no numpy call overhead
    (next-token distributions look up a few context words each)."""
    mixed = ((key * _MULTIPLIER_INT) & _MASK64) >> 32
    return (mixed * n_home) >> 32


def home_slots(keys: U64, n_home: int) -> I64:
    """A key's first slot: the same multiply-shift hash as the bucket tables (`home_buckets`)."""
    return home_buckets(keys, n_home)


class ProbingTable:
    """Open addressing with linear probing over slots `{key, prob[, backoff]}`.

    The table KenLM scores with (`lm/search_hashed.cc`, "probing"), holding exact keys: a key's
    home slot is `home_slots(key, n_home)` and its entry is in the first slot from there whose
    key is the key, before the first empty slot (key `EMPTY`). Probing runs forward only, never
    wrapping: slots past `n_home` are overflow, and the last slot is always empty, so every walk
    ends inside the array. The C side is `_probing.h`.
    """

    __slots__ = ("slots", "n_home", "_keys")

    def __init__(self, slots: npt.NDArray[np.void], n_home: int) -> None:
        if slots.dtype not in (SLOT_DTYPE, FINAL_SLOT_DTYPE) or slots.ndim != 1:
            raise ValueError("malformed probing table")
        if not 1 <= n_home < len(slots) or slots["key"][-1] != EMPTY:
            raise ValueError("probing table: the last slot must be empty, after the home slots")
        self.slots, self.n_home = slots, n_home
        self._keys: U64 = slots["key"]  # a strided view, made once

    @property
    def final(self) -> bool:
        """Whether this is the highest order's table (slots without backoff)."""
        return self.slots.dtype == FINAL_SLOT_DTYPE

    @property
    def n_entries(self) -> int:
        return int(np.count_nonzero(self._keys != EMPTY))

    @classmethod
    def build(
        cls,
        keys: U64,
        probs: npt.NDArray[np.float32],
        backoffs: npt.NDArray[np.float32] | None,
        slots_per_key: float = SLOTS_PER_KEY,
    ) -> tuple[ProbingTable, I64]:
        """Places distinct `keys` (entry i has key `keys[i]`), vectorised; returns the table and
        each entry's slot. `backoffs=None` makes the highest order's table.

        Linear probing without wrap-around, inserting in home order, puts the i-th key (sorted
        by home h) at `max over j <= i of (h_j + i - j)`: a running maximum, no loop.
        """
        n = len(keys)
        n_home = max(1, int(n * slots_per_key))
        home = home_slots(keys, n_home)
        order = np.argsort(home)  # ties (same home) may go in any order
        rank = np.arange(n, dtype=np.int64)
        place = np.empty(n, dtype=np.int64)
        if n:
            place[order] = np.maximum.accumulate(home[order] - rank) + rank
        n_slots = max(n_home, int(place.max()) + 1 if n else 0) + 1  # + the final empty slot
        if n_slots >= 2**32 - 1:
            raise ValueError("too many entries for 32-bit slot indices")
        slots = np.zeros(n_slots, dtype=slot_dtype(backoffs is None))
        slots["key"] = EMPTY
        slots["key"][place] = keys
        slots["prob"][place] = probs
        if backoffs is not None:
            slots["backoff"][place] = backoffs
        return cls(slots, n_home), place

    @property
    def raw(self) -> npt.NDArray[np.uint8]:
        """The slots as bytes: what the C kernel and the binary file take."""
        return self.slots.view(np.uint8)

    def lookup(self, keys: U64) -> I64:
        """Slots of `keys`, -1 where absent; one vectorised round per probe step.

        Each round checks the keys still walking against their current slot and drops those
        found or stopped at an empty slot, so rounds shrink fast (most keys end in round 1).
        """
        out = np.full(len(keys), -1, dtype=np.int64)
        if len(keys) == 0:
            return out
        slot_keys = self._keys
        slot = home_slots(keys, self.n_home)
        todo = np.arange(len(keys), dtype=np.int64)
        want = keys
        while len(todo):
            got = slot_keys[slot]
            hit = got == want
            out[todo[hit]] = slot[hit]
            walk = ~hit & (got != EMPTY)
            todo, slot, want = todo[walk], slot[walk] + 1, want[walk]
        return out

    # The lookups the model makes of any table (this one, or `compact.CompactTable`).
    def find(self, prefix: I64, word: I64) -> I64:
        """Slots of the entries (prefix slot, word), -1 where absent."""
        return self.lookup(make_keys(prefix, word))

    def get_entry(self, prefix: int, word: int) -> int:
        return self.get((prefix << 32) | word)

    def probs(self, slots: I64) -> npt.NDArray[np.float32]:
        return self.slots["prob"][slots]

    def backoffs(self, slots: I64) -> npt.NDArray[np.float32]:
        if self.final:
            return np.zeros(len(slots), dtype=np.float32)
        return self.slots["backoff"][slots]

    @property
    def nbytes(self) -> int:
        return int(self.slots.nbytes)

    def get(self, key: int) -> int:
        """One key's slot (-1 if absent), in plain Python (for the few words of a context)."""
        slot_keys = self._keys
        slot = home_slot(key, self.n_home)
        empty = int(EMPTY)
        while True:
            got = int(slot_keys[slot])
            if got == key:
                return slot
            if got == empty:
                return -1
            slot += 1


def build_probing_tables(
    probs: list[npt.NDArray[np.float32]],
    backoffs: list[npt.NDArray[np.float32]],
    words: list[I32],
    child_start: list[I64],
) -> list[ProbingTable]:
    """The scoring tables of orders 2..N from sorted per-order arrays (`build.py`), in order.

    An order-k entry's key is `(slot of its prefix in order k-1's table) << 32 | last word`,
    with a unigram's "slot" being its word id; the prefix of each entry is given by the CSR
    offsets of order k-1 (`child_start`).
    """
    tables: list[ProbingTable] = []
    # prefix_slot[e]: slot of order k-1's entry e (order 1: the word id itself).
    prefix_slot = np.arange(len(probs[0]), dtype=np.int64)
    n_order = len(probs)
    for k in range(2, n_order + 1):
        starts = child_start[k - 2]
        parent = np.repeat(np.arange(len(starts) - 1, dtype=np.int64), np.diff(starts))
        keys = make_keys(prefix_slot[parent], words[k - 1])
        table, prefix_slot = ProbingTable.build(
            keys, probs[k - 1], backoffs[k - 1] if k < n_order else None
        )
        tables.append(table)
    return tables
