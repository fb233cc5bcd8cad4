"""Counted n-grams, one sorted table per order, and the array steps that build and search them.

Order k's n-grams are numbered 0..n_k-1. An n-gram of order k >= 2 is the pair (context, word)
where `context` is the number of its first k-1 words among the (k-1)-grams, so its exact key is
`context * V + word` (V = vocabulary size, which keeps keys unique and below 2**63 for any
realistic corpus). Sorting by key sorts n-grams by their words, first word first, so n-grams
sharing a context are adjacent (every smoothing method sums per context with `np.bincount`)
and the n-grams starting with `<s>` form one block (`bos_range`).

Unigrams are numbered by word id, all V of them (words with no count included).

Memory, per n-gram: context, word, suffix and count are int32 wherever the numbers fit (checked,
int64 otherwise), 16 bytes in all; the first word is not stored (`bos_range` finds the only
first word smoothing asks about) and the keys are rebuilt on demand (`OrderTable.keys`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from lmserve.export.ngram.vocab import BOS_ID, EncodedCorpus, positions

Int64Array = npt.NDArray[np.int64]
IndexArray = npt.NDArray[Any]  # int32 where the values fit, int64 otherwise
_BLOCK = 1 << 18


def index_dtype(limit: int) -> type[np.signedinteger[Any]]:
    """The narrowest of int32/int64 that holds every value in 0..limit (and -1)."""
    return np.int32 if limit < 2**31 else np.int64


@dataclass(frozen=True)
class OrderTable:
    """The n-grams of one order, sorted by (context, word).

    `context[i]`: index of words 1..k-1 in the order k-1 table (0 for unigrams);
    `suffix[i]`: index of words 2..k in the order k-1 table (-1 for unigrams);
    `word[i]`: the last word; `count[i]`: raw count in the corpus.
    """

    order: int
    context: IndexArray
    word: IndexArray
    suffix: IndexArray
    count: IndexArray

    def __len__(self) -> int:
        return len(self.word)

    def keys(self, vocab_size: int) -> Int64Array:
        """The sorted keys `context * V + word` (built on demand: 8 bytes an n-gram)."""
        keys = self.context.astype(np.int64)
        keys *= vocab_size
        keys += self.word
        return keys


@dataclass(frozen=True)
class NgramCounts:
    """All orders 1..N; `orders[k - 1]` is the table of order k."""

    vocab_size: int
    orders: list[OrderTable]

    @property
    def order(self) -> int:
        return len(self.orders)


def unigram_table(counts: npt.NDArray[Any], vocab_size: int, tokens: int) -> OrderTable:
    words = np.arange(vocab_size, dtype=index_dtype(vocab_size))
    return OrderTable(
        order=1,
        context=np.zeros(vocab_size, dtype=np.int32),
        word=words,
        suffix=np.full(vocab_size, -1, dtype=np.int32),
        count=counts.astype(index_dtype(tokens)),
    )


def check_key_range(contexts: int, vocab_size: int, order: int) -> None:
    """Keys `context * V + word` must stay below 2**63."""
    if contexts * vocab_size >= 2**63:
        raise ValueError(
            f"{order}-gram keys overflow int64: {contexts} contexts x {vocab_size} words"
        )


def sorted_unique(keys: Int64Array) -> tuple[Int64Array, IndexArray, IndexArray]:
    """(distinct keys in order, their counts, each key's index among them): `np.unique` with
    counts and inverse, in about a third of its time and memory. `keys` (non-negative) is
    consumed: the distinct keys returned are a view of its front. Where the position fits in
    the key's unused low bits, one in-place sort of (key, position) gives the order (numpy's
    vectorised sort is ~7x faster than argsort) and the ranks are scattered block by block,
    so besides the keys only 5 bytes a key are held."""
    n = len(keys)
    if n == 0:
        return keys, keys.copy(), np.zeros(0, dtype=np.int32)
    bits = max(1, (n - 1).bit_length())
    if int(keys.max()) >= 1 << (63 - bits):
        return _argsort_unique(keys)
    mask = (1 << bits) - 1
    keys <<= bits
    for start in range(0, n, _BLOCK):
        stop = min(start + _BLOCK, n)
        keys[start:stop] |= np.arange(start, stop, dtype=np.int64)
    keys.sort()
    first = np.empty(n, dtype=bool)
    first[0] = True
    for start in range(0, n - 1, _BLOCK):
        stop = min(start + _BLOCK + 1, n)
        block = keys[start:stop] >> bits
        np.not_equal(block[1:], block[:-1], out=first[start + 1 : stop])
    dtype = index_dtype(n)
    inverse = np.empty(n, dtype=dtype)
    rank = -1
    for start in range(0, n, _BLOCK):
        stop = min(start + _BLOCK, n)
        ranks = np.cumsum(first[start:stop], dtype=dtype)
        ranks += rank
        rank = int(ranks[-1])
        inverse[keys[start:stop] & mask] = ranks
    keys >>= bits
    return _compact(keys, first, inverse)


def _compact(
    ordered: Int64Array, first: npt.NDArray[np.bool_], inverse: IndexArray
) -> tuple[Int64Array, IndexArray, IndexArray]:
    """The distinct sorted keys moved to the front of `ordered` (a view of it is returned, so
    no second array of them is made) and their counts (narrow)."""
    n = len(ordered)
    starts = np.flatnonzero(first)
    del first
    counts = np.empty(len(starts), dtype=index_dtype(n))
    np.subtract(starts[1:], starts[:-1], out=counts[:-1], casting="unsafe")
    counts[-1:] = n - starts[-1:]
    # starts[i] >= i: blocks in ascending order only read positions they have not written.
    for start in range(0, len(starts), _BLOCK):
        stop = min(start + _BLOCK, len(starts))
        ordered[start:stop] = ordered[starts[start:stop]]
    return ordered[: len(starts)], counts, inverse


def _argsort_unique(keys: Int64Array) -> tuple[Int64Array, IndexArray, IndexArray]:
    """`sorted_unique` for keys too large to carry their position."""
    n = len(keys)
    perm = np.argsort(keys)
    ordered = keys[perm]
    first = np.empty(n, dtype=bool)
    first[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=first[1:])
    dtype = index_dtype(n)
    rank = np.cumsum(first, dtype=dtype)
    rank -= 1
    inverse = np.empty(n, dtype=dtype)
    inverse[perm] = rank
    del perm, rank
    return _compact(ordered, first, inverse)


def split_keys(keys: Int64Array, vocab_size: int, contexts: int) -> tuple[IndexArray, IndexArray]:
    """(context, word) of each key, narrow, computed in blocks (no full-size int64 copy)."""
    context = np.empty(len(keys), dtype=index_dtype(contexts))
    word = np.empty(len(keys), dtype=index_dtype(vocab_size))
    for start in range(0, len(keys), _BLOCK):
        block = keys[start : start + _BLOCK]
        context[start : start + _BLOCK], word[start : start + _BLOCK] = np.divmod(block, vocab_size)
    return context, word


def bos_range(counts: NgramCounts, k: int) -> slice:
    """The order-k n-grams whose first word is `<s>` (they cannot be extended to the left):
    one block of the sorted table, found by following the block down the contexts."""
    lo, hi = BOS_ID, BOS_ID + 1
    for table in counts.orders[1:k]:
        lo, hi = (int(i) for i in np.searchsorted(table.context, [lo, hi]))
    return slice(lo, hi)


def lookup(sorted_keys: Int64Array, keys: Int64Array) -> Int64Array:
    """Index of each key among the sorted keys, -1 where the n-gram was never seen."""
    if len(sorted_keys) == 0:
        return np.full(len(keys), -1, dtype=np.int64)
    found = np.searchsorted(sorted_keys, keys)
    found = np.minimum(found, len(sorted_keys) - 1)
    hit = sorted_keys[found] == keys
    return np.where(hit, found, -1)


def locate(counts: NgramCounts, corpus: EncodedCorpus) -> list[Int64Array]:
    """For each order k, the training n-gram ending at each position of another corpus (-1 if
    unseen or if fewer than k words precede it in its sentence). Used to tune and evaluate."""
    v = np.int64(counts.vocab_size)
    node = corpus.ids.astype(np.int64)
    nodes = [node]
    for table in counts.orders[1:]:
        k = table.order
        prev = np.full(len(node), -1, dtype=np.int64)
        ok = corpus.pos >= k - 1
        ok[ok] &= node[np.flatnonzero(ok) - 1] >= 0
        ends = np.flatnonzero(ok)
        prev[ends] = lookup(table.keys(counts.vocab_size), node[ends - 1] * v + corpus.ids[ends])
        node = prev
        nodes.append(node)
    return nodes


def no_ngrams_error(k: int) -> ValueError:
    """The refusal both ways of counting give when no sentence holds a k-gram."""
    return ValueError(f"no sentence is long enough for {k}-grams; use a lower --order")


def ngram_ends(lengths: npt.NDArray[np.int32], k: int) -> IndexArray:
    """Where n-grams of order k end: positions with at least k-1 tokens before them in their
    sentence (positions are made here and dropped, not kept for the whole counting)."""
    pos = positions(lengths)
    return np.flatnonzero(pos >= k - 1).astype(index_dtype(len(pos)))
