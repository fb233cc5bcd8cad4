"""Perplexity of text under a built model, scored by the serving engine itself.

Convention (KenLM's): natural logs; every word and one `</s>` per line are predicted, `<s>` is
context only; an out-of-vocabulary word is scored as `<unk>`. `perplexity` includes OOV tokens,
`perplexity_no_oov` leaves them out of both the log-probability sum and the token count.

A character or BPE model's tokens are not words: its manifest's `*_perplexity` is per word
(the same log-probability over the words behind the tokens plus one `</s>` a line, as the
neural models' and the server's `perplexity_per_word`), `*_token_perplexity` per token.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from lmserve.server.backends.ngram.model import NgramModel


@dataclass(frozen=True)
class Perplexity:
    perplexity: float
    perplexity_no_oov: float
    tokens: int
    oov: int
    log_prob: float  # natural log, all tokens
    words: int  # words behind the tokens + one `</s>` per sentence
    perplexity_per_word: float

    def as_metrics(self, prefix: str, *, per_word: bool = False) -> dict[str, float]:
        """The manifest's figures; `per_word` (subword models) names the per-token ones
        `*_token_*` and makes `*_perplexity` the per-word figure."""
        if not per_word:
            return {
                f"{prefix}_perplexity": self.perplexity,
                f"{prefix}_perplexity_no_oov": self.perplexity_no_oov,
                f"{prefix}_tokens": float(self.tokens),
                f"{prefix}_oov": float(self.oov),
            }
        return {
            f"{prefix}_perplexity": self.perplexity_per_word,
            f"{prefix}_token_perplexity": self.perplexity,
            f"{prefix}_token_perplexity_no_oov": self.perplexity_no_oov,
            f"{prefix}_tokens": float(self.tokens),
            f"{prefix}_words": float(self.words),
            f"{prefix}_oov": float(self.oov),
        }


def perplexity(
    model: NgramModel, sentences: Sequence[Sequence[str]], words: int | None = None
) -> Perplexity:
    """Scores every sentence (its tokens) with `<s>` context and a final `</s>`; `words` is the
    words + `</s>`s behind them (default: the tokens, as for a word model). A `<unk>` token (a
    BPE piece the tokenizer could not spell) counts as OOV, as the server counts it."""
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
    oov[word_slots] = batch.oov | (batch.ids == model.vocab.unk_id)
    tokens = int(lengths.sum()) + n
    words = tokens if words is None else words
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
        words=words,
        perplexity_per_word=math.exp(-total / words) if words else math.nan,
    )
