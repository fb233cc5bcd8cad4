"""The quantized form of a model: probing tables of 5-7 byte slots (`import-arpa --quantize`).

KenLM's trie offers 8-bit probabilities and backoffs; this keeps lmserve's probing tables (one
cache miss a lookup) and shrinks both halves of a slot instead:

- **values**: each order's log-probs and backoffs are quantized separately to 256 levels, half
  of them KenLM's (`lm/quantize.cc`: equal-count bins over the sorted values, each level the
  mean of its bin), half an even grid over the range, which bounds the largest error; a value
  takes its nearest level. The largest error of each order is recorded, and the model's
  worst-case error per token follows (`Quantization`). Unigrams stay exact.
- **keys**: exact still, but stored as a quotient. An order-k key is `K = prefix << word_bits |
  word`, `key_bits` wide; `H = mix(K)` is a bijection on those bits and the home slot is
  `H * n_home >> key_bits`. Within one home the values of H span fewer than `2**(low_bits-1)`,
  so (home, the low `low_bits` bits of H) identify H, hence K: a slot stores those low bits and
  its distance from its home (`disp_bits`, 0 marks an empty slot) instead of the whole key.

A slot is `low | (displacement + 1) << low_bits | prob_level << v | backoff_level << v + 8`,
little-endian in `slot_bytes` bytes; the array has 8 bytes of padding so that any slot can be
read as one uint64. The C kernel's side is `_probing.h` (`CompactOrder`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from lmserve.server.backends.ngram.hashing import EMPTY, ProbingTable

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]
F32 = npt.NDArray[np.float32]

LEVELS = 256  # 8-bit values
SLOTS_PER_KEY = 1.5
_MIX = 0x9E3779B97F4A7C15
_PAD = 8  # bytes after the last slot: every slot can be read as a uint64


@dataclass(frozen=True)
class CompactLayout:
    """How one order's slots are laid out (all the header says about a compact table)."""

    word_bits: int
    key_bits: int
    n_home: int
    low_bits: int
    disp_bits: int
    has_backoff: bool

    @property
    def value_shift(self) -> int:
        return self.low_bits + self.disp_bits

    @property
    def slot_bits(self) -> int:
        return self.value_shift + 8 * (2 if self.has_backoff else 1)

    @property
    def slot_bytes(self) -> int:
        return -(-self.slot_bits // 8)

    def as_header(self) -> dict[str, int | bool]:
        return {
            "word_bits": self.word_bits,
            "key_bits": self.key_bits,
            "n_home": self.n_home,
            "low_bits": self.low_bits,
            "disp_bits": self.disp_bits,
            "has_backoff": self.has_backoff,
        }


def mix(keys: U64, key_bits: int) -> U64:
    """A bijection on `key_bits`-bit integers: xor-shift, then an odd multiplier modulo
    2**key_bits (both invertible), so distinct keys keep distinct hashes."""
    mask = np.uint64((1 << key_bits) - 1)
    x = keys ^ (keys >> np.uint64(max(1, key_bits // 2)))
    return (x * np.uint64(_MIX)) & mask


def home_of(hashes: U64, n_home: int, key_bits: int) -> I64:
    """`hashes * n_home >> key_bits` without overflowing 64 bits (hashes < 2**key_bits,
    n_home < 2**32): split the product at bit 32."""
    n = np.uint64(n_home)
    if key_bits <= 32:
        return ((hashes * n) >> np.uint64(key_bits)).astype(np.int64)
    high = (hashes >> np.uint64(32)) * n
    low = ((hashes & np.uint64(0xFFFFFFFF)) * n) >> np.uint64(32)
    return ((high + low) >> np.uint64(key_bits - 32)).astype(np.int64)


@dataclass(frozen=True)
class Quantization:
    """The levels of one order and how far they move its values (nats)."""

    prob_levels: F32
    backoff_levels: F32  # empty for the highest order
    max_prob_error: float
    max_backoff_error: float


def quantize(
    values: npt.NDArray[np.float32], keep: tuple[float, ...] = ()
) -> tuple[F32, npt.NDArray[np.uint8], float]:
    """(levels, each value's level, the largest |level - value|).

    Half the levels are KenLM's (equal-count bins over the sorted values, each its bin's mean:
    dense where the values are), half an even grid over their range, which bounds the largest
    error to a 254th of the range; `keep` are values held exactly (a backoff of 0: contexts
    never extended). Each value takes its nearest level. The levels are padded to LEVELS with
    the last one, so that any 8-bit code reads a level."""
    if len(values) == 0:
        return np.zeros(LEVELS, dtype=np.float32), np.zeros(0, dtype=np.uint8), 0.0
    distinct = np.unique(values)
    if len(distinct) <= LEVELS:  # few distinct values: exact
        levels = distinct.astype(np.float32)
    else:
        ordered = np.sort(values.astype(np.float64))
        n_grid = LEVELS // 2
        n_dense = LEVELS - n_grid - len(keep)
        dense = [b.mean() for b in np.array_split(ordered, n_dense)]
        grid = np.linspace(ordered[0], ordered[-1], n_grid)
        levels = np.unique(np.concatenate([dense, grid, keep]).astype(np.float32))
    midpoints = (levels[:-1].astype(np.float64) + levels[1:]) / 2
    codes = np.searchsorted(midpoints, values.astype(np.float64)).astype(np.uint8)
    error = float(np.max(np.abs(levels[codes].astype(np.float64) - values)))
    padded = np.full(LEVELS, levels[-1], dtype=np.float32)
    padded[: len(levels)] = levels
    return padded, codes, error


class CompactTable:
    """One order's quantized probing table; the same lookups as `ProbingTable`, by prefix slot
    and word rather than by a prebuilt key."""

    __slots__ = ("raw", "layout", "quantization", "n_slots", "_u64_view")

    def __init__(self, raw: npt.NDArray[np.uint8], layout: CompactLayout, q: Quantization) -> None:
        size = layout.slot_bytes
        if raw.dtype != np.uint8 or raw.ndim != 1 or (len(raw) - _PAD) % size:
            raise ValueError("malformed compact table")
        if len(q.prob_levels) != LEVELS or len(q.backoff_levels) != LEVELS * layout.has_backoff:
            raise ValueError(f"compact table: {LEVELS} levels a quantized field")
        self.raw, self.layout, self.quantization = raw, layout, q
        self.n_slots = (len(raw) - _PAD) // size
        last = self._disp(self.slot_words(np.array([self.n_slots - 1], dtype=np.int64)))
        if not 1 <= layout.n_home < self.n_slots or last[0]:
            raise ValueError("compact table: the last slot must be empty, after the home slots")

    @property
    def n_home(self) -> int:
        return self.layout.n_home

    def kernel_layout(self) -> tuple[int, int, int, int, F32, F32]:
        """What the C kernel's `Scorer` takes for a compact order (see `_probing.h`)."""
        lay, q = self.layout, self.quantization
        return (
            lay.word_bits,
            lay.key_bits,
            lay.low_bits,
            lay.disp_bits,
            q.prob_levels,
            q.backoff_levels,
        )

    @property
    def final(self) -> bool:
        """Whether this is the highest order's table (slots without backoff)."""
        return not self.layout.has_backoff

    @property
    def n_entries(self) -> int:
        """Used slots, counted a chunk at a time: reading every slot at once would take 64
        bytes a slot of temporaries (2.8 GB for a 100M-n-gram model's largest order)."""
        chunk = 1 << 18
        return sum(
            int(
                np.count_nonzero(
                    self._disp(self.slot_words(np.arange(lo, min(lo + chunk, self.n_slots))))
                )
            )
            for lo in range(0, self.n_slots, chunk)
        )

    def slot_words(self, slots: I64) -> U64:
        """Each slot's bits as a uint64 (the bytes past its end masked off)."""
        size = self.layout.slot_bytes
        offsets = np.asarray(slots, dtype=np.int64)[:, None] * size + np.arange(8)
        words = self.raw[offsets].view(np.uint64)[:, 0]
        return words & np.uint64((1 << (8 * size)) - 1 if size < 8 else (1 << 64) - 1)

    def _disp(self, words: U64) -> U64:
        lay = self.layout
        return (words >> np.uint64(lay.low_bits)) & np.uint64((1 << lay.disp_bits) - 1)

    def find(self, prefix: I64, word: I64) -> I64:
        """Slots of the entries (prefix slot, word), -1 where absent: vectorised probing rounds."""
        lay = self.layout
        keys = (prefix.astype(np.uint64) << np.uint64(lay.word_bits)) | word.astype(np.uint64)
        hashes = mix(keys, lay.key_bits)
        home = home_of(hashes, lay.n_home, lay.key_bits)
        low = hashes & np.uint64((1 << lay.low_bits) - 1)
        out = np.full(len(keys), -1, dtype=np.int64)
        todo = np.arange(len(keys), dtype=np.int64)
        slot = home.copy()
        while len(todo):
            words = self.slot_words(slot)
            disp = self._disp(words).astype(np.int64)
            hit = (
                (disp > 0)
                & (slot - (disp - 1) == home[todo])
                & ((words & np.uint64((1 << lay.low_bits) - 1)) == low[todo])
            )
            out[todo[hit]] = slot[hit]
            walk = ~hit & (disp > 0)
            todo, slot = todo[walk], slot[walk] + 1
        return out

    def get_entry(self, prefix: int, word: int) -> int:
        return int(self.find(np.array([prefix], np.int64), np.array([word], np.int64))[0])

    def probs(self, slots: I64) -> F32:
        codes = (self.slot_words(slots) >> np.uint64(self.layout.value_shift)) & np.uint64(0xFF)
        return self.quantization.prob_levels[codes.astype(np.int64)]

    def backoffs(self, slots: I64) -> F32:
        if not self.layout.has_backoff:
            return np.zeros(len(slots), dtype=np.float32)
        shift = np.uint64(self.layout.value_shift + 8)
        codes = (self.slot_words(slots) >> shift) & np.uint64(0xFF)
        return self.quantization.backoff_levels[codes.astype(np.int64)]

    @property
    def nbytes(self) -> int:
        return int(self.raw.nbytes)


def _bits(n: int) -> int:
    """Bits to hold the values 0..n-1 (at least 1)."""
    return max(1, (max(n, 1) - 1).bit_length())


def compact_tables(tables: list[ProbingTable], vocab_size: int) -> list[CompactTable]:
    """Quantized copies of exact tables (orders 2..N, in order), each keyed by the slots of the
    compact table below it. One order at a time, holding only the previous order's slot map
    (exact slot -> compact slot, 4 bytes an exact slot) beside it."""
    out: list[CompactTable] = []
    word_bits = _bits(vocab_size)
    prefix_span = vocab_size  # order 1's "slots" are the word ids
    remap: npt.NDArray[np.uint32] | None = None
    for exact in tables:
        used = np.flatnonzero(exact.slots["key"] != EMPTY)
        keys = exact.slots["key"][used]
        prefix = (keys >> np.uint64(32)).astype(np.int64)
        if remap is not None:
            prefix = remap[prefix].astype(np.int64)
        word = (keys & np.uint64(0xFFFFFFFF)).astype(np.int64)
        del keys
        table, slots = _place(prefix, word, exact, used, word_bits, _bits(prefix_span))
        del prefix, word
        out.append(table)
        remap = np.zeros(len(exact.slots), dtype=np.uint32)
        remap[used] = slots
        del used, slots
        prefix_span = table.n_slots
    return out


def _place(
    prefix: I64, word: I64, exact: ProbingTable, used: I64, word_bits: int, prefix_bits: int
) -> tuple[CompactTable, I64]:
    """Lays one order's entries out (linear probing in home order, as `ProbingTable.build`);
    returns the table and each entry's slot. Temporaries go as soon as they are used."""
    n = len(prefix)
    key_bits = word_bits + prefix_bits
    if key_bits > 62:
        raise ValueError("keys wider than 62 bits: too large a model for the compact form")
    n_home = max(1, int(n * SLOTS_PER_KEY))
    has_backoff = not exact.final
    prob_levels, prob_codes, prob_error = quantize(exact.slots["prob"][used])
    if has_backoff:
        backoff_levels, backoff_codes, backoff_error = quantize(
            exact.slots["backoff"][used], keep=(0.0,)
        )
    else:
        backoff_levels, backoff_codes, backoff_error = np.zeros(0, np.float32), None, 0.0
    hashes = mix(
        (prefix.astype(np.uint64) << np.uint64(word_bits)) | word.astype(np.uint64), key_bits
    )
    home = home_of(hashes, n_home, key_bits)
    order = np.argsort(home, kind="stable")
    place = np.empty(n, dtype=np.int64)
    if n:
        ranked = home[order]
        ranked -= np.arange(n, dtype=np.int64)
        np.maximum.accumulate(ranked, out=ranked)
        ranked += np.arange(n, dtype=np.int64)
        place[order] = ranked
        del ranked
    del order
    home -= place  # minus the displacement
    disp = -home
    del home
    disp_bits = _bits(int(disp.max()) + 2 if n else 2)
    # Within one home, hashes span less than 2**key_bits / n_home + 1 values.
    low_bits = min(key_bits, max(1, math.ceil(key_bits - math.log2(n_home)) + 1))
    layout = CompactLayout(word_bits, key_bits, n_home, low_bits, disp_bits, has_backoff)
    if layout.slot_bits > 64:
        raise ValueError("a compact slot would be wider than 64 bits")
    value = hashes
    value &= np.uint64((1 << low_bits) - 1)
    value |= (disp.astype(np.uint64) + np.uint64(1)) << np.uint64(low_bits)
    del disp
    value |= prob_codes.astype(np.uint64) << np.uint64(layout.value_shift)
    if backoff_codes is not None:
        value |= backoff_codes.astype(np.uint64) << np.uint64(layout.value_shift + 8)
    n_slots = max(n_home, int(place.max()) + 1 if n else 0) + 1  # + the final empty slot
    size = layout.slot_bytes
    raw = np.zeros(n_slots * size + _PAD, dtype=np.uint8)
    slots = raw[: n_slots * size].reshape(n_slots, size)
    slots[place] = value.view(np.uint8).reshape(n, 8)[:, :size]
    del value
    q = Quantization(prob_levels, backoff_levels, prob_error, backoff_error)
    return CompactTable(raw, layout, q), place
