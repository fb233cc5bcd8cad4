"""Generation over a transformer: the state is each row's key/value cache.

A batch's cache is left-padded: every layer's key and value are [B, kv_heads, P, head_dim]
with row i's real positions the last `lengths[i]` of P, the rest masked out
(`attention_mask` 0) and never read. Each row's position ids count its own tokens only, so
rows of different lengths step together in one call, exactly as each would alone (the export's
parity check reads a left-padded batch both ways). Rows leave and join between steps
(`select`, `merge`), beams reorder their caches in one gather, and padding that no row needs
any more is cut off on the way.

A row may read at most the model's `max_positions` tokens (`<s>` included): one more is
refused (`positions.Positions`); the scheduler stops a sample there first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np
import numpy.typing as npt

from lmserve.server.backends.base import FloatArray
from lmserve.server.backends.transformer import (
    Past,
    TransformerBackend,
    log_softmax,
)
from lmserve.server.backends.transformer_stepping import Lengths, TransformerStepper


@dataclass(frozen=True)
class KvState:
    """A batch's cache, left-padded to its longest row, and each row's length."""

    past: Past
    lengths: Lengths

    @property
    def width(self) -> int:
        return int(self.past[0].shape[2])

    @property
    def batch(self) -> int:
        return len(self.lengths)

    def mask(self) -> npt.NDArray[np.int64]:
        """1 where a row has read a position, 0 on its left padding."""
        start = self.width - self.lengths
        return (np.arange(self.width)[None, :] >= start[:, None]).astype(np.int64)

    @property
    def nbytes(self) -> int:
        """The bytes this batch's cache holds (padding included)."""
        return sum(int(p.nbytes) for p in self.past)


class KvStepper(TransformerStepper[TransformerBackend, KvState]):
    """Steps a `TransformerBackend` (see the module doc); natural-log probabilities."""

    def initial_state(self, batch: int) -> KvState:
        return KvState(self.backend.cache.empty(batch), np.zeros(batch, dtype=np.int64))

    def step(self, tokens: npt.ArrayLike, state: KvState) -> tuple[FloatArray, KvState]:
        ids = np.asarray(tokens, dtype=np.int64).reshape(-1, 1)
        return self._forward(ids, state)

    def _forward(self, ids: npt.NDArray[np.int64], state: KvState) -> tuple[FloatArray, KvState]:
        """Reads `ids` [B, T] after the cache: the log-probs after each row's last token."""
        batch, time = ids.shape
        longest = int(state.lengths.max(initial=0))
        self.backend.positions.check(longest + time, "context")
        mask = np.concatenate([state.mask(), np.ones((batch, time), dtype=np.int64)], axis=1)
        positions = state.lengths[:, None] + np.arange(time, dtype=np.int64)[None, :]
        logits, present = self.backend.forward(ids, mask, positions, state.past)
        # The model's own precision (float32), as the recurrent stepper's.
        log_probs = cast(FloatArray, log_softmax(logits[:, -1, :], len(self.vocab)))
        return log_probs, KvState(present, state.lengths + time)

    def merge(self, states: Sequence[KvState]) -> KvState:
        if not states:
            return self.initial_state(0)
        lengths = np.concatenate([s.lengths for s in states])
        width = int(lengths.max(initial=0))
        batch = len(lengths)
        merged = []
        for k in range(len(states[0].past)):
            first = states[0].past[k]
            out = np.zeros((batch, first.shape[1], width, first.shape[3]), dtype=first.dtype)
            row = 0
            for s in states:
                part = s.past[k]
                keep = min(width, s.width)
                out[row : row + s.batch, :, width - keep :] = part[:, :, s.width - keep :]
                row += s.batch
            merged.append(out)
        return KvState(tuple(merged), lengths)

    def _truncated(self, state: KvState, count: int) -> KvState:
        width = state.width - count
        past = tuple(np.ascontiguousarray(p[:, :, :width]) for p in state.past)
        return KvState(past, state.lengths - count)

    def select(self, state: KvState, rows: npt.ArrayLike) -> KvState:
        """Rows `rows` (repeats allowed), with the padding none of them needs cut off."""
        index = np.asarray(rows, dtype=np.int64).reshape(-1)
        lengths = state.lengths[index]
        width = int(lengths.max(initial=0))
        cut = state.width - width
        past = tuple(np.ascontiguousarray(p[index, :, cut:]) for p in state.past)
        return KvState(past, lengths)
