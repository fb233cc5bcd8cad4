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
    context_totals,
    lower_order_probs,
    per_context,
    predictable_words,
)
from lmserve.export.ngram.tables import IndexArray, NgramCounts, bos_range
from lmserve.export.ngram.vocab import BOS_ID

KENLM_FALLBACK = (0.5, 1.0, 1.5)


def adjusted_counts(counts: NgramCounts) -> list[IndexArray]:
    """Step 1: raw counts at the top order and for `<s>`-initial n-grams, else continuation
    counts (how many distinct n-grams of the next order end with this one)."""
    adjusted: list[IndexArray] = []
    top = counts.order
    for k, table in enumerate(counts.orders, start=1):
        if k == top:
            a = table.count.copy()
        else:
            longer = counts.orders[k]
            a = np.bincount(longer.suffix, minlength=len(table)).astype(table.count.dtype)
            starts_with_bos = bos_range(counts, k)
            a[starts_with_bos] = table.count[starts_with_bos]
        if k == 1:
            a[BOS_ID] = 0
        adjusted.append(a)
    return adjusted


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
    adjusted = adjusted_counts(counts)
    uniform = 1.0 / predictable_words(counts.vocab_size)
    probs: list[FloatArray] = []
    gammas: list[FloatArray] = []
    all_discounts: list[float] = []
    fallback_orders: list[float] = []
    for k, table in enumerate(counts.orders, start=1):
        a = adjusted[k - 1]
        discounts, fell_back = order_discounts(
            count_of_counts(a), k, modified=modified, fallback=discount_fallback
        )
        d1, d2, d3 = discounts
        if fell_back:
            fallback_orders.append(float(k))
        all_discounts += [d1, d2, d3]
        # Discount by count bucket: a = 0 (only <unk>, <s> unigrams) loses nothing.
        discount = np.array([0.0, d1, d2, d3])[np.minimum(a, 3)]
        denominator = per_context(counts, k, a)
        freed = per_context(counts, k, discount)
        with np.errstate(divide="ignore", invalid="ignore"):
            gamma = np.where(denominator > 0, freed / denominator, 1.0)
        u = (a - discount) / denominator[table.context]
        lower = uniform if k == 1 else lower_order_probs(counts, probs, k)
        p = u + gamma[table.context] * lower
        if k == 1:
            p[BOS_ID] = 0.0
        probs.append(p)
        gammas.append(gamma)
    # gamma of order k+1's contexts = back-off weights of order k's n-grams; 1 for non-contexts.
    backoffs = [
        np.where(context_totals(counts, k + 1) > 0, gammas[k], 1.0) for k in range(1, counts.order)
    ]
    info = {
        "discounts": all_discounts,
        "count_of_counts": [float(x) for x in _all_n(adjusted)],
        "fallback_orders": fallback_orders,
    }
    return BackoffModel(counts=counts, probs=probs, backoffs=backoffs, info=info)


def _all_n(adjusted: list[IndexArray]) -> list[int]:
    return [x for a in adjusted for x in count_of_counts(a)]
