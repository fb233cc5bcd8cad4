"""The sampling filters computed the straightforward way: the reference the fast path is tested
against.

    probs = filtered_probs(logits, [SamplingParams(top_p=0.9)])   # dense [S, V], renormalised

`decoding.sampling` turns every filter into a threshold on p / p_max and draws in two levels
without sorting the vocabulary. Here the filters follow their definitions literally: candidates
(the most probable, by `np.argpartition`), sorted by probability (ties by position), top-k and
top-p as prefixes of that order, min-p against the first, typical-p by a stable sort of the
distances to the entropy; and the draw is a cumulative sum over the whole row. Slow and plain.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from lmserve.server.backends.base import FloatArray
from lmserve.server.decoding.draw import BoolArray, IdArray, LogitArray
from lmserve.server.decoding.params import SamplingParams

# The first cut to candidates; rows whose set does not fit are redone over the vocabulary.
DEFAULT_CANDIDATES = 256


def truncate_sorted(
    logits: LogitArray, params: Sequence[SamplingParams], candidates: int
) -> tuple[IdArray, FloatArray, BoolArray]:
    """Step 5 on tempered logits [S, V]: candidate ids [S, C] (most probable first), their kept
    probabilities [S, C] (0 where a filter dropped them; not renormalised), and whether the row
    was decided within the C candidates (else it must be redone with C = V)."""
    s, v = logits.shape
    top_k = np.array([p.top_k for p in params], dtype=np.int64)
    top_p = np.array([p.top_p for p in params])
    min_p = np.array([p.min_p for p in params])
    typical = np.array([p.typical_p for p in params])
    c = min(v, max(candidates, int(top_k.max(initial=0))))
    if c < v:  # O(V) selection of the c largest (no negated copy), then sort only those
        part = np.argpartition(logits, v - c, axis=1)[:, v - c :]
    else:
        part = np.broadcast_to(np.arange(v), (s, v))
    values = np.take_along_axis(logits, part, axis=1)
    order = np.argsort(-values, axis=1, kind="stable")
    cand = np.take_along_axis(part, order, axis=1)
    values = np.take_along_axis(values, order, axis=1).astype(np.float64)
    # Probabilities relative to the most probable token; only top-p without top-k needs them
    # under the whole tempered distribution (a normaliser over all V tokens: an exp pass over
    # the vocabulary, which every other filter is spared, being scale-free).
    has_k = top_k > 0
    log_z = values[:, :1].copy()
    whole = np.flatnonzero((top_p < 1.0) & ~has_k)
    if len(whole):
        shifted = logits[whole] - values[whole, :1].astype(logits.dtype)
        log_z[whole] += np.log(np.exp(shifted).sum(axis=1, dtype=np.float64, keepdims=True))
    probs = np.exp(values - log_z)
    pos = np.arange(c)[None, :]
    keep = np.isfinite(values)
    # top-k: the k most probable.
    keep &= pos < np.where(has_k, top_k, c)[:, None]
    # top-p (Holtzman et al., 2020): keep token j while the mass before it is < p, i.e. the
    # smallest prefix reaching p. Renormalised over top-k's survivors; without top-k the
    # survivors are all V tokens, whose mass is 1 by construction.
    kept = probs * keep
    total = np.where(has_k, kept.sum(axis=1), 1.0)
    mass_before = (np.cumsum(kept, axis=1) - kept) / total[:, None]
    keep &= (mass_before < top_p[:, None]) | (top_p >= 1.0)[:, None]
    # min-p: relative to the most probable token (column 0), so renormalising changes nothing.
    keep &= probs >= (min_p * probs[:, 0])[:, None]
    # Decided here unless the survivors may run past the candidates.
    complete = (c == v) | has_k | ~keep[:, -1]
    # typical-p (Meister et al., 2022): on the survivors renormalised, H = -sum q log q; keep
    # the tokens closest to "expected surprise" (|-log q - H| smallest) until their mass
    # reaches typical_p.
    rows = np.flatnonzero(typical < 1.0)
    if len(rows):
        q = probs[rows] * keep[rows]
        q /= q.sum(axis=1, keepdims=True)
        with np.errstate(divide="ignore", invalid="ignore"):
            log_q = np.log(q)
            entropy = -np.where(q > 0, q * log_q, 0.0).sum(axis=1, keepdims=True)
            deviation = np.where(q > 0, np.abs(-log_q - entropy), np.inf)
        by_dev = np.argsort(deviation, axis=1, kind="stable")
        q_sorted = np.take_along_axis(q, by_dev, axis=1)
        before = np.cumsum(q_sorted, axis=1) - q_sorted
        typical_keep = np.zeros_like(keep[rows])
        np.put_along_axis(typical_keep, by_dev, before < typical[rows, None], axis=1)
        keep[rows] &= typical_keep
    return cand, probs * keep, complete


def draw_cumulative(weights: LogitArray, uniforms: FloatArray) -> IdArray:
    """Inverse CDF per row: the first index whose cumulative weight reaches u * total, u in
    (0, 1]; zero-weight entries are never chosen."""
    cum = np.cumsum(weights, axis=1, dtype=np.float64)
    target = uniforms[:, None] * cum[:, -1:]
    index = (cum < target).sum(axis=1)
    return np.asarray(np.minimum(index, weights.shape[1] - 1), dtype=np.int64)


def filtered_probs(
    logits: npt.ArrayLike,
    params: Sequence[SamplingParams],
    *,
    candidates: int = DEFAULT_CANDIDATES,
) -> FloatArray:
    """The distribution a non-greedy row samples from, dense [S, V]: tempered, truncated and
    renormalised (steps 4-5 on already penalised logits). For tests and inspection."""
    x = np.atleast_2d(np.asarray(logits, dtype=np.float64))
    temps = np.array([p.temperature for p in params])
    tempered = x / temps[:, None]
    cand, w, complete = truncate_sorted(tempered, params, candidates)
    out = np.zeros_like(x)
    np.put_along_axis(out, cand, w, axis=1)
    for i in np.flatnonzero(~complete).tolist():  # the nucleus did not fit: a full sort
        c2, w2, _ = truncate_sorted(tempered[i : i + 1], [params[i]], x.shape[1])
        out[i] = 0.0
        out[i, c2[0]] = w2[0]
    return np.asarray(out / out.sum(axis=1, keepdims=True), dtype=np.float64)
