"""Perplexity from scored texts, with the conventions stated.

    stats = PerplexityAccumulator(); stats.add(scored); stats.result().perplexity

Perplexity follows KenLM: ppl = exp(-sum / N) with N = tokens + one `</s>` per text (when
end-of-sentence is on); "excluding OOVs" drops the OOV tokens' log-probs and their count. The
per-word figure divides the same sum by the words behind the tokens plus the `</s>`s, so
character, BPE and word models compare. All log-probabilities are natural logs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lmserve.server.decoding.scored import ScoredTexts


@dataclass(frozen=True)
class PerplexityStats:
    """Perplexity over texts, with and without OOVs. NaN where there is no token to count.

    `perplexity` is per model token, `perplexity_per_word` per word (`word_count` words and
    `</s>`s): the two agree for word models, and the per-word one compares across tokenizers.
    """

    log_prob: float
    token_count: int
    oov_count: int
    text_count: int
    perplexity: float
    log_prob_excluding_oov: float
    perplexity_excluding_oov: float
    word_count: int
    perplexity_per_word: float


class PerplexityAccumulator:
    """Sums scored batches and gives corpus perplexity; add batches as they arrive."""

    def __init__(self) -> None:
        self.log_prob = 0.0
        self.oov_log_prob = 0.0
        self.token_count = 0
        self.word_count = 0
        self.oov_count = 0
        self.text_count = 0

    def add(self, scored: ScoredTexts) -> None:
        if scored.oov_log_probs is None:
            raise ValueError("perplexity needs the OOV log-probs: score with oov_log_probs=True")
        self.log_prob += math.fsum(scored.log_probs.tolist())
        self.oov_log_prob += math.fsum(scored.oov_log_probs.tolist())
        self.token_count += int(scored.token_counts.sum())
        self.word_count += int(scored.word_counts.sum())
        self.oov_count += int(scored.oov_counts.sum())
        self.text_count += len(scored)

    def result(self) -> PerplexityStats:
        in_vocab_log_prob = self.log_prob - self.oov_log_prob
        return PerplexityStats(
            log_prob=self.log_prob,
            token_count=self.token_count,
            oov_count=self.oov_count,
            text_count=self.text_count,
            perplexity=perplexity(self.log_prob, self.token_count),
            log_prob_excluding_oov=in_vocab_log_prob,
            perplexity_excluding_oov=perplexity(
                in_vocab_log_prob, self.token_count - self.oov_count
            ),
            word_count=self.word_count,
            perplexity_per_word=perplexity(self.log_prob, self.word_count),
        )


def perplexity(log_prob: float, token_count: int) -> float:
    """exp(-log_prob / token_count) for a natural-log sum; NaN with no tokens."""
    if token_count <= 0:
        return math.nan
    return math.exp(-log_prob / token_count)
