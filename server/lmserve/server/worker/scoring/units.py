"""Cutting a scoring request into units, and the batches a unit's pass reads.

units = cut_units(lengths, unit_tokens=512, unit_rows=64)   # text indexes, longest first
part = gather(batch, units[0])                               # those texts as one batch
merged = concat([part, other_part])                          # units of several requests
"""

from __future__ import annotations

from collections import deque

import numpy as np

from lmserve.server.backends.base import EncodedBatch


def cut_units(lengths: np.ndarray, unit_tokens: int, unit_rows: int) -> deque[np.ndarray]:
    """Text indexes sorted by length (longest first), cut into units of at most `unit_tokens`
    positions (rows x the unit's longest) and `unit_rows` rows; empty texts join the last."""
    order = np.argsort(-lengths, kind="stable")
    units: deque[np.ndarray] = deque()
    start, n = 0, len(order)
    while start < n:
        longest = max(int(lengths[order[start]]), 1)
        rows = max(1, min(unit_rows, unit_tokens // longest, n - start))
        units.append(order[start : start + rows])
        start += rows
    return units


def gather(batch: EncodedBatch, rows: np.ndarray) -> EncodedBatch:
    """The sub-batch of texts `rows`, in that order."""
    starts, ends = batch.offsets[rows], batch.offsets[rows + 1]
    lengths = ends - starts
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if len(batch.ids) and offsets[-1]:
        index = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1])
        ids, oov = batch.ids[index], batch.oov[index]
    else:
        ids, oov = batch.ids[:0], batch.oov[:0]
    starts = None if batch.starts is None else batch.starts[rows]
    return EncodedBatch(ids=ids, offsets=offsets, oov=oov, starts=starts)


def concat(parts: list[EncodedBatch]) -> EncodedBatch:
    """One batch holding the texts of `parts`, in order (parts merge only under the same
    options, so either all read from `<s>` or all from `starts`)."""
    shifts = np.cumsum([0] + [len(b.ids) for b in parts[:-1]])
    offsets = np.concatenate(
        [np.zeros(1, dtype=np.int64)]
        + [b.offsets[1:] + s for b, s in zip(parts, shifts, strict=True)]
    )
    return EncodedBatch(
        ids=np.concatenate([b.ids for b in parts]),
        offsets=offsets,
        oov=np.concatenate([b.oov for b in parts]),
        starts=_starts(parts),
    )


def _starts(parts: list[EncodedBatch]) -> np.ndarray | None:
    starts = [b.starts for b in parts]
    if all(s is None for s in starts):
        return None
    if any(s is None for s in starts):
        raise ValueError("texts read from <s> and from their first token cannot share a pass")
    return np.concatenate([s for s in starts if s is not None])
