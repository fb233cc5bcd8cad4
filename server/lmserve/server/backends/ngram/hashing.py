"""An open-addressing hash table held in two numpy arrays, built and probed vectorised.

KenLM's fastest structure (`lm/search_hashed.cc`, "probing") is a linear-probing hash table keyed
by a hash of the n-gram. Ours keys exact 64-bit integers instead: an n-gram's key is
`(index of its (n-1)-word prefix) << 32 | last word id`, so there are no collisions to tolerate.

Lookups probe many keys at once: gather the home slots, compare, and advance only the unresolved
keys by one slot, until each hit its key or an empty slot. At a load factor of 1/2 the expected
probe count is ~1.5 for a hit and ~2.5 for a miss, so a batch takes a handful of numpy passes.
The table never wraps around: slots past the end are appended while building, and the last
slot is always empty, so a probe needs no modulo.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

EMPTY = np.uint64(0xFFFFFFFFFFFFFFFF)  # no real key: prefix indices stay below 2**32 - 1
_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing: spreads sequential keys
_SHIFT32 = np.uint64(32)
LOAD_FACTOR = 0.5

U64 = npt.NDArray[np.uint64]
I32 = npt.NDArray[np.int32]


def make_keys(prefix: npt.NDArray[np.integer], word: npt.NDArray[np.integer]) -> U64:
    """The exact key of an n-gram from its prefix's index and its last word."""
    return (prefix.astype(np.uint64) << _SHIFT32) | word.astype(np.uint64)


def home_slots(keys: U64, n_home: int) -> U64:
    """Maps keys to [0, n_home): multiply-shift hash, then a multiply-high range reduction."""
    mixed = (keys * _MULTIPLIER) >> _SHIFT32
    return (mixed * np.uint64(n_home)) >> _SHIFT32


def table_size(n: int) -> int:
    return max(4, int(n / LOAD_FACTOR) + 1)


def build_table(keys: U64) -> tuple[U64, I32]:
    """Slots for distinct `keys`; slot values are positions in `keys`. Returns (keys, values)."""
    n_home = table_size(len(keys))
    slot_keys = np.full(n_home + 1, EMPTY, dtype=np.uint64)
    slot_vals = np.full(n_home + 1, -1, dtype=np.int32)
    pending = np.arange(len(keys), dtype=np.int64)
    pos = home_slots(keys, n_home).astype(np.int64)
    while len(pending):
        if int(pos.max()) >= len(slot_keys) - 1:  # keep the last slot empty: probes end there
            grow = int(pos.max()) - len(slot_keys) + 2
            slot_keys = np.concatenate([slot_keys, np.full(grow, EMPTY, dtype=np.uint64)])
            slot_vals = np.concatenate([slot_vals, np.full(grow, -1, dtype=np.int32)])
        free = slot_vals[pos] < 0
        # Several keys may want one free slot: a fancy assignment keeps one of them, the
        # others see they lost and move on with the keys whose slot was taken.
        slot_vals[pos[free]] = pending[free]
        won = np.zeros(len(pending), dtype=np.bool_)
        won[free] = slot_vals[pos[free]] == pending[free]
        slot_keys[pos[won]] = keys[pending[won]]
        pending, pos = pending[~won], pos[~won] + 1
    return slot_keys, slot_vals


class HashTable:
    """A built table plus its home-range size (slots past it are probe overflow)."""

    __slots__ = ("keys", "vals", "n_home")

    def __init__(self, keys: U64, vals: I32, n_home: int) -> None:
        self.keys, self.vals, self.n_home = keys, vals, n_home

    @classmethod
    def build(cls, keys: U64) -> HashTable:
        slot_keys, slot_vals = build_table(keys)
        return cls(slot_keys, slot_vals, table_size(len(keys)))

    def lookup(self, keys: U64) -> npt.NDArray[np.int64]:
        """Values for `keys` (-1 where absent)."""
        out = np.full(len(keys), -1, dtype=np.int64)
        if len(keys) == 0:
            return out
        slot_keys, slot_vals = self.keys, self.vals
        pos = home_slots(keys, self.n_home).astype(np.intp)
        seen = slot_keys[pos]
        hit = seen == keys
        if hit.all():  # the common case for a well-filled table: one probe each
            return slot_vals[pos].astype(np.int64)
        todo = np.arange(len(keys))
        while True:
            out[todo[hit]] = slot_vals[pos[hit]]
            more = ~hit & (seen != EMPTY)
            if not more.any():
                return out
            todo, pos, keys = todo[more], pos[more] + 1, keys[more]
            seen = slot_keys[pos]
            hit = seen == keys

    def get(self, key: int) -> int:
        """One key, in plain Python (for short contexts)."""
        k = np.uint64(key)
        pos = int(home_slots(np.array([k], dtype=np.uint64), self.n_home)[0])
        slot_keys = self.keys
        while True:
            seen = slot_keys[pos]
            if seen == k:
                return int(self.vals[pos])
            if seen == EMPTY:
                return -1
            pos += 1
