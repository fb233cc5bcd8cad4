"""Type stub for the C extension `_wire.c` (totals-only ScoreResponse results as wire bytes)."""

import numpy as np
import numpy.typing as npt

# C-contiguous arrays of these dtypes (`packing._as` makes them so).
def pack_totals(
    log_probs: npt.NDArray[np.float64],
    token_counts: npt.NDArray[np.int64],
    oov_counts: npt.NDArray[np.int64],
    /,
) -> bytes | None: ...
