"""Generation over a transformer whose graph appends to its cache in place
(`fused_transformer.FusedTransformerBackend`): no copy of the cache per token, none when rows
leave or beams reorder, only a joining row's own cache copied when it joins.

A pool (`CachePool`) is one preallocated buffer per layer's key and value,
[rows, kv_heads, positions, head_dim], grown geometrically on either axis (amortised: a
growth copies the pool once). A state (`SharedKvState`) is a VALUE: the pool, and per row
the pool row (its slot) and its length. Callers keep states and reuse them (prefix scoring
selects one parent state several times; an autocomplete session keeps states between
keystrokes and goes back with `truncate`), so no operation may change what a live state
reads. The one rule that keeps that true:

    positions [0, length) of a slot are read by the live states on it; the pool counts, per
    slot, the lengths of the live states on it (each state registers its rows when made and
    a weakref finalizer removes them when it dies). A call may write a slot's positions from
    L on only when no live state on that slot is longer than L.

So a row steps in place when its length is the longest live length on its slot (the usual
case: the state it came from is the only one); otherwise (its slot was stepped already from
an equal or shorter state, or a second row of the same batch sits on the same slot: a forked
beam) its first `length` positions are copied to a free slot first, copy-on-write of that
one row. A slot with no live state is free.

The op reads a batch as consecutive pool rows. A step runs on the block of slots its rows sit
on, in any order (tokens and log-probs are permuted, not caches): `select` costs nothing,
and a row that left leaves a hole that steps as a dummy row (writing past every live length
on that slot, harmlessly) until holes pass a quarter of the block; then the batch is compacted
into the cheapest block (rows outside it moved, one copy each). Rows from another pool
(`merge` of a newly prefilled stream) are copied in once.

Rows read T > 1 tokens after a past one row per call (the op's CPU kernel reads such a chunk
in a batch of one only); a batch that starts from nothing reads in one call, right-padded.
"""

from __future__ import annotations

import threading
import weakref
from collections import Counter
from collections.abc import Sequence
from typing import cast

import numpy as np
import numpy.typing as npt

from lmserve.server.backends.base import FloatArray
from lmserve.server.backends.fused_transformer import FusedTransformerBackend, right_padded
from lmserve.server.backends.transformer import CacheShape, log_softmax
from lmserve.server.backends.transformer_stepping import TransformerStepper

Index = npt.NDArray[np.int64]
# Holes (pool rows in a step's block that no row of the batch uses) allowed before the batch
# is compacted: a fraction of the batch's rows.
HOLE_FRACTION = 0.25
MIN_POSITIONS = 16


class CachePool:
    """One lineage's cache buffers and, per slot, the lengths of the live states on it."""

    def __init__(self, shape: CacheShape, rows: int, positions: int, lock: threading.RLock):
        self.shape = shape
        self.lock = lock
        self.arrays = [self._zeros(rows, positions) for _ in range(2 * shape.layers)]
        self.live: list[Counter[int]] = [Counter() for _ in range(rows)]

    def _zeros(self, rows: int, positions: int) -> npt.NDArray[np.float32]:
        s = self.shape
        return np.zeros((rows, s.kv_heads, positions, s.head_dim), dtype=np.float32)

    @property
    def rows(self) -> int:
        return len(self.live)

    @property
    def positions(self) -> int:
        return int(self.arrays[0].shape[2])

    def top(self, slot: int) -> int:
        """The longest live length on `slot`; -1 when the slot is free."""
        lengths = self.live[slot]
        return max(lengths) if lengths else -1

    def acquire(self, slots: Index, lengths: Index) -> None:
        for s, n in zip(slots.tolist(), lengths.tolist(), strict=True):
            self.live[s][n] += 1

    def release(self, slots: Index, lengths: Index) -> None:
        with self.lock:
            for s, n in zip(slots.tolist(), lengths.tolist(), strict=True):
                counter = self.live[s]
                counter[n] -= 1
                if counter[n] <= 0:
                    del counter[n]

    def reserve(self, rows: int, positions: int) -> None:
        """At least `rows` slots and `positions` positions, grown geometrically."""
        if positions > self.positions or rows > self.rows:
            new_pos = self.positions
            if positions > new_pos:
                new_pos = max(positions, MIN_POSITIONS, 2 * new_pos)
                new_pos = min(new_pos, max(positions, self.shape.max_positions))
            new_rows = max(rows, 2 * self.rows) if rows > self.rows else self.rows
            grown = []
            for old in self.arrays:
                new = self._zeros(new_rows, new_pos)
                new[: old.shape[0], :, : old.shape[2]] = old
                grown.append(new)
            self.arrays = grown
            self.live.extend(Counter() for _ in range(new_rows - len(self.live)))

    def copy_row(self, source: CachePool, src: int, dst: int, length: int) -> None:
        """Positions [0, length) of `source`'s slot `src` into this pool's slot `dst`."""
        if length:
            for mine, theirs in zip(self.arrays, source.arrays, strict=True):
                mine[dst, :, :length] = theirs[src, :, :length]

    def free_slots(self, claimed: set[int]) -> list[int]:
        return [s for s in range(self.rows) if not self.live[s] and s not in claimed]


