"""Interpolated Kneser-Ney, plain (one discount per order) and modified (three per order).

Follows Chen & Goodman (1998), "An empirical study of smoothing techniques for language
modeling", section 3.5 and equation (26), in the form KenLM's `lmplz` implements by default
(Heafield, Pouzyrevsky, Clark & Koehn 2013, "Scalable modified Kneser-Ney language model
estimation"):

1. Adjusted counts a(.) (Kneser & Ney 1995): the highest order keeps raw counts; a lower-order
   n-gram gets its continuation count, the number of distinct words seen to its left, because it
   is only ever used when the longer context was not seen. N-grams starting with `<s>` cannot
   be extended to the left and keep their raw counts. `<s>` as a unigram has count 0.
2. Discounts from each order's count-of-counts n_j (number of n-grams with adjusted count j):
   Y = n1 / (n1 + 2 n2); modified: D_j = j - (j + 1) Y n_{j+1} / n_j for j = 1, 2, 3+;
   plain Kneser-Ney: D = Y for every count.
3. Per context h: u(w | h) = (a(h w) - D(a(h w))) / sum_x a(h x) and the freed mass
   gamma(h) = sum_j D_j N_j(h) / sum_x a(h x), N_j(h) the number of words with a(h w) = j (3+).
4. Interpolation, lowest order first: p(w | h) = u(w | h) + gamma(h) p(w | h'), bottoming out
   in the uniform distribution over the vocabulary without `<s>` (so `<unk>`, count 0, gets only
   its uniform share gamma(empty) / (V - 1)).
5. Back-off form: a listed n-gram carries p(w | h); a context's back-off weight is gamma(h),
   since an unseen word after h gets exactly gamma(h) p(w | h').

With `discount_fallback`, an order whose count-of-counts give no valid discounts takes fixed
ones instead, as `lmplz --discount_fallback` does (KenLM's defaults D1, D2, D3+ = 0.5, 1, 1.5).
Character models need it: every character follows many distinct characters, so no unigram has
an adjusted count of 1, 2 or 3.
"""

from __future__ import annotations

import numpy as np

from lmserve.export.ngram.smoothing.base import (
    BackoffModel,
    FloatArray,
    blocks,
    lower_order_probs,
    per_context,
    predictable_words,
)
from lmserve.export.ngram.tables import IndexArray, NgramCounts, bos_range
from lmserve.export.ngram.vocab import BOS_ID

KENLM_FALLBACK = (0.5, 1.0, 1.5)


def adjusted_counts(counts: NgramCounts, k: int) -> IndexArray:
    """Step 1 for order k: raw counts at the top order and for `<s>`-initial n-grams, else
    continuation counts (how many distinct n-grams of the next order end with this one)."""
    table = counts.orders[k - 1]
    if k == counts.order:
        a = table.count.copy()
    else:
        longer = counts.orders[k]
        a = np.bincount(longer.suffix, minlength=len(table)).astype(table.count.dtype)
        starts_with_bos = bos_range(counts, k)
        a[starts_with_bos] = table.count[starts_with_bos]
    if k == 1:
        a[BOS_ID] = 0
    return a


def count_of_counts(adjusted: IndexArray, up_to: int = 4) -> list[int]:
    """n_1 .. n_up_to: how many n-grams have adjusted count exactly j."""
    small = np.bincount(adjusted[(adjusted > 0) & (adjusted <= up_to)], minlength=up_to + 1)
    return [int(x) for x in small[1 : up_to + 1]]


def modified_discounts(n: list[int], order: int) -> list[float]:
    """Step 2, Chen & Goodman eq. (26): [D1, D2, D3+] from n1..n4."""
    if min(n[:3]) == 0:
        raise ValueError(
            f"cannot estimate modified Kneser-Ney discounts for {order}-grams: count-of-counts "
            f"n1..n3 = {n[:3]} has a zero (corpus too small or artificial; try kneser-ney)"
        )
    y = n[0] / (n[0] + 2.0 * n[1])
    discounts = [j - (j + 1) * y * n[j] / n[j - 1] for j in (1, 2, 3)]
    for j, d in enumerate(discounts, start=1):
        if not 0.0 <= d <= j:
            raise ValueError(f"{order}-gram discount D{j} = {d} is out of range [0, {j}]")
    return discounts


def plain_discount(n: list[int], order: int) -> float:
    """Kneser & Ney's single discount D = n1 / (n1 + 2 n2) (Ney, Essen & Kneser 1994)."""
    if n[0] == 0:
        raise ValueError(f"cannot estimate the Kneser-Ney discount for {order}-grams: n1 = 0")
    return n[0] / (n[0] + 2.0 * n[1])


def order_discounts(
    n: list[int], order: int, *, modified: bool, fallback: tuple[float, float, float] | None
) -> tuple[list[float], bool]:
    """[D1, D2, D3+] for one order (three equal ones for plain Kneser-Ney), and whether they are
    the fallback's."""
    try:
        if modified:
            return modified_discounts(n, order), False
        return [plain_discount(n, order)] * 3, False
    except ValueError:
        if fallback is None:
            raise
    return (list(fallback) if modified else [fallback[0]] * 3), True


def smooth_kneser_ney(
    counts: NgramCounts,
    *,
    modified: bool = True,
    discount_fallback: tuple[float, float, float] | None = None,
) -> BackoffModel:
    """The discounts of every order now (they fail early, and go in `info`); each order's
    probabilities when the writer asks for them (`BackoffModel.orders`)."""
    discounts: list[list[float]] = []
    all_n: list[int] = []
    fallback_orders: list[float] = []
    for k in range(1, counts.order + 1):
        n = count_of_counts(adjusted_counts(counts, k))
        order_d, fell_back = order_discounts(n, k, modified=modified, fallback=discount_fallback)
        if fell_back:
            fallback_orders.append(float(k))
        discounts.append(order_d)
        all_n += n
    uniform = 1.0 / predictable_words(counts.vocab_size)

    def level(k: int, lower: FloatArray | None) -> tuple[FloatArray, FloatArray | None]:
        table = counts.orders[k - 1]
        a = adjusted_counts(counts, k)
        # Discount by count bucket: a = 0 (only <unk>, <s> unigrams) loses nothing.
        by_bucket = np.array([0.0, *discounts[k - 1]])

        def discount(part: slice) -> FloatArray:
            return by_bucket[np.minimum(a[part], 3)]

        denominator = per_context(counts, k, a)
        gamma = per_context(counts, k, discount)  # the freed mass, then gamma in place
        empty = denominator == 0
        with np.errstate(divide="ignore", invalid="ignore"):
            gamma /= denominator
        gamma[empty] = 1.0
        del empty
        p = np.empty(len(table), dtype=np.float64)
        for part in blocks(len(table)):
            context = table.context[part]
            u = (a[part] - discount(part)) / denominator[context]
            lower_p = uniform if k == 1 else lower_order_probs(counts, lower, k, part)
            u += gamma[context] * lower_p
            p[part] = u
        del denominator
        if k == 1:
            p[BOS_ID] = 0.0
            return p, None
        # gamma of order k's contexts = back-off weights of order k-1. A context no n-gram
        # follows has gamma 1 already (denominator 0); every n-gram that follows one has an
        # adjusted count of at least 1, so a listed context never has denominator 0.
        return p, gamma

    info = {
        "discounts": [d for order_d in discounts for d in order_d],
        "count_of_counts": [float(x) for x in all_n],
        "fallback_orders": fallback_orders,
    }
    return BackoffModel(counts=counts, level=level, info=info)
