"""Reading a different number of tokens per row after a batch state, for any stepper whose
state can be selected and merged by row (recurrent models, transformers).

Rows with chunks of equal length run together, so no padding ever enters a state, each
group in windows of at most `window` tokens; the rows' results come back in their order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

# (tokens [b, t], state of those b rows) -> (log-probs after each row's last token [b, V], state)
Forward = Callable[[npt.NDArray[np.int64], Any], tuple[npt.NDArray[Any], Any]]


def feed_in_groups(
    chunks: Sequence[Sequence[int]],
    state: Any,
    *,
    window: int,
    forward: Forward,
    select: Callable[[Any, Sequence[int]], Any],
    merge: Callable[[Sequence[Any]], Any],
) -> tuple[npt.NDArray[Any], Any]:
    """Each row's chunk (one token at least) read after its state: the log-probs after each
    row's last token [B, V] and the new batch state."""
    if any(len(row) == 0 for row in chunks):
        raise ValueError("feed needs at least one token per row")
    by_length: dict[int, list[int]] = {}
    for i, row in enumerate(chunks):
        by_length.setdefault(len(row), []).append(i)
    out: npt.NDArray[Any] | None = None
    rows_state: list[Any] = [None] * len(chunks)
    for length, rows in by_length.items():
        tokens = np.asarray([list(chunks[i]) for i in rows], dtype=np.int64)
        sub = state if len(rows) == len(chunks) else select(state, rows)
        log_probs = None
        for start in range(0, length, window):
            log_probs, sub = forward(np.ascontiguousarray(tokens[:, start : start + window]), sub)
        assert log_probs is not None
        if len(rows) == len(chunks):  # one group: no gather, no copy
            return log_probs, sub
        if out is None:  # the model's own precision
            out = np.empty((len(chunks), log_probs.shape[1]), dtype=log_probs.dtype)
        out[rows] = log_probs
        for j, i in enumerate(rows):
            rows_state[i] = select(sub, [j])
    assert out is not None
    return out, merge(rows_state)
