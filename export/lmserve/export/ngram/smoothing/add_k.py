"""Add-k (Laplace for k = 1) with Katz-style back-off so that each context sums to 1.

Every predictable word (the vocabulary without `<s>`, V' words) gets k pseudo-counts:
p(w | h) = (c(h w) + k) / (c(h) + k V'). Unigrams are listed for every word, so the unigram
level is exactly add-k. For a longer seen context h only the seen n-grams can be listed; the
mass add-k gives the unseen words, k (V' - n(h)) / (c(h) + k V'), is spread over them in
proportion to the lower order instead (Katz 1987's normalisation):
backoff(h) = (1 - sum_{w seen after h} p(w | h)) / (1 - sum_{w seen after h} p(w | h')).
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
from lmserve.export.ngram.tables import NgramCounts
from lmserve.export.ngram.vocab import BOS_ID


def smooth_add_k(counts: NgramCounts, k_add: float = 1.0) -> BackoffModel:
    if k_add <= 0:
        raise ValueError(f"add-k needs k > 0, got {k_add}")
    vp = predictable_words(counts.vocab_size)

    def level(k: int, lower: FloatArray | None) -> tuple[FloatArray, FloatArray | None]:
        table = counts.orders[k - 1]
        count = table.count.astype(np.float64)
        if k == 1:
            count[BOS_ID] = 0.0
            p = (count + k_add) / (count.sum() + k_add * vp)
            p[BOS_ID] = 0.0
            return p, None
        totals = context_totals(counts, k)
        p = (count + k_add) / (totals[table.context] + k_add * vp)
        del count
        # Left-over mass of each context and the lower-order mass of its seen words.
        left = 1.0 - per_context(counts, k, p)
        lower_seen = per_context(counts, k, lower_order_probs(counts, lower, k))
        with np.errstate(divide="ignore", invalid="ignore"):
            weight = np.where(totals > 0, np.clip(left, 0.0, None) / (1.0 - lower_seen), 1.0)
        weight[~np.isfinite(weight)] = 0.0  # every word seen: nothing left to back off to
        return p, weight

    return BackoffModel(counts=counts, level=level, info={"k": [k_add]})
