"""`train-ngram --tokenizer char|bpe` pieces: tokens, counts by definition, discount fallback.

An MLE model over characters or BPE pieces, trained by the real pipeline and read back through
the serving engine, must give each token of a training sentence exactly c(h w) / c(h .), with
the counts taken here by brute force from the token strings.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from lmserve.export.ngram.evaluate import Perplexity
from lmserve.export.ngram.smoothing.kneser_ney import KENLM_FALLBACK, order_discounts
from lmserve.export.ngram.tokens import make_tokenizer
from lmserve.export.ngram.train import TrainConfig, train
from lmserve.server.backends.ngram.model import NgramModel
from lmserve.server.text.char import escape_token
from lmserve.server.text.word import encode_token_lists

LINES = [
    "in the beginning god created the heaven and the earth",
    "and the earth was without form and void",
    "and god said let there be light and there was light",
    "and god saw the light that it was good",
]


def _mle_by_counts(sentences: list[list[str]], order: int) -> list[list[float]]:
    """Natural-log c(h w) / c(h .) for every token and `</s>` of every sentence."""
    grams: Counter[tuple[str, ...]] = Counter()
    contexts: Counter[tuple[str, ...]] = Counter()
    padded = [["<s>", *s, "</s>"] for s in sentences]
    for tokens in padded:
        for i in range(1, len(tokens)):
            for k in range(1, order + 1):
                if i - k + 1 < 0:
                    break
                history = tuple(tokens[i - k + 1 : i])
                grams[(*history, tokens[i])] += 1
                contexts[history] += 1
    out = []
    for tokens in padded:
        row = []
        for i in range(1, len(tokens)):
            history = tuple(tokens[max(0, i - order + 1) : i])
            row.append(math.log(grams[(*history, tokens[i])] / contexts[history]))
        out.append(row)
    return out


@pytest.mark.parametrize(("kind", "order"), [("char", 4), ("bpe", 3)])
def test_mle_model_scores_are_count_ratios(tmp_path: Path, kind: str, order: int) -> None:
    corpus = tmp_path / "train.txt"
    corpus.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    config = TrainConfig(corpus=corpus, model_dir=tmp_path / "m", order=order, smoothing="mle",
                         tokenizer=kind, bpe_vocab_size=50)  # fmt: skip
    train(config)
    tokens = make_tokenizer(kind, LINES, bpe_vocab_size=50)
    sentences = tokens.split(LINES)
    if kind == "char":
        assert sentences[0][:4] == ["i", "n", " ", "t"]  # the space between words is a token
    expected = _mle_by_counts(sentences, order)
    model = NgramModel.load(tmp_path / "m" / "model.lmbin")
    index = {w: i for i, w in enumerate(model.vocab.words)}  # the ARPA's (escaped) words
    escaped = [[escape_token(t) for t in s] for s in sentences]
    batch = encode_token_lists(escaped, model.vocab)
    assert not batch.oov.any() and len(index) == len(tokens.vocabulary() or [])
    scores = model.score(batch, per_token=True)
    assert scores.token_log_probs is not None and scores.token_offsets is not None
    offsets = scores.token_offsets
    for i, row in enumerate(expected):
        served = scores.token_log_probs[offsets[i] : offsets[i + 1]]
        np.testing.assert_allclose(served, row, atol=1e-5, rtol=0)


def test_the_manifest_figures_of_a_subword_model_are_per_word(tmp_path: Path) -> None:
    corpus = tmp_path / "train.txt"
    corpus.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    config = TrainConfig(corpus=corpus, model_dir=tmp_path / "m", order=3, smoothing="add-k",
                         tokenizer="char", test=corpus)  # fmt: skip
    result = train(config)
    m = result.metrics
    words = sum(len(line.split()) + 1 for line in LINES)
    characters = sum(len(line) + 1 for line in LINES)
    assert (m["test_words"], m["test_tokens"]) == (words, characters)
    log_prob = -math.log(m["test_token_perplexity"]) * characters
    assert m["test_perplexity"] == pytest.approx(math.exp(-log_prob / words), rel=1e-9)


def test_word_model_figures_keep_their_names() -> None:
    stats = Perplexity(perplexity=5.0, perplexity_no_oov=4.0, tokens=10, oov=1, log_prob=-16.1,
                       words=10, perplexity_per_word=5.0)  # fmt: skip
    assert set(stats.as_metrics("test")) == {
        "test_perplexity",
        "test_perplexity_no_oov",
        "test_tokens",
        "test_oov",
    }
    per_word = stats.as_metrics("test", per_word=True)
    assert per_word["test_perplexity"] == 5.0 and per_word["test_token_perplexity"] == 5.0


def test_discount_fallback_only_where_the_counts_give_none() -> None:
    with pytest.raises(ValueError, match="count-of-counts"):
        order_discounts([0, 0, 0, 5], 1, modified=True, fallback=None)
    assert order_discounts([0, 0, 0, 5], 1, modified=True, fallback=KENLM_FALLBACK) == (
        [0.5, 1.0, 1.5],
        True,
    )
    assert order_discounts([0, 3, 1, 1], 2, modified=False, fallback=KENLM_FALLBACK) == (
        [0.5] * 3,
        True,
    )
    estimated, fell_back = order_discounts([10, 5, 3, 2], 2, modified=True, fallback=(9, 9, 9))
    assert not fell_back and estimated != [9, 9, 9]


def test_bpe_options_that_choose_words_are_refused(tmp_path: Path) -> None:
    corpus = tmp_path / "train.txt"
    corpus.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    for extra in ({"min_count": 2}, {"top_n": 10}):
        config = TrainConfig(corpus=corpus, model_dir=tmp_path / "m", order=2, smoothing="mle",
                             tokenizer="bpe", **extra)  # type: ignore[arg-type]  # fmt: skip
        with pytest.raises(ValueError, match="not BPE pieces"):
            train(config)
    with pytest.raises(ValueError, match="needs --tokenizer bpe"):
        train(TrainConfig(corpus=corpus, model_dir=tmp_path / "m", order=2, smoothing="mle",
                          bpe_model=corpus))  # fmt: skip
