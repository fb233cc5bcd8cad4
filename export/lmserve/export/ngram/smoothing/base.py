"""What every smoothing method produces: a back-off model, one probability per listed n-gram.

The ARPA back-off form: for a listed n-gram `h w`, p(w | h) is its probability; otherwise
p(w | h) = backoff(h) * p(w | h'), where h' drops h's first word and backoff(h) is 1 when h is
not listed. Probabilities are kept linear here; `arpa_writer` turns them into log10.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from lmserve.export.ngram.tables import NgramCounts

FloatArray = npt.NDArray[np.float64]


@dataclass
class BackoffModel:
    """`probs[k-1][i]`: p(word | context) of order-k n-gram i (0 where impossible);
    `backoffs[k-1][i]` (orders below N): the back-off weight of n-gram i used as a context.
    `info`: method parameters worth recording (discounts, interpolation weights)."""

    counts: NgramCounts
    probs: list[FloatArray]
    backoffs: list[FloatArray]
    info: dict[str, list[float]] = field(default_factory=dict)


def predictable_words(vocab_size: int) -> int:
    """Words a model can predict: the whole vocabulary except `<s>` (which is only a context);
    `<unk>` and `</s>` included. KenLM's uniform distribution is over exactly these."""
    return vocab_size - 1


def context_sizes(counts: NgramCounts, k: int) -> int:
    """Number of possible contexts of order-k n-grams (1 for unigrams: the empty context)."""
    return 1 if k == 1 else len(counts.orders[k - 2])


def per_context(counts: NgramCounts, k: int, values: npt.ArrayLike) -> FloatArray:
    """Sum of `values` (one per order-k n-gram) over each context."""
    table = counts.orders[k - 1]
    sums = np.bincount(table.context, weights=values, minlength=context_sizes(counts, k))
    return sums.astype(np.float64, copy=False)


def context_totals(counts: NgramCounts, k: int) -> FloatArray:
    """c(h) = sum over w of c(h w), the raw count of every order-k context."""
    return per_context(counts, k, counts.orders[k - 1].count)


def lower_order_probs(counts: NgramCounts, probs: list[FloatArray], k: int) -> FloatArray:
    """p(w | h') for each order-k n-gram `h w`, read off its suffix in order k-1 (always listed,
    because the suffix of a seen n-gram was seen)."""
    return probs[k - 2][counts.orders[k - 1].suffix]


def is_context(counts: NgramCounts, k: int) -> npt.NDArray[np.bool_]:
    """Which order-k n-grams are followed by some word in the corpus (k < N)."""
    return context_totals(counts, k + 1) > 0
