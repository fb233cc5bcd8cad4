"""Type stub for the C extension `_kernel.c` (the n-gram scoring loop)."""

from collections.abc import Sequence
from typing import Any

# Any object with the buffer protocol (numpy arrays, memory maps) of the right item type.
Buffer = Any

class Scorer:
    order: int
    def __init__(
        self,
        uni_prob: Buffer,
        uni_backoff: Buffer,
        tables: tuple[Buffer, ...],
        n_home: tuple[int, ...],
        bos_id: int,
        eos_id: int,
        *,
        child_start: tuple[Buffer, ...] | None = None,
        words: tuple[Buffer, ...] | None = None,
        probs: tuple[Buffer, ...] | None = None,
        entries: tuple[Buffer, ...] | None = None,
    ) -> None: ...
    def score(
        self,
        ids: Buffer,
        offsets: Buffer,
        bos: bool,
        eos: bool,
        totals: Buffer,
        log_probs: Buffer | None = None,
        lengths: Buffer | None = None,
        /,
    ) -> None: ...
    def distributions(self, ids: Buffer, offsets: Buffer, bos: bool, out: Buffer, /) -> None: ...
    def score_next(
        self, states: Sequence[tuple[int, ...]], words: Sequence[int], /
    ) -> tuple[list[float], list[tuple[int, ...]]]: ...
    def state_distributions(self, states: Sequence[tuple[int, ...]], out: Buffer, /) -> None: ...