class SharedKvState:
    """Rows of a pool: a value (see the module doc); its slots are held while it lives."""

    __slots__ = ("__weakref__", "lengths", "pool", "slots")

    def __init__(self, pool: CachePool, slots: Index, lengths: Index) -> None:
        slots = np.array(slots, dtype=np.int64)
        lengths = np.array(lengths, dtype=np.int64)
        slots.flags.writeable = False
        lengths.flags.writeable = False
        self.pool = pool
        self.slots = slots
        self.lengths = lengths
        with pool.lock:
            pool.acquire(slots, lengths)
        weakref.finalize(self, pool.release, slots, lengths).atexit = False

    @property
    def batch(self) -> int:
        return len(self.slots)

    @property
    def nbytes(self) -> int:
        """The bytes of the positions this state's rows read."""
        return int(self.lengths.sum()) * self.pool.shape.bytes_per_position()


class SharedKvStepper(TransformerStepper[FusedTransformerBackend, SharedKvState]):
    """Steps a `FusedTransformerBackend` (see the module doc); natural-log probabilities."""

    def __init__(self, backend: FusedTransformerBackend, *, max_chunk_tokens: int = 512) -> None:
        super().__init__(backend, max_chunk_tokens=max_chunk_tokens)
        # Every pool this stepper makes shares it: placement, calls and the live counts.
        self.lock = threading.RLock()

    def initial_state(self, batch: int) -> SharedKvState:
        pool = CachePool(self.backend.cache, batch, 0, self.lock)
        zeros = np.zeros(batch, dtype=np.int64)
        return SharedKvState(pool, np.arange(batch, dtype=np.int64), zeros)

    # -- reading tokens ----------------------------------------------------------------

    def step(self, tokens: npt.ArrayLike, state: SharedKvState) -> tuple[FloatArray, SharedKvState]:
        ids = np.asarray(tokens, dtype=np.int64).reshape(-1, 1)
        if len(ids) != state.batch:
            raise ValueError(f"{len(ids)} tokens for a state of {state.batch} rows")
        return self._forward(ids, state)

    def _read_chunks(
        self, chunks: Sequence[Sequence[int]], state: SharedKvState
    ) -> tuple[FloatArray, SharedKvState]:
        """Rows that start from nothing read in one call, right-padded; otherwise rows of
        equal chunk length together (`feed_in_groups`)."""
        if any(len(row) == 0 for row in chunks):
            raise ValueError("feed needs at least one token per row")
        widths = [len(row) for row in chunks]
        if not state.lengths.any() and max(widths) <= self.max_chunk_tokens:
            return self._prompt(chunks, state)
        return super()._read_chunks(chunks, state)

    def _forward(self, ids: Index, state: SharedKvState) -> tuple[FloatArray, SharedKvState]:
        """`ids` [B, T] after each row's cache: the log-probs after each row's last token."""
        batch, time = ids.shape
        if time == 1 or not state.lengths.any():
            return self._block(ids, np.full(batch, time, dtype=np.int64), state)
        # A chunk after a past: one row per call (the op's CPU contract).
        rows: list[SharedKvState] = []
        out: FloatArray | None = None
        for i in range(batch):
            log_probs, row = self._block(ids[i : i + 1], np.array([time]), self.select(state, [i]))
            if out is None:
                out = np.empty((batch, log_probs.shape[1]), dtype=log_probs.dtype)
            out[i] = log_probs[0]
            rows.append(row)
        assert out is not None
        return out, self.merge(rows)

    def _prompt(
        self, chunks: Sequence[Sequence[int]], state: SharedKvState
    ) -> tuple[FloatArray, SharedKvState]:
        ids, widths = right_padded(chunks)
        return self._block(ids, widths, state)

    def _block(
        self, ids: Index, widths: Index, state: SharedKvState
    ) -> tuple[FloatArray, SharedKvState]:
        """One call: row i reads its first widths[i] tokens of `ids` (T > 1 only from
        nothing, or in a batch of one)."""
        batch, time = ids.shape
        lengths = state.lengths
        after = lengths + widths
        self.backend.positions.check(int(after.max(initial=0)), "context")
        prompt = not lengths.any()
        pool = state.pool
        with pool.lock:
            pool.reserve(pool.rows, int(lengths.max(initial=0)) + time)
            lo, targets, dummies = self._place(state, time, prompt)
            size = len(dummies) + batch
            block_ids = np.zeros((size, time), dtype=np.int64)
            block_len = np.zeros(size, dtype=np.int64)  # each block row's length before
            block_new = np.ones(size, dtype=np.int64)
            where = targets - lo
            block_ids[where] = ids
            block_len[where] = lengths
            block_new[where] = widths
            for slot in dummies:
                block_len[slot - lo] = max(pool.top(slot), 0)
            positions = block_len[:, None] + np.arange(time, dtype=np.int64)[None, :]
            seqlens = (block_len + block_new - 1).astype(np.int32)
            caches = [a[lo : lo + size] for a in pool.arrays]
            logits = self.backend.run(block_ids, positions, seqlens, caches)
            last = logits[where, widths - 1]
            new_state = SharedKvState(pool, targets, after)
        log_probs = cast(FloatArray, log_softmax(last, len(self.vocab)))
        return log_probs, new_state

    def _place(self, state: SharedKvState, time: int, prompt: bool) -> tuple[int, Index, list[int]]:
        """The block [lo, lo + rows + dummies) this call runs on: each row's target slot
        (copied there first when it cannot write its own) and the dummy slots (holes)."""
        pool = state.pool
        n = state.batch
        targets = np.full(n, -1, dtype=np.int64)
        claimed: set[int] = set()
        for i, (s, length) in enumerate(
            zip(state.slots.tolist(), state.lengths.tolist(), strict=True)
        ):
            if s not in claimed and pool.top(s) == length:
                targets[i] = s
                claimed.add(s)
        if (targets >= 0).all():
            lo, hi = int(targets.min()), int(targets.max()) + 1
            holes = [s for s in range(lo, hi) if s not in claimed]
            if len(holes) <= HOLE_FRACTION * n and all(
                self._dummy_fits(pool, s, time, prompt) for s in holes
            ):
                return lo, targets, holes
        lo = self._window(pool, targets, claimed, n)
        pool.reserve(lo + n, pool.positions)
        free = [s for s in range(lo, lo + n) if s not in claimed]  # the rest are rows' own
        for i in range(n):
            if lo <= targets[i] < lo + n:
                continue
            dst = free.pop(0)
            pool.copy_row(pool, int(state.slots[i]), dst, int(state.lengths[i]))
            targets[i] = dst
        return lo, targets, []

    def _dummy_fits(self, pool: CachePool, slot: int, time: int, prompt: bool) -> bool:
        """Whether a hole can run as a dummy row: it writes past every live length there."""
        top = max(pool.top(slot), 0)
        if prompt:
            return top == 0
        return top + time <= min(pool.positions, self.backend.max_positions)

    def _window(self, pool: CachePool, targets: Index, claimed: set[int], n: int) -> int:
        """The start of the block of n slots, each free or a row's own, holding most rows'
        own slots (fewest copies); past the pool's end when nothing fits."""
        span = pool.rows + n
        usable = np.ones(span, dtype=np.int64)
        own = np.zeros(span, dtype=np.int64)
        for s in range(pool.rows):
            usable[s] = 1 if (not pool.live[s] or s in claimed) else 0
        for s in claimed:
            own[s] = 1
        bad = np.concatenate([[0], np.cumsum(1 - usable)])
        mine = np.concatenate([[0], np.cumsum(own)])
        starts = np.arange(span - n + 1)
        ok = bad[starts + n] - bad[starts] == 0
        score = np.where(ok, mine[starts + n] - mine[starts], -1)
        return int(starts[int(np.argmax(score))])

    # -- rows ----------------------------------------------------------------------------

    def select(self, state: SharedKvState, rows: npt.ArrayLike) -> SharedKvState:
        """Rows `rows` (repeats allowed): nothing is copied."""
        index = np.asarray(rows, dtype=np.int64).reshape(-1)
        return SharedKvState(state.pool, state.slots[index], state.lengths[index])

    def merge(self, states: Sequence[SharedKvState]) -> SharedKvState:
        """Rows in the given order, in the pool of the most rows: rows of other pools are
        copied into it (their own positions only)."""
        if not states:
            return self.initial_state(0)
        rows: dict[int, int] = {}
        for s in states:
            rows[id(s.pool)] = rows.get(id(s.pool), 0) + s.batch
        target = max((s.pool for s in states), key=lambda p: rows[id(p)])
        if all(s.pool is target for s in states):
            return SharedKvState(
                target,
                np.concatenate([s.slots for s in states]),
                np.concatenate([s.lengths for s in states]),
            )
        with target.lock:  # other pools' rows are read below their live lengths: never written
            longest = max(int(s.lengths.max(initial=0)) for s in states)
            target.reserve(target.rows, longest)
            slots: list[int] = []
            copied: dict[tuple[int, int, int], int] = {}
            claimed: set[int] = set()
            for s in states:
                if s.pool is target:
                    slots += s.slots.tolist()
                    continue
                for src, length in zip(s.slots.tolist(), s.lengths.tolist(), strict=True):
                    key = (id(s.pool), src, length)
                    if key not in copied:
                        free = target.free_slots(claimed)
                        if not free:
                            target.reserve(target.rows + 1, target.positions)
                            free = target.free_slots(claimed)
                        copied[key] = free[0]
                        claimed.add(free[0])
                        target.copy_row(s.pool, src, free[0], length)
                    slots.append(copied[key])
            lengths = np.concatenate([s.lengths for s in states])
            return SharedKvState(target, np.asarray(slots, dtype=np.int64), lengths)

    def _truncated(self, state: SharedKvState, count: int) -> SharedKvState:
        """The same slots, shorter: nothing is copied."""
        return SharedKvState(state.pool, state.slots, state.lengths - count)
