"""What scoring gives back: per-text results (`ScoredTexts`) and each text's scored tokens
(`TokenDetails`), as arrays (natural logs).

Apart from `scoring`, which makes them, so that `perplexity` (which sums them and is used by
`scoring`) and the reply builders read them without importing the scorer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from lmserve.server.backends.base import FloatArray, IdArray

CountArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class TokenDetails:
    """One text's scored tokens as parallel arrays (`</s>` last when eos is on).

    `tokens` are the model's tokens as text: the words for a word model, the characters for a
    character model, and for a BPE model the text each subword adds (spacing included, so they
    join into the decoded text; never the raw piece with its `</w>` mark); `</s>` as itself.
    """

    tokens: list[str]
    token_ids: IdArray
    log_probs: FloatArray
    oov: npt.NDArray[np.bool_]
    ngram_lengths: IdArray | None


@dataclass(frozen=True)
class ScoredTexts:
    """Per-text results of one batch, as arrays indexed by text (natural logs)."""

    log_probs: FloatArray
    token_counts: CountArray
    # The words behind each text's tokens (+ `</s>` when eos): equal to token_counts for a word
    # model; what per-word perplexity divides by.
    word_counts: CountArray
    oov_counts: CountArray
    # Sum of the OOV tokens' log-probs per text; None when not asked for.
    oov_log_probs: FloatArray | None
    details: list[TokenDetails] | None
    # Sum of token_counts, known without a numpy call (the metrics take it per request).
    total_tokens: int

    def __len__(self) -> int:
        return len(self.log_probs)
