"""Per-text sums of flat per-token scores, safe for texts that score nothing.

`np.add.reduceat(values, offsets[:-1])` is wrong for empty segments (it repeats
`values[offsets[i]]`) and raises IndexError when an empty segment starts at `len(values)`: the
batch's last text scores no positions (an empty text without `</s>`). Summing only the
non-empty segments with `reduceat` avoids both and keeps its exact sums (no cumulative-sum
cancellation), so a text sums to the same float alone or in a batch.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]


def segment_sums(values: npt.NDArray[Any], offsets: npt.ArrayLike) -> FloatArray:
    """Sum of `values[offsets[i]:offsets[i+1]]` for each i (0 for an empty segment).

    >>> segment_sums(np.array([1.0, 2.0, 3.0]), [0, 2, 2, 3, 3]).tolist()
    [3.0, 0.0, 3.0, 0.0]
    """
    bounds = np.asarray(offsets, dtype=np.int64)
    sums = np.zeros(max(len(bounds) - 1, 0), dtype=np.float64)
    nonempty = np.flatnonzero(bounds[1:] > bounds[:-1])
    if len(nonempty):
        end = int(bounds[-1])
        sums[nonempty] = np.add.reduceat(values[:end], bounds[nonempty], dtype=np.float64)
    return sums
