"""What a Fuse answer gives of one hypothesis's next-token distribution (natural logs).

    top_ids, top_lps = top_k(rows, 5)   # per row: the 5 most probable ids, ties by lower id

`top_k` is exact against sorting each whole row by (-log-prob, id): a cut through a run of
equal log-probs (an n-gram model's backed-off words often share one) keeps the lowest ids, so
the answer is the same whatever order a partition visits the row in.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt


def top_k(
    rows: npt.NDArray[np.floating], k: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """Each row's k most probable ids and their log-probs [n, k], most probable first."""
    n, vocab = rows.shape
    k = min(k, vocab)
    ids = np.empty((n, k), dtype=np.int64)
    if k == 0 or n == 0:
        return ids, np.empty((n, k), dtype=np.float64)
    for r in range(n):
        row = rows[r]
        # The k-th largest value: every id above it is in, and the lowest ids equal to it fill
        # the rest.
        kth = np.partition(row, vocab - k)[vocab - k]
        above = np.flatnonzero(row > kth)
        equal = np.flatnonzero(row == kth)[: k - len(above)]
        chosen = np.concatenate([above, equal])
        order = np.lexsort((chosen, -row[chosen]))
        ids[r] = chosen[order]
    return ids, np.take_along_axis(rows, ids, axis=1).astype(np.float64)
