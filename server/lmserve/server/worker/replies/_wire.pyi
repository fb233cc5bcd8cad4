"""Type stub for the C extension `_wire.c` (totals-only ScoreResponse results as wire bytes)."""

from typing import Any

def pack_totals(log_probs: Any, token_counts: Any, oov_counts: Any, /) -> bytes | None: ...
