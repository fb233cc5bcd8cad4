"""The contract every language-model backend fulfils, and the batch types that cross it.

Backends know nothing of gRPC or of text: they take vocabulary ids and return natural-log
probabilities. Texts become ids in `lmserve.server.text`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from lmserve.server.text.vocab import EncodedBatch, IdArray, OffsetArray, Vocabulary

FloatArray = npt.NDArray[np.float64]

__all__ = [
    "BatchScores",
    "EncodedBatch",
    "FloatArray",
    "IdArray",
    "LanguageModelBackend",
    "OffsetArray",
    "Vocabulary",
]


@dataclass(frozen=True)
class BatchScores:
    """Scores of an `EncodedBatch`, all natural logs.

    `totals[i]` is the sum of text i's scored tokens (`</s>` included when eos was on).
    `token_log_probs[token_offsets[i]:token_offsets[i+1]]` are text i's per-token scores when
    they were asked for (else None); the extra last entry of each text is `</s>` when eos was on.
    `ngram_lengths` is the matched n-gram length per token (n-gram backends only).
    """

    totals: FloatArray
    token_log_probs: FloatArray | None = None
    token_offsets: OffsetArray | None = None
    ngram_lengths: IdArray | None = None


class LanguageModelBackend(Protocol):
    """A loaded model that keeps no per-request state. Every score is a natural log."""

    @property
    def vocab(self) -> Vocabulary: ...

    def score(
        self, batch: EncodedBatch, *, bos: bool = True, eos: bool = True, per_token: bool = False
    ) -> BatchScores:
        """Scores every text of the batch: log P(tokens [+ </s>] | <s>) in nats."""
        ...

    def next_token_log_probs(self, context: Sequence[int], *, bos: bool = True) -> FloatArray:
        """log P(w | <s> context) in nats for every vocabulary id w (shape [len(vocab)])."""
        ...
