"""Maximum likelihood: p(w | h) = c(h w) / c(h), no smoothing at all.

A seen context keeps all its mass, so its back-off weight is 0 (log10 -99 in the file, as KenLM
writes impossible events); an unseen context is not listed and backs off with weight 1.
Held-out text with unseen events gets probability 0 and infinite perplexity.
"""

from __future__ import annotations

import numpy as np

from lmserve.export.ngram.smoothing.base import BackoffModel, FloatArray, context_totals
from lmserve.export.ngram.tables import NgramCounts
from lmserve.export.ngram.vocab import BOS_ID


def smooth_mle(counts: NgramCounts) -> BackoffModel:
    def level(k: int, lower: FloatArray | None) -> tuple[FloatArray, FloatArray | None]:
        table = counts.orders[k - 1]
        count = table.count.astype(np.float64)
        if k == 1:
            count[BOS_ID] = 0.0  # <s> is never predicted
        totals = context_totals(counts, k) if k > 1 else np.array([count.sum()])
        probs = count / totals[table.context]
        if k == 1:
            return probs, None
        # A seen context has weight 0; contexts never followed by anything are never used (1).
        return probs, np.where(totals > 0, 0.0, 1.0)

    return BackoffModel(counts=counts, level=level)
