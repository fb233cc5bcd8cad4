"""What every smoothing method produces: a back-off model, one probability per listed n-gram.

The ARPA back-off form: for a listed n-gram `h w`, p(w | h) is its probability; otherwise
p(w | h) = backoff(h) * p(w | h'), where h' drops h's first word and backoff(h) is 1 when h is
not listed. Probabilities are kept linear here; `arpa_writer` turns them into log10.

A model is computed order by order as it is written (`BackoffModel.orders`): every method's
order k needs only p_{k-1} and the counts, and yields with p_k the back-off weights of order
k-1 (its contexts), so at most two orders' floats are alive at once, not all of them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from lmserve.export.ngram.tables import NgramCounts, OrderTable

FloatArray = npt.NDArray[np.float64]
BLOCK = 1 << 17
# (k, p_{k-1} or None at k = 1) -> (p_k, back-off weights of the order-(k-1) n-grams or None).
Level = Callable[[int, FloatArray | None], tuple[FloatArray, FloatArray | None]]


@dataclass
class BackoffModel:
    """`level(k, p_{k-1})`: p(word | context) of each order-k n-gram (0 where impossible) and
    the back-off weight of each order-(k-1) n-gram used as a context of order k.
    `info`: method parameters worth recording (discounts, interpolation weights)."""

    counts: NgramCounts
    level: Level
    info: dict[str, list[float]] = field(default_factory=dict)

    def orders(self) -> Iterator[tuple[int, FloatArray, FloatArray | None]]:
        """(k, p_k, back-offs of order k or None at the top), lowest order first. Order k+1 is
        computed before order k is handed out, since it gives order k's back-off weights."""
        lower: FloatArray | None = None
        for k in range(1, self.counts.order + 1):
            probs, backoffs = self.level(k, lower)
            if lower is not None:
                yield k - 1, lower, backoffs
            lower = probs
            del probs, backoffs
        assert lower is not None
        yield self.counts.order, lower, None


def predictable_words(vocab_size: int) -> int:
    """Words a model can predict: the whole vocabulary except `<s>` (which is only a context);
    `<unk>` and `</s>` included. KenLM's uniform distribution is over exactly these."""
    return vocab_size - 1


def context_sizes(counts: NgramCounts, k: int) -> int:
    """Number of possible contexts of order-k n-grams (1 for unigrams: the empty context)."""
    return 1 if k == 1 else len(counts.orders[k - 2])


def blocks(n: int, size: int = BLOCK) -> Iterator[slice]:
    """0..n in slices of `size`: elementwise steps done a block at a time hold no full-size
    temporaries (and give the same floats as whole-array steps)."""
    for start in range(0, n, size):
        yield slice(start, min(start + size, n))


def context_blocks(table: OrderTable, size: int = BLOCK) -> Iterator[slice]:
    """Slices of about `size` n-grams that never split a context (the table is sorted by
    context), so per-block sums add up each context's values in the same order as one pass."""
    start, n = 0, len(table)
    while start < n:
        stop = min(start + size, n)
        if stop < n:
            cut = int(np.searchsorted(table.context, table.context[stop], "left"))
            stop = cut if cut > start else int(
                np.searchsorted(table.context, table.context[start], "right"))  # fmt: skip
        yield slice(start, stop)
        start = stop


def per_context(
    counts: NgramCounts, k: int, values: npt.NDArray[Any] | Callable[[slice], npt.NDArray[Any]]
) -> FloatArray:
    """Sum of `values` (one per order-k n-gram, or made per slice of them) over each context.
    One `np.bincount` per block of whole contexts: the same sums as one call over the table,
    without its full-size int64 and float64 copies of the contexts and values."""
    table = counts.orders[k - 1]
    sums = np.zeros(context_sizes(counts, k), dtype=np.float64)
    for part in context_blocks(table):
        context = table.context[part]
        weights = values(part) if callable(values) else values[part]
        if len(context):
            first = int(context[0])
            block = np.bincount(context - first, weights=weights)
            sums[first : first + len(block)] = block
    return sums


def context_totals(counts: NgramCounts, k: int) -> FloatArray:
    """c(h) = sum over w of c(h w), the raw count of every order-k context."""
    return per_context(counts, k, counts.orders[k - 1].count)


def lower_order_probs(
    counts: NgramCounts, lower: FloatArray | None, k: int, part: slice = slice(None)
) -> FloatArray:
    """p(w | h') for each order-k n-gram `h w` (of `part` of them), read off its suffix in order
    k-1 (always listed, because the suffix of a seen n-gram was seen); `lower` is p_{k-1}."""
    if lower is None:
        raise ValueError(f"order {k} needs the probabilities of order {k - 1}")
    return lower[counts.orders[k - 1].suffix[part]]


def is_context(counts: NgramCounts, k: int) -> npt.NDArray[np.bool_]:
    """Which order-k n-grams are followed by some word in the corpus (k < N)."""
    return context_totals(counts, k + 1) > 0
