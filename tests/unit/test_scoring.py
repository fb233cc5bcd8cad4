"""Scoring and perplexity math over the backend contract, with a hand-checkable unigram model."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pytest

from lmserve.server.backends.base import BatchScores, EncodedBatch, FloatArray, Vocabulary
from lmserve.server.decoding.scoring import (
    PerplexityAccumulator,
    ScoreOptions,
    Scorer,
    check_token_count,
    perplexity,
)
from lmserve.server.errors import InvalidArgument
from lmserve.server.text.char import CharCodec
from lmserve.server.text.codec import WordCodec
from lmserve.server.text.word import WordTokenizer

WORDS = ["<unk>", "<s>", "</s>", "a", "b"]
# log P per id: <unk> 0.1, <s> never scored, </s> 0.2, a 0.4, b 0.3
PROBS = np.log(np.array([0.1, 1e-9, 0.2, 0.4, 0.3]))


class Unigram:
    """A context-free model: easy to check by hand, and it obeys the backend contract."""

    def __init__(self) -> None:
        self._vocab = Vocabulary.from_words(WORDS)

    @property
    def vocab(self) -> Vocabulary:
        return self._vocab

    def score(
        self, batch: EncodedBatch, *, bos: bool = True, eos: bool = True, per_token: bool = False
    ) -> BatchScores:
        per_text = []
        for i in range(batch.batch_size):
            ids = list(batch.ids[batch.offsets[i] : batch.offsets[i + 1]])
            if eos:
                ids.append(self._vocab.eos_id)
            per_text.append(PROBS[ids])
        totals = np.array([float(p.sum()) for p in per_text])
        if not per_token:
            return BatchScores(totals=totals)
        offsets = np.zeros(len(per_text) + 1, dtype=np.int64)
        np.cumsum([len(p) for p in per_text], out=offsets[1:])
        flat = np.concatenate(per_text) if per_text else np.zeros(0)
        return BatchScores(totals, flat, offsets, np.ones(len(flat), dtype=np.int32))

    def next_token_log_probs(self, context: Sequence[int], *, bos: bool = True) -> FloatArray:
        return PROBS.copy()


@pytest.fixture
def scorer() -> Scorer:
    model = Unigram()
    return Scorer(model, WordCodec(WordTokenizer(), model.vocab))


def test_totals_counts_and_oovs(scorer: Scorer) -> None:
    scored = scorer.score_texts(["a b", "a zz", ""], ScoreOptions())
    expected = [math.log(0.4 * 0.3 * 0.2), math.log(0.4 * 0.1 * 0.2), math.log(0.2)]
    np.testing.assert_allclose(scored.log_probs, expected)
    assert scored.token_counts.tolist() == [3, 3, 1]  # words + </s>; empty text scores </s>
    assert scored.oov_counts.tolist() == [0, 1, 0]
    assert scored.details is None and scored.oov_log_probs is None


def test_eos_off_counts_no_end_token(scorer: Scorer) -> None:
    scored = scorer.score_texts(["a b", ""], ScoreOptions(eos=False))
    assert scored.token_counts.tolist() == [2, 0]
    np.testing.assert_allclose(scored.log_probs, [math.log(0.12), 0.0])


def test_details_line_up_and_sum_to_totals(scorer: Scorer) -> None:
    scored = scorer.score_token_lists([["a", "zz"], []], ScoreOptions(), details=True)
    assert scored.details is not None
    first, empty = scored.details
    assert first.tokens == ["a", "zz", "</s>"]
    assert first.token_ids.tolist() == [3, 0, 2]
    assert first.oov.tolist() == [False, True, False]
    assert empty.tokens == ["</s>"] and empty.oov.tolist() == [False]
    for d, total in zip(scored.details, scored.log_probs, strict=True):
        assert math.isclose(float(d.log_probs.sum()), total)


def test_perplexity_with_and_without_oovs(scorer: Scorer) -> None:
    stats = PerplexityAccumulator()
    stats.add(scorer.score_texts(["a zz"], ScoreOptions(), oov_log_probs=True))
    stats.add(scorer.score_texts(["b"], ScoreOptions(), oov_log_probs=True))
    result = stats.result()
    total = math.log(0.4 * 0.1 * 0.2) + math.log(0.3 * 0.2)
    assert (result.token_count, result.oov_count, result.text_count) == (5, 1, 2)
    assert math.isclose(result.log_prob, total)
    assert math.isclose(result.perplexity, math.exp(-total / 5))
    assert math.isclose(result.log_prob_excluding_oov, total - math.log(0.1))
    assert math.isclose(result.perplexity_excluding_oov, math.exp(-(total - math.log(0.1)) / 4))
    # A word model's tokens are its words: both figures are the same.
    assert result.word_count == 5 and result.perplexity_per_word == result.perplexity


def _char_scorer() -> Scorer:
    """The unigram read as a character model: "a" and "b" are characters, " " unknown."""
    model = Unigram()
    return Scorer(model, CharCodec(model.vocab))


def test_character_model_counts_words_and_names_its_tokens() -> None:
    scorer = _char_scorer()
    scored = scorer.score_texts(["ab  a", "", "b"], ScoreOptions(), details=True)
    assert scored.token_counts.tolist() == [5, 1, 2]  # a b ' ' a </s>: single spaces
    assert scored.word_counts.tolist() == [3, 1, 2]  # 2 words + </s>
    assert scored.oov_counts.tolist() == [1, 0, 0]  # the space is not in this vocabulary
    assert scored.details is not None
    assert scored.details[0].tokens == ["a", "b", "<unk>", "a", "</s>"]
    assert scored.details[0].oov.tolist() == [False, False, True, False, False]
    lists = scorer.score_token_lists([["ab", "a"]], ScoreOptions(eos=False))
    assert (lists.token_counts.tolist(), lists.word_counts.tolist()) == ([4], [2])


def test_per_word_perplexity_divides_by_words_and_ends() -> None:
    stats = PerplexityAccumulator()
    stats.add(_char_scorer().score_texts(["ab a", "b"], ScoreOptions(), oov_log_probs=True))
    result = stats.result()
    total = math.log(0.4 * 0.3 * 0.1 * 0.4 * 0.2) + math.log(0.3 * 0.2)
    assert (result.token_count, result.word_count, result.text_count) == (7, 5, 2)
    assert math.isclose(result.perplexity, math.exp(-total / 7))
    assert math.isclose(result.perplexity_per_word, math.exp(-total / 5))
    assert math.isclose(result.perplexity_excluding_oov, math.exp(-(total - math.log(0.1)) / 6))


def test_codec_and_model_must_agree_on_the_vocabulary() -> None:
    with pytest.raises(ValueError, match="codec has 4 tokens, the model 5"):
        Scorer(Unigram(), CharCodec(Vocabulary.from_words(WORDS[:4])))


def test_token_limit_names_the_text(scorer: Scorer) -> None:
    with pytest.raises(InvalidArgument, match=r"texts\[1\].*3 tokens.*limit of 2"):
        scorer.score_texts(["a", "a b a"], ScoreOptions(), max_tokens_per_text=2)


def test_one_rule_words_every_token_limit_error() -> None:
    check_token_count("prompt", 2, 2)  # at the limit: accepted
    with pytest.raises(InvalidArgument) as err:
        check_token_count("prompt", 3, 2)
    assert str(err.value) == "prompt: has 3 tokens, more than the limit of 2"
    assert err.value.field == "prompt"
    with pytest.raises(InvalidArgument) as err:
        check_token_count("append_text", 5, 4, holds="the context would hold")
    assert str(err.value) == (
        "append_text: the context would hold 5 tokens, more than the limit of 4"
    )


def test_perplexity_of_nothing_is_nan() -> None:
    assert math.isnan(perplexity(0.0, 0))
    assert math.isnan(PerplexityAccumulator().result().perplexity)
    assert math.isnan(PerplexityAccumulator().result().perplexity_per_word)


def test_oov_counts_per_text_with_empty_texts_between(scorer: Scorer) -> None:
    texts = ["", "zz a yy", "", "", "b", "xx", "a b", ""]
    scored = scorer.score_texts(texts, ScoreOptions())
    assert scored.oov_counts.tolist() == [0, 2, 0, 0, 0, 1, 0, 0]
    assert scored.oov_counts.dtype == np.int64
    assert scorer.score_texts(["a", "", "b"], ScoreOptions()).oov_counts.tolist() == [0, 0, 0]
