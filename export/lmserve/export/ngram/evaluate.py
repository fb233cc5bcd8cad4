"""Perplexity of text under a built model, scored by the serving engine itself.

Convention (KenLM's): natural logs; every word and one `</s>` per line are predicted, `<s>` is
context only; an out-of-vocabulary word is scored as `<unk>`. `perplexity` includes OOV tokens,
`perplexity_no_oov` leaves them out of both the log-probability sum and the token count.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from lmserve.server.backends.ngram import NgramModel


@dataclass(frozen=True)
class Perplexity:
    perplexity: float
    perplexity_no_oov: float
    tokens: int
    oov: int
    log_prob: float  # natural log, all tokens

    def as_metrics(self, prefix: str) -> dict[str, float]:
        return {
            f"{prefix}_perplexity": self.perplexity,
            f"{prefix}_perplexity_no_oov": self.perplexity_no_oov,
            f"{prefix}_tokens": float(self.tokens),
            f"{prefix}_oov": float(self.oov),
        }


def perplexity(model: NgramModel, sentences: Sequence[Sequence[str]]) -> Perplexity:
    """Scores every sentence with `<s>` context and a final `</s>`."""
    from lmserve.server.text.word import encode_token_lists

    batch = encode_token_lists(sentences, model.vocab)
    scores = model.score(batch, bos=True, eos=True, per_token=True)
    assert scores.token_log_probs is not None and scores.token_offsets is not None
    # Per-token scores hold each sentence's words then its </s>; align the OOV mask to that.
    n = batch.batch_size
    lengths = np.diff(batch.offsets)
    oov = np.zeros(len(scores.token_log_probs), dtype=bool)
    word_slots = np.ones(len(oov), dtype=bool)
    word_slots[scores.token_offsets[1:] - 1] = False  # the </s> slot of each sentence
    oov[word_slots] = batch.oov
    tokens = int(lengths.sum()) + n
    total = float(scores.token_log_probs.sum())
    kept = ~oov
    n_kept = int(kept.sum())
    no_oov = float(scores.token_log_probs[kept].sum())
    return Perplexity(
        perplexity=math.exp(-total / tokens) if tokens else math.nan,
        perplexity_no_oov=math.exp(-no_oov / n_kept) if n_kept else math.nan,
        tokens=tokens,
        oov=int(oov.sum()),
        log_prob=total,
    )
