"""Steps 5-6 of `decoding.sampling`: truncation as thresholds on weights, and the draw.

    ids = _draw_full(logits, row_max, inv_temps, uniforms)      # untruncated rows
    weights = _threshold_weights(tempered, params)               # top-k/top-p/min-p/typical-p
    ids = _draw_blocks(weights, uniforms)                        # truncated rows

Kept apart from the per-row bookkeeping of `sampling` (penalties, bans, generators), which
calls these; `sampling`'s module docstring explains the method and its cost.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from lmserve.server.backends.base import FloatArray
from lmserve.server.decoding.params import SamplingParams

try:  # the draw in C (`_draw.c`): the same search, one pass over each row
    from lmserve.server.decoding import _draw
except ImportError:  # not compiled (a source checkout without `make install`): numpy
    _draw = None  # type: ignore[assignment]

IdArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
# Logits as sampling holds them: the model's float32 (or float64) log-probs, copied once.
LogitArray = npt.NDArray[np.floating[Any]]
# The whole-vocabulary draw finds its token in two levels: blocks of this many tokens, then
# the token inside the chosen block (see `_draw_full`).
DRAW_BLOCK = 128


def _draw_full(
    logits: LogitArray, row_max: LogitArray, inv_temps: FloatArray, uniforms: FloatArray
) -> IdArray:
    """Inverse CDF over each row's whole tempered distribution, with no sort and no cumulative
    sum over the vocabulary: the first token whose cumulative weight reaches u * total, u in
    (0, 1], as `reference_sampling.draw_cumulative` chooses; zero-weight tokens never.

    float32 rows go to the C draw (`_draw.c`: weights, block sums and the search in one pass
    over each row); others get the weights exp((x - max) / T) computed in place by numpy and
    drawn from by `_draw_blocks`. A full-vocabulary cumsum per row (and its float64 copy) cost
    several times the model step at batch 32; the numpy path costs about one pass, C less.
    """
    if _c_rows(logits):
        out = np.empty(len(logits), dtype=np.int64)
        maxes = np.ascontiguousarray(row_max, dtype=np.float32)
        _draw.draw_logits(logits, logits.shape[1], maxes, _f64(inv_temps), _f64(uniforms), out)
        return out
    weights, body = _padded(len(logits), logits.shape[1], logits.dtype)
    np.subtract(logits, row_max[:, None], out=body)
    if np.any(inv_temps != 1.0):
        body *= inv_temps.astype(logits.dtype)[:, None]
    np.exp(body, out=body)
    return _draw_blocks(weights, uniforms)


def _c_rows(rows: LogitArray) -> bool:
    """Whether the C draw takes these rows: float32 (the models' precision), C-contiguous."""
    return _draw is not None and rows.dtype == np.float32 and rows.flags.c_contiguous


def _f64(values: FloatArray) -> FloatArray:
    return np.ascontiguousarray(values, dtype=np.float64)


def _padded(s: int, v: int, dtype: np.dtype[Any]) -> tuple[LogitArray, LogitArray]:
    """A zeroed [S, V + pad] buffer of whole DRAW_BLOCKs (the padding keeps weight 0) and its
    [S, V] view to fill."""
    weights: LogitArray = np.zeros((s, v + (-v) % DRAW_BLOCK), dtype=dtype)
    return weights, weights[:, :v]


def _draw_blocks(weights: LogitArray, uniforms: FloatArray) -> IdArray:
    """The cumulative draw over non-negative weights [S, n * DRAW_BLOCK], in two levels (float64):
    block sums pick the block holding the target u * total, then a cumulative sum over that
    block alone picks the token."""
    s, width = weights.shape
    if _c_rows(weights):
        out = np.empty(s, dtype=np.int64)
        _draw.draw_weights(weights, width, _f64(uniforms), out)
        return out
    blocks = weights.reshape(s, width // DRAW_BLOCK, DRAW_BLOCK)
    # einsum's summing loop is ~4x faster here than .sum(axis=2) over short rows.
    block_sums = np.einsum("sbk->sb", blocks).astype(np.float64)
    cumulative = np.cumsum(block_sums, axis=1)
    target = uniforms * cumulative[:, -1]
    rows = np.arange(s)
    # First block whose cumulative sum reaches the target; it has weight (the sum rose there).
    block = np.minimum((cumulative < target[:, None]).sum(axis=1), blocks.shape[1] - 1)
    inner = blocks[rows, block]  # [S, DRAW_BLOCK]
    before = cumulative[rows, block] - block_sums[rows, block]
    inner_cum = np.cumsum(inner, axis=1, dtype=np.float64) + before[:, None]
    index = (inner_cum < target[:, None]).sum(axis=1)
    # Rounding can leave the block's own running sum a hair under its block sum: never step
    # past the block's last token with weight.
    last = DRAW_BLOCK - 1 - np.argmax(inner[:, ::-1] > 0, axis=1)
    token: IdArray = (block * DRAW_BLOCK + np.minimum(index, last)).astype(np.int64)
    return token


def _threshold_weights(tempered: LogitArray, params: Sequence[SamplingParams]) -> LogitArray:
    """Step 5 as thresholds: padded weights (see `_padded`) holding p / p_max for the tokens
    top-k, top-p, min-p and typical-p keep and 0 for the others.

    top-k and top-p keep a prefix of the tokens ordered by probability (ties by id): its length
    comes from one sort of the weights (top-p renormalised over top-k's survivors, whose mass
    is the prefix's), and the prefix is every token above the length-th weight plus the ties at
    it in id order. No argsort: a value sort over 12k tokens costs a fifth of an argsort, and
    the draw needs no order. min-p is a threshold on p / p_max itself; typical-p is
    `_typical_set` over what the others kept.
    """
    s, v = tempered.shape
    weights, body = _padded(s, v, tempered.dtype)
    np.subtract(tempered, tempered.max(axis=1, keepdims=True), out=body)
    np.exp(body, out=body)
    length = np.array([min(p.top_k, v) if p.top_k > 0 else v for p in params], dtype=np.int64)
    top_p = np.array([p.top_p for p in params])
    min_p = np.array([p.min_p for p in params], dtype=tempered.dtype)
    threshold = np.zeros(s, dtype=body.dtype)  # the length-th largest weight of a cut row
    nucleus = np.flatnonzero(top_p < 1.0)
    if len(nucleus):
        ranked, view = _padded(len(nucleus), v, body.dtype)
        view[:] = np.sort(body[nucleus], axis=1)[:, ::-1]
        limited = np.flatnonzero(length[nucleus] < v)
        if len(limited):  # top-p over top-k's survivors: their mass only
            view[limited] *= np.arange(v)[None, :] < length[nucleus[limited], None]
        # The prefix ends at the first token whose cumulative mass reaches p (the two-level
        # search of the draw, with u = p): every token before it has mass before it < p.
        last = _draw_blocks(ranked, top_p[nucleus])
        length[nucleus] = np.minimum(length[nucleus], last + 1)
        threshold[nucleus] = view[np.arange(len(nucleus)), length[nucleus] - 1]
    only_k = np.flatnonzero((length < v) & (top_p >= 1.0))
    for k in np.unique(length[only_k]).tolist():  # one O(V) partition per distinct k
        rows = only_k[length[only_k] == k]
        threshold[rows] = np.partition(body[rows], v - k, axis=1)[:, v - k]
    cut = np.flatnonzero(length < v)
    if len(cut):
        whole = len(cut) == s
        sub = body if whole else body[cut]
        bound = threshold[cut][:, None]
        above = sub > bound
        ties = sub == bound
        room = length[cut] - above.sum(axis=1)
        keep = above | ties
        crowded = np.flatnonzero(ties.sum(axis=1) > room)  # more ties than places: by id
        if len(crowded):
            first = np.cumsum(ties[crowded], axis=1) <= room[crowded, None]
            keep[crowded] = above[crowded] | (ties[crowded] & first)
        if whole:
            body *= keep
        else:
            body[cut] = sub * keep
    if np.any(min_p > 0):
        body *= body >= min_p[:, None]
    typical = np.array([p.typical_p for p in params])
    rows = np.flatnonzero(typical < 1.0)
    if len(rows):
        body[rows] *= _typical_set(body[rows], typical[rows])
    return weights


def _typical_set(weights: LogitArray, typical: FloatArray) -> BoolArray:
    """typical-p (Meister et al., 2022) over the survivors' weights [S, V] (0 = dropped): with q
    the survivors renormalised and H = -sum q log q, the tokens ordered by |-log q - H| (ties by
    id) whose mass before them is < typical_p, as a mask.

    The order is never materialised: the last kept distance is found by bisection over the
    sorted distances (a value sort, then ~log2 V masked sums), then every token closer than it
    is kept and the tokens at it in id order.
    """
    q = weights.astype(np.float64)
    q /= q.sum(axis=1, keepdims=True)
    alive = q > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        log_q = np.log(q)
        entropy = -np.where(alive, q * log_q, 0.0).sum(axis=1, keepdims=True)
        distance = np.where(alive, np.abs(-log_q - entropy), np.inf)
    ranked = np.sort(distance, axis=1)
    s = len(q)
    rows = np.arange(s)
    # Bisection for the smallest ranked distance whose mass (every token at most that far)
    # reaches typical_p; the survivors' total is 1, so the last survivor always qualifies.
    lo = np.zeros(s, dtype=np.int64)
    hi = alive.sum(axis=1) - 1
    while np.any(lo < hi):
        mid = (lo + hi) // 2
        # einsum over the boolean mask: ~5x faster than summing a np.where copy.
        mass = np.einsum("sv,sv->s", distance <= ranked[rows, mid][:, None], q)
        reached = mass >= typical
        hi = np.where(reached, mid, hi)
        lo = np.where(reached, lo, mid + 1)
    bound = ranked[rows, lo][:, None]
    closer = distance < bound
    ties = distance == bound
    keep: npt.NDArray[np.bool_] = closer | ties
    # Tokens at the bound are kept in id order while the mass before them is < typical_p.
    crowded = np.flatnonzero(ties.sum(axis=1) > 1)
    if len(crowded):
        tied = np.where(ties[crowded], q[crowded], 0.0)
        before = np.where(closer[crowded], q[crowded], 0.0).sum(axis=1, keepdims=True)
        before = before + np.cumsum(tied, axis=1) - tied
        keep[crowded] = closer[crowded] | (ties[crowded] & (before < typical[crowded, None]))
    return keep
