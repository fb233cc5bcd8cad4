"""Jelinek-Mercer linear interpolation with one weight per order, tuned on held-out text.

p_k(w | h) = lambda_k p_ML(w | h) + (1 - lambda_k) p_{k-1}(w | h'), down to
p_0(w) = 1 / V' (uniform over the vocabulary without `<s>`) (Jelinek & Mercer 1980; Chen &
Goodman 1998, section 2.3). If the context h was never seen, p_ML is undefined and the model
backs off unchanged: p_k = p_{k-1}.

Tuning (not EM): coordinate ascent on the held-out log-likelihood of the full model. Held
fixed all weights but lambda_k, every token's probability is affine in lambda_k, so the 1-D
objective is concave and its maximum, where its decreasing slope changes sign, is found by
bisection to machine precision; sweeps over the orders repeat until no weight moves.

Back-off form: a listed n-gram carries p_k(w | h); an unseen word after a seen context h gets
(1 - lambda_k) p_{k-1}(w | h'), so the back-off weight of every seen context is 1 - lambda_k.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from lmserve.export.ngram.smoothing.base import (
    BackoffModel,
    FloatArray,
    context_totals,
    lower_order_probs,
    predictable_words,
)
from lmserve.export.ngram.tables import NgramCounts, locate
from lmserve.export.ngram.vocab import BOS_ID, EncodedCorpus

_EPS = 1e-6


def _ml_unigrams(counts: NgramCounts) -> FloatArray:
    count = counts.orders[0].count.astype(np.float64)
    count[BOS_ID] = 0.0
    result: FloatArray = count / count.sum()
    return result


def best_weight(x: FloatArray, y: FloatArray, iterations: int = 60) -> float:
    """argmax over lambda in [eps, 1 - eps] of sum log(x + lambda y), where x + lambda y > 0.

    The objective is concave, its slope sum y / (x + lambda y) decreases in lambda: bisect it.
    """

    def slope(lam: float) -> float:
        return float(np.sum(y / (x + lam * y)))

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


def _heldout_ml(
    counts: NgramCounts, heldout: EncodedCorpus
) -> tuple[list[FloatArray], list[npt.NDArray[np.bool_]]]:
    """Per order k, for every predicted held-out token: p_ML(w | h) and whether h was seen."""
    nodes = locate(counts, heldout)
    targets = np.flatnonzero(heldout.pos >= 1)  # every word and </s>; <s> is context only
    mls = [_ml_unigrams(counts)[heldout.ids[targets]]]
    seens = [np.ones(len(targets), dtype=bool)]
    for k in range(2, counts.order + 1):
        table = counts.orders[k - 1]
        totals = context_totals(counts, k)
        ok = heldout.pos[targets] >= k - 1
        context = np.full(len(targets), -1, dtype=np.int64)
        context[ok] = nodes[k - 2][targets[ok] - 1]
        seen = context >= 0
        seen[seen] &= totals[context[seen]] > 0
        node = np.where(seen, nodes[k - 1][targets], -1)
        ml = np.zeros(len(targets))
        found = node >= 0
        ml[found] = table.count[node[found]] / totals[context[found]]
        mls.append(ml)
        seens.append(seen)
    return mls, seens


def tune_weights(
    counts: NgramCounts, heldout: EncodedCorpus, sweeps: int = 50, tolerance: float = 1e-7
) -> list[float]:
    """One lambda per order maximising held-out likelihood, by coordinate ascent.

    The model's probability of a held-out token is affine in any single lambda_k (the orders
    above only scale and shift p_k), p_N = C + D p_k, so each coordinate step maximises the
    concave sum log(C + D b + lambda_k D (a - b)) exactly (`best_weight`); sweeps repeat until
    no weight moves. Every step can only raise the likelihood.
    """
    mls, seens = _heldout_ml(counts, heldout)
    n_orders = counts.order
    uniform = 1.0 / predictable_words(counts.vocab_size)
    weights = [0.5] * n_orders
    for _ in range(sweeps):
        largest_move = 0.0
        for k in range(n_orders):
            # b: p_{k-1} at every token, from the current lower weights.
            b = np.full(len(mls[0]), uniform)
            for j in range(k):
                b = np.where(seens[j], weights[j] * mls[j] + (1 - weights[j]) * b, b)
            # p_N = C + D p_k, composing the orders above k.
            c, d = np.zeros_like(b), np.ones_like(b)
            for j in range(k + 1, n_orders):
                c = np.where(seens[j], weights[j] * mls[j] + (1 - weights[j]) * c, c)
                d = np.where(seens[j], (1 - weights[j]) * d, d)
            s = seens[k]
            new = best_weight(c[s] + d[s] * b[s], d[s] * (mls[k][s] - b[s]))
            largest_move = max(largest_move, abs(new - weights[k]))
            weights[k] = new
        if largest_move < tolerance:
            break
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
    chosen = weights

    def level(k: int, lower: FloatArray | None) -> tuple[FloatArray, FloatArray | None]:
        lam = chosen[k - 1]
        if k == 1:
            p1 = lam * _ml_unigrams(counts) + (1 - lam) * uniform
            p1[BOS_ID] = 0.0
            return p1, None
        table = counts.orders[k - 1]
        totals = context_totals(counts, k)
        ml = table.count / totals[table.context]
        probs = lam * ml + (1 - lam) * lower_order_probs(counts, lower, k)
        return probs, np.where(totals > 0, 1.0 - lam, 1.0)

    return BackoffModel(counts=counts, level=level, info={"weights": weights})
