"""What the two transformer steppers share: the stepper interface's plumbing around a cache.

`kv_stepping.KvStepper` (optimum's layout: a left-padded cache per batch) and
`shared_kv_stepping.SharedKvStepper` (a graph that writes pooled buffers in place) differ only
in how a state holds its cache and how a call reads and writes it. Their model properties,
the prompt read (`prefill`), the per-row reading of chunks (`feed` through `feed_in_groups`),
`split` and the checks of `truncate` are one piece of code, here; each module keeps its own
cache rules (`initial_state`, `_forward`, `select`, `merge`, `_truncated`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Generic, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from lmserve.server.backends.base import FloatArray, Vocabulary
from lmserve.server.backends.feed_groups import feed_in_groups
from lmserve.server.backends.transformer import TransformerBackend
from lmserve.server.errors import Unimplemented

Lengths = npt.NDArray[np.int64]


class RowsState(Protocol):
    """A transformer stepper's batch state: rows, and the positions each has read."""

    @property
    def lengths(self) -> Lengths: ...

    @property
    def batch(self) -> int: ...


BackendT = TypeVar("BackendT", bound=TransformerBackend)
StateT = TypeVar("StateT", bound=RowsState)


class TransformerStepper(ABC, Generic[BackendT, StateT]):
    """A stepper over a transformer backend; natural-log probabilities."""

    releases_gil = True  # ONNX Runtime computes without the GIL
    costly_prompts = True  # every prompt token is a position of the graph

    def __init__(self, backend: BackendT, *, max_chunk_tokens: int = 512) -> None:
        self.backend = backend
        self.max_chunk_tokens = max_chunk_tokens

    @property
    def vocab(self) -> Vocabulary:
        return self.backend.vocab

    @property
    def max_positions(self) -> int:
        return self.backend.max_positions

    @property
    def bytes_per_position(self) -> int:
        return self.backend.cache.bytes_per_position()

    # -- each stepper's cache rules ------------------------------------------------------

    @abstractmethod
    def initial_state(self, batch: int) -> StateT: ...

    @abstractmethod
    def _forward(self, ids: npt.NDArray[np.int64], state: StateT) -> tuple[FloatArray, StateT]:
        """Reads `ids` [B, T] after each row's cache: the log-probs after its last token."""

    @abstractmethod
    def select(self, state: StateT, rows: npt.ArrayLike) -> StateT: ...

    @abstractmethod
    def merge(self, states: Sequence[StateT]) -> StateT: ...

    @abstractmethod
    def _truncated(self, state: StateT, count: int) -> StateT:
        """`state` without each row's last `count` tokens (0 < count <= every length)."""

    # -- reading tokens ------------------------------------------------------------------

    def prefill(
        self, prompts: Sequence[Sequence[int]], *, bos: bool = True
    ) -> tuple[FloatArray, StateT]:
        inputs = [([self.vocab.bos_id] if bos else []) + [int(t) for t in p] for p in prompts]
        if any(not row for row in inputs):
            raise Unimplemented("a transformer needs <s> or a prompt to predict from")
        return self.feed(inputs, self.initial_state(len(inputs)))

    def feed(self, chunks: Sequence[Sequence[int]], state: StateT) -> tuple[FloatArray, StateT]:
        """Each row's chunk read after its state (`_read_chunks`)."""
        if len(chunks) != state.batch:
            raise ValueError(f"{len(chunks)} chunks for a state of {state.batch} rows")
        return self._read_chunks(chunks, state)

    def _read_chunks(
        self, chunks: Sequence[Sequence[int]], state: StateT
    ) -> tuple[FloatArray, StateT]:
        """Rows of equal chunk length read together (their new tokens need no padding)."""
        return feed_in_groups(
            chunks,
            state,
            window=self.max_chunk_tokens,
            forward=self._forward,
            select=self.select,
            merge=self.merge,
        )

    # -- rows ----------------------------------------------------------------------------

    def split(self, state: StateT) -> list[StateT]:
        return [self.select(state, [i]) for i in range(state.batch)]

    def truncate(self, state: StateT, count: int) -> StateT:
        """The state before each row's last `count` tokens (a Complete session's backspace):
        a cache holds every earlier position, so going back needs no model call."""
        if count == 0:
            return state
        shortest = int(state.lengths.min()) if state.batch else 0
        if not 0 < count <= shortest:
            raise ValueError(f"cannot go back {count} tokens from lengths {state.lengths}")
        return self._truncated(state, count)
