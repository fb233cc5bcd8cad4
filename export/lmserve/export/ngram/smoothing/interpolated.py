"""Jelinek-Mercer linear interpolation with one weight per order, tuned on held-out text.

p_k(w | h) = lambda_k p_ML(w | h) + (1 - lambda_k) p_{k-1}(w | h'), down to
p_0(w) = 1 / V' (uniform over the vocabulary without `<s>`) (Jelinek & Mercer 1980; Chen &
Goodman 1998, section 2.3). If the context h was never seen, p_ML is undefined and the model
backs off unchanged: p_k = p_{k-1}.

Tuning: orders are tuned bottom-up, lambda_k maximising the held-out log-likelihood of the
order-k model with the lower weights fixed. That objective, sum log(lambda a + (1 - lambda) b),
is concave in lambda, so its maximum is where the derivative
sum (a - b) / (lambda a + (1 - lambda) b), which decreases in lambda, changes sign: found by
bisection to machine precision (an exact 1-D search, not EM).

Back-off form: a listed n-gram carries p_k(w | h); an unseen word after a seen context h gets
(1 - lambda_k) p_{k-1}(w | h'), so the back-off weight of every seen context is 1 - lambda_k.
"""

from __future__ import annotations

import numpy as np

from lmserve.export.ngram.counting import NgramCounts, locate
from lmserve.export.ngram.smoothing.base import (
    BackoffModel,
    FloatArray,
    context_totals,
    lower_order_probs,
    predictable_words,
)
from lmserve.export.ngram.vocab import BOS_ID, EncodedCorpus

_EPS = 1e-6


def _ml_unigrams(counts: NgramCounts) -> FloatArray:
    count = counts.orders[0].count.astype(np.float64)
    count[BOS_ID] = 0.0
    result: FloatArray = count / count.sum()
    return result


def best_weight(a: FloatArray, b: FloatArray, iterations: int = 60) -> float:
    """argmax over lambda in [eps, 1 - eps] of sum log(lambda a + (1 - lambda) b), b > 0."""

    def slope(lam: float) -> float:
        return float(np.sum((a - b) / (lam * a + (1.0 - lam) * b)))

    lo, hi = _EPS, 1.0 - _EPS
    if slope(lo) <= 0:
        return lo
    if slope(hi) >= 0:
        return hi
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        if slope(mid) > 0:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def tune_weights(counts: NgramCounts, heldout: EncodedCorpus) -> list[float]:
    """One lambda per order, tuned bottom-up on the held-out corpus (see the module docstring)."""
    nodes = locate(counts, heldout)
    targets = np.flatnonzero(heldout.pos >= 1)  # every word and </s>; <s> is context only
    words = heldout.ids[targets]
    uniform = 1.0 / predictable_words(counts.vocab_size)
    ml1 = _ml_unigrams(counts)[words]
    lam = best_weight(ml1, np.full(len(targets), uniform))
    weights = [lam]
    p = lam * ml1 + (1 - lam) * uniform
    for k in range(2, counts.order + 1):
        table = counts.orders[k - 1]
        totals = context_totals(counts, k)
        ok = heldout.pos[targets] >= k - 1
        context = np.full(len(targets), -1, dtype=np.int64)
        context[ok] = nodes[k - 2][targets[ok] - 1]
        seen = context >= 0
        seen[seen] &= totals[context[seen]] > 0
        node = nodes[k - 1][targets[seen]]
        found = node >= 0
        ml = np.zeros(int(seen.sum()))
        ml[found] = table.count[node[found]] / totals[context[seen]][found]
        lam = best_weight(ml, p[seen])
        weights.append(lam)
        p = p.copy()
        p[seen] = lam * ml + (1 - lam) * p[seen]
    return weights


def smooth_interpolated(
    counts: NgramCounts,
    heldout: EncodedCorpus | None = None,
    weights: list[float] | None = None,
) -> BackoffModel:
    """Interpolated model with the given `weights`, or weights tuned on `heldout`."""
    if weights is None:
        if heldout is None:
            raise ValueError("interpolated smoothing needs held-out text to tune its weights")
        weights = tune_weights(counts, heldout)
    if len(weights) != counts.order or not all(0.0 < w <= 1.0 for w in weights):
        raise ValueError(f"need {counts.order} weights in (0, 1], got {weights}")
    uniform = 1.0 / predictable_words(counts.vocab_size)
    p1 = weights[0] * _ml_unigrams(counts) + (1 - weights[0]) * uniform
    p1[BOS_ID] = 0.0
    probs: list[FloatArray] = [p1]
    for k in range(2, counts.order + 1):
        table = counts.orders[k - 1]
        ml = table.count / context_totals(counts, k)[table.context]
        lam = weights[k - 1]
        probs.append(lam * ml + (1 - lam) * lower_order_probs(counts, probs, k))
    backoffs = [
        np.where(context_totals(counts, k + 1) > 0, 1.0 - weights[k], 1.0)
        for k in range(1, counts.order)
    ]
    return BackoffModel(counts=counts, probs=probs, backoffs=backoffs, info={"weights": weights})
