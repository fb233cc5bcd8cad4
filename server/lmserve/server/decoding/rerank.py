"""Reranking arithmetic: combine the caller's scores with the LM's and order each list.

    weights = RerankWeights(score_weights={"acoustic": 1.0}, lm_weight=0.5, length_bonus=1.0)
    combined = weights.combine(lm_log_probs, caller_scores, lengths)   # one per hypothesis
    order = rank(combined)                                             # best first

combined = sum_k score_weights.get(k, 1) * scores[k] + lm_weight * lm_log_prob
           + length_bonus * length
(the NeMo/ESPnet/SRILM `-nbest` convention; the LM log-probability is in nats). Ranks are by
combined score, highest first, ties broken by the lower index: a stable order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


class LengthUnit(StrEnum):
    """What `length` counts: the model's tokens (`</s>` not counted), whitespace-separated
    words, or Unicode characters (spaces included)."""

    TOKENS = "tokens"
    WORDS = "words"
    CHARACTERS = "characters"


@dataclass(frozen=True)
class RerankWeights:
    """How the scores combine; a caller score with no weight has weight 1."""

    score_weights: Mapping[str, float] = field(default_factory=dict)
    lm_weight: float = 1.0
    length_bonus: float = 0.0
    length_unit: LengthUnit = LengthUnit.WORDS

    def combine(
        self,
        lm_log_probs: FloatArray,
        caller_scores: Sequence[Mapping[str, float]],
        lengths: IntArray,
    ) -> FloatArray:
        """The combined score of every hypothesis (arrays aligned by hypothesis)."""
        weights = self.score_weights
        caller = np.fromiter(
            (
                sum(value * weights.get(name, 1.0) for name, value in scores.items())
                for scores in caller_scores
            ),
            dtype=np.float64,
            count=len(caller_scores),
        )
        result: FloatArray = caller + self.lm_weight * lm_log_probs + self.length_bonus * lengths
        return result


def rank(combined: FloatArray) -> IntArray:
    """Hypothesis indexes best first: highest combined score, ties by the lower index."""
    order: IntArray = np.lexsort((np.arange(len(combined)), -combined))
    return order


def text_length(text: str, unit: LengthUnit, tokens: int) -> int:
    """A hypothesis's length in `unit`; `tokens` is its count of the model's tokens."""
    if unit is LengthUnit.TOKENS:
        return tokens
    if unit is LengthUnit.WORDS:
        return len(text.split())
    return len(text)
