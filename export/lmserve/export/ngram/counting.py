"""Vectorised n-gram counting: every order as sorted integer keys, with no loop per n-gram.

Order k's n-grams are numbered 0..n_k-1. An n-gram of order k >= 2 is the pair (context, word)
where `context` is the number of its first k-1 words among the (k-1)-grams, so its exact key is
`context * V + word` (V = vocabulary size, which keeps keys unique and below 2**63 for any
realistic corpus). `np.unique(keys, return_inverse=True)` then gives, in one call per order, the
sorted n-grams, their counts and the n-gram ending at every corpus position, from which the next
order's keys are built. Sorting by key groups n-grams by context, which every smoothing method
uses for its per-context sums (`np.bincount` over `context`).

Unigrams are numbered by word id, all V of them (words with no count included).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from lmserve.export.ngram.vocab import BOS_ID, EncodedCorpus

Int64Array = npt.NDArray[np.int64]


@dataclass(frozen=True)
class OrderTable:
    """The n-grams of one order, sorted by (context, word).

    `context[i]`: index of words 1..k-1 in the order k-1 table (0 for unigrams);
    `suffix[i]`: index of words 2..k in the order k-1 table (-1 for unigrams);
    `word[i]`: the last word; `first[i]`: the first word; `count[i]`: raw count in the corpus.
    """

    order: int
    context: Int64Array
    word: Int64Array
    suffix: Int64Array
    first: Int64Array
    count: Int64Array
    keys: Int64Array

    def __len__(self) -> int:
        return len(self.word)


@dataclass(frozen=True)
class NgramCounts:
    """All orders 1..N; `orders[k - 1]` is the table of order k."""

    vocab_size: int
    orders: list[OrderTable]

    @property
    def order(self) -> int:
        return len(self.orders)


def count_ngrams(corpus: EncodedCorpus, order: int, vocab_size: int) -> NgramCounts:
    """Counts every n-gram of orders 1..`order` that lies inside a sentence `<s> .. </s>`."""
    if order < 1:
        raise ValueError(f"order must be at least 1, got {order}")
    ids, pos = corpus.ids, corpus.pos
    v = np.int64(vocab_size)
    all_words = np.arange(vocab_size, dtype=np.int64)
    unigrams = OrderTable(
        order=1,
        context=np.zeros(vocab_size, dtype=np.int64),
        word=all_words,
        suffix=np.full(vocab_size, -1, dtype=np.int64),
        first=all_words,
        count=np.bincount(ids, minlength=vocab_size).astype(np.int64),
        keys=all_words,
    )
    tables = [unigrams]
    # node[j]: number of the order-k n-gram ending at position j (-1 where none fits).
    node = ids.copy()
    for k in range(2, order + 1):
        ends = np.flatnonzero(pos >= k - 1)
        if len(ends) == 0:
            raise ValueError(f"no sentence is long enough for {k}-grams; use a lower --order")
        # The (k-1)-gram ending just before j is this n-gram's context.
        keys = node[ends - 1] * v + ids[ends]
        uniq, inverse, counts = np.unique(keys, return_inverse=True, return_counts=True)
        n = len(uniq)
        suffix = np.empty(n, dtype=np.int64)
        first = np.empty(n, dtype=np.int64)
        # The (k-1)-gram ending at j is words 2..k of this one (assignments are idempotent).
        suffix[inverse] = node[ends]
        first[inverse] = ids[ends - (k - 1)]
        tables.append(
            OrderTable(
                order=k,
                context=uniq // v,
                word=uniq % v,
                suffix=suffix,
                first=first,
                count=counts.astype(np.int64),
                keys=uniq,
            )
        )
        node = np.full(len(ids), -1, dtype=np.int64)
        node[ends] = inverse
    return NgramCounts(vocab_size=vocab_size, orders=tables)


def lookup(table: OrderTable, keys: Int64Array) -> Int64Array:
    """Index of each key in the table, -1 where the n-gram was never seen."""
    found = np.searchsorted(table.keys, keys)
    found = np.minimum(found, len(table.keys) - 1)
    hit = table.keys[found] == keys
    return np.where(hit, found, -1)


def locate(counts: NgramCounts, corpus: EncodedCorpus) -> list[Int64Array]:
    """For each order k, the training n-gram ending at each position of another corpus (-1 if
    unseen or if fewer than k words precede it in its sentence). Used to tune and evaluate."""
    v = np.int64(counts.vocab_size)
    node = corpus.ids.copy()
    nodes = [node]
    for table in counts.orders[1:]:
        k = table.order
        prev = np.full(len(node), -1, dtype=np.int64)
        ok = corpus.pos >= k - 1
        ok[ok] &= node[np.flatnonzero(ok) - 1] >= 0
        ends = np.flatnonzero(ok)
        prev[ends] = lookup(table, node[ends - 1] * v + corpus.ids[ends])
        node = prev
        nodes.append(node)
    return nodes


def is_bos_started(table: OrderTable) -> npt.NDArray[np.bool_]:
    """N-grams whose first word is `<s>` (they cannot be extended to the left)."""
    return table.first == BOS_ID
