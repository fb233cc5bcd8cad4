"""Autocomplete's primitives on the real KJV models: the prefix index and `top_k_words` over the
n-gram backend's distribution give KenLM's own top words (brute force over its state API), and
over the LSTM's distribution they give what re-scoring context + word gives."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from lmserve.server.backends.ngram.model import NgramModel
from lmserve.server.backends.onnx import OnnxBackend, OnnxOptions
from lmserve.server.decoding.completion import top_k_words
from lmserve.server.manifest import read_manifest
from lmserve.server.text.prefix_index import WordPrefixIndex
from lmserve.server.text.word import encode_token_lists

REPO = Path(__file__).resolve().parents[2]
KJV = REPO / ".." / "shared" / "data" / "kjv"
LSTM_FOLDER = REPO / "models" / "kjv-lstm"
LN10 = math.log(10.0)
CONTEXTS = [[], ["in", "the"], ["and", "god", "said", "let", "there", "be"], ["zzyzx", "of"]]
PREFIXES = ["", "l", "th", "be", "lig", "q", "zzz"]


@pytest.fixture(scope="module")
def ngram() -> NgramModel:
    return NgramModel.from_arpa(KJV / "kenlm" / "kjv.3gram.arpa")


def _kenlm_top(model: object, words: list[str], context: list[str], k: int) -> list[float]:
    import kenlm

    state, out, scratch = kenlm.State(), kenlm.State(), kenlm.State()
    model.BeginSentenceWrite(state)  # type: ignore[attr-defined]
    for word in context:
        model.BaseScore(state, word, out)  # type: ignore[attr-defined]
        state, out = out, state
    scores = [model.BaseScore(state, w, scratch) * LN10 for w in words]  # type: ignore[attr-defined]
    return sorted(scores, reverse=True)[:k]


def test_ngram_top_words_equal_kenlm_brute_force(ngram: NgramModel) -> None:
    import kenlm

    model = kenlm.Model(str(KJV / "kenlm" / "kjv.3gram.arpa"))
    vocab = ngram.vocab
    index = WordPrefixIndex.from_vocab(vocab)
    for context in CONTEXTS:
        ids = [vocab.index.get(w, vocab.unk_id) for w in context]
        dist = ngram.next_token_log_probs(ids)
        for prefix in PREFIXES:
            got = top_k_words(dist, index.ids_with_prefix(prefix), 5)
            words = list(index.words_with_prefix(prefix))
            want = _kenlm_top(model, words, context, 5)
            np.testing.assert_allclose([lp for _, lp in got], want, atol=1e-4)
            assert all(vocab.words[i].startswith(prefix) for i, _ in got)


def test_lstm_top_words_equal_a_rescore() -> None:
    lstm = OnnxBackend.load(LSTM_FOLDER, read_manifest(LSTM_FOLDER), OnnxOptions())
    vocab = lstm.vocab
    index = WordPrefixIndex.from_vocab(vocab)
    for context in CONTEXTS[:3]:
        dist = lstm.next_token_log_probs([vocab.index.get(w, vocab.unk_id) for w in context])
        base = lstm.score(encode_token_lists([context], vocab), eos=False).totals[0]
        for prefix in PREFIXES[:4]:
            got = top_k_words(dist, index.ids_with_prefix(prefix), 4)
            texts = [[*context, vocab.words[i]] for i, _ in got]
            rescored = lstm.score(encode_token_lists(texts, vocab), eos=False).totals - base
            np.testing.assert_allclose([lp for _, lp in got], rescored, atol=1e-4)
            full = np.sort(dist[index.ids_with_prefix(prefix)])[::-1][:4]
            np.testing.assert_allclose([lp for _, lp in got], full, atol=0)
