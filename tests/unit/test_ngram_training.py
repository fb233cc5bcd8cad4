"""Training n-gram models: counting, MLE, add-k, interpolation, and normalisation of every method.

Probabilities are always read back from the written ARPA file, through KenLM (an independent
implementation) and through our serving engine, never from the trainer's own tables.
"""

from __future__ import annotations

import math
from pathlib import Path

import kenlm  # the independent cross-check (a dev dependency)
import numpy as np
import pytest

from lmserve.export.corpora import KJV_TOKEN_PATTERN, kjv_split
from lmserve.export.ngram.arpa_writer import read_arpa_entries, write_arpa
from lmserve.export.ngram.counting import count_ngrams
from lmserve.export.ngram.smoothing import (
    METHODS,
    BackoffModel,
    smooth_add_k,
    smooth_interpolated,
    smooth_kneser_ney,
    smooth_mle,
)
from lmserve.export.ngram.vocab import encode_corpus, select_vocabulary
from lmserve.server.backends.ngram.model import NgramModel
from lmserve.server.text.word import WordTokenizer

TOY = [["a", "b", "a"], ["b", "a"]]


def _kjv(split: str, lines: int) -> list[list[str]]:
    tokenizer = WordTokenizer(lowercase=True, pattern=KJV_TOKEN_PATTERN)
    text = kjv_split(split).read_text(encoding="utf-8").splitlines()[:lines]
    return tokenizer.split_batch(text)


def _train(
    sentences: list[list[str]],
    order: int,
    method: str,
    path: Path,
    *,
    heldout: list[list[str]] | None = None,
    weights: list[float] | None = None,
    top_n: int | None = None,
) -> tuple[Path, list[str], BackoffModel]:
    words = select_vocabulary(sentences, top_n=top_n)
    index = {w: i for i, w in enumerate(words)}
    counts = count_ngrams(encode_corpus(sentences, index), order, len(words))
    if method == "mle":
        model = smooth_mle(counts)
    elif method == "add-k":
        model = smooth_add_k(counts, 0.5)
    elif method == "interpolated":
        held = encode_corpus(heldout, index) if heldout else None
        model = smooth_interpolated(counts, held, weights)
    else:
        model = smooth_kneser_ney(counts, modified=method == "modified-kneser-ney")
    return write_arpa(model, words, path), words, model


def _kenlm_next_word_log10(arpa: Path, context: list[str], words: list[str]) -> np.ndarray:
    """log10 p(w | <s> context) for every word, through KenLM's state API."""
    model = kenlm.Model(str(arpa))
    state, out = kenlm.State(), kenlm.State()
    model.BeginSentenceWrite(state)
    for w in context:
        model.BaseScore(state, w, out)
        state, out = out, state
    return np.array([model.BaseScore(state, w, out) for w in words])


def _kenlm_perplexity(arpa: Path, sentences: list[list[str]]) -> float:
    model = kenlm.Model(str(arpa))
    log10 = sum(model.score(" ".join(s), bos=True, eos=True) for s in sentences)
    tokens = sum(len(s) + 1 for s in sentences)
    return float(10 ** (-log10 / tokens))


def test_counts_are_exact_on_a_toy_corpus() -> None:
    words = select_vocabulary(TOY)
    assert words == ["<unk>", "<s>", "</s>", "a", "b"]
    counts = count_ngrams(encode_corpus(TOY, {w: i for i, w in enumerate(words)}), 3, len(words))
    got = {}
    for table in counts.orders:
        names = [
            " ".join(words[w] for w in _ngram(counts, table.order, i)) for i in range(len(table))
        ]
        got.update({n: int(c) for n, c in zip(names, table.count, strict=True) if c})
    # By hand from "<s> a b a </s>" and "<s> b a </s>".
    assert got == {
        "<s>": 2, "</s>": 2, "a": 3, "b": 2,
        "<s> a": 1, "<s> b": 1, "a b": 1, "b a": 2, "a </s>": 2,
        "<s> a b": 1, "a b a": 1, "b a </s>": 2, "<s> b a": 1,
    }  # fmt: skip


def _ngram(counts: object, order: int, i: int) -> list[int]:
    tables = counts.orders  # type: ignore[attr-defined]
    out: list[int] = []
    for k in range(order, 0, -1):
        out.insert(0, int(tables[k - 1].word[i]))
        i = int(tables[k - 1].context[i])
    return out


def test_mle_equals_relative_frequencies(tmp_path: Path) -> None:
    arpa, _, _ = _train(TOY, 2, "mle", tmp_path / "mle.arpa")
    entries = read_arpa_entries(arpa)
    # 7 predicted tokens: a a a b b </s> </s>; "a" is followed by b once and </s> twice.
    expected = {"a": 3 / 7, "b": 2 / 7, "</s>": 2 / 7, "<s> a": 1 / 2, "a b": 1 / 3,
                "a </s>": 2 / 3, "b a": 1.0}  # fmt: skip
    for ngram, p in expected.items():
        assert entries[ngram][0] == pytest.approx(math.log10(p), abs=1e-6), ngram
    assert entries["<unk>"][0] == -99  # never seen: impossible
    assert entries["a"][1] == -99  # a seen context keeps all its mass


def test_add_k_matches_hand_computation(tmp_path: Path) -> None:
    arpa, _, _ = _train(TOY, 2, "add-k", tmp_path / "addk.arpa")  # k = 0.5
    entries = read_arpa_entries(arpa)
    k, vp = 0.5, 4  # predictable words: <unk> </s> a b
    uni = {"a": (3 + k) / (7 + k * vp), "b": (2 + k) / (7 + k * vp),
           "</s>": (2 + k) / (7 + k * vp), "<unk>": k / (7 + k * vp)}  # fmt: skip
    for w, p in uni.items():
        assert entries[w][0] == pytest.approx(math.log10(p), abs=1e-6)
    p_b_a, p_end_a = (1 + k) / (3 + k * vp), (2 + k) / (3 + k * vp)
    assert entries["a b"][0] == pytest.approx(math.log10(p_b_a), abs=1e-6)
    assert entries["a </s>"][0] == pytest.approx(math.log10(p_end_a), abs=1e-6)
    # Katz normalisation: left-over mass over the lower-order mass of the unseen words.
    backoff = (1 - p_b_a - p_end_a) / (uni["a"] + uni["<unk>"])
    assert entries["a"][1] == pytest.approx(math.log10(backoff), abs=1e-6)


@pytest.mark.parametrize("method", METHODS)
def test_every_context_sums_to_one_through_kenlm(method: str, tmp_path: Path) -> None:
    train = _kjv("train", 400)
    arpa, words, _ = _train(
        train, 3, method, tmp_path / "m.arpa", heldout=_kjv("valid", 60), top_n=300
    )
    predictable = [w for w in words if w != "<s>"]
    # Seen and unseen contexts, an <unk> context, and the empty one (just <s>).
    for context in ([], ["in"], ["in", "the"], ["the", "lord"], ["zzz"], ["and", "zzz"],
                    ["god", "said"], ["the", "and"]):  # fmt: skip
        log10 = _kenlm_next_word_log10(arpa, context, predictable)
        assert float(np.sum(10.0**log10)) == pytest.approx(1.0, abs=1e-4), context


@pytest.mark.parametrize("method", METHODS)
def test_every_context_sums_to_one_through_our_engine(method: str, tmp_path: Path) -> None:
    arpa, words, _ = _train(
        _kjv("train", 400), 3, method, tmp_path / "m.arpa", heldout=_kjv("valid", 60), top_n=300
    )
    engine = NgramModel.from_arpa(arpa)
    ids = engine.vocab.index
    bos = engine.vocab.bos_id
    for context in ([], ["in", "the"], ["the", "lord"], ["zzz"], ["and", "zzz"]):
        log_probs = engine.next_token_log_probs([ids.get(w, engine.vocab.unk_id) for w in context])
        keep = np.arange(len(log_probs)) != bos  # <s> is never predicted
        assert float(np.exp(log_probs[keep]).sum()) == pytest.approx(1.0, abs=1e-4), context


def test_interpolation_weights_are_tuned_on_heldout(tmp_path: Path) -> None:
    train, heldout = _kjv("train", 3000), _kjv("valid", 300)
    tuned_arpa, _, model = _train(train, 3, "interpolated", tmp_path / "t.arpa", heldout=heldout)
    weights = model.info["weights"]
    assert len(weights) == 3 and all(0.0 < w < 1.0 for w in weights)
    fixed_arpa, _, _ = _train(train, 3, "interpolated", tmp_path / "f.arpa", weights=[0.5] * 3)
    tuned, fixed = _kenlm_perplexity(tuned_arpa, heldout), _kenlm_perplexity(fixed_arpa, heldout)
    assert tuned < fixed
    # A proper 1-D optimum: nudging any single weight does not help held-out perplexity.
    for i in range(3):
        for step in (-0.05, 0.05):
            nudged = list(weights)
            nudged[i] = min(max(nudged[i] + step, 0.01), 0.99)
            path, _, _ = _train(train, 3, "interpolated", tmp_path / "n.arpa", weights=nudged)
            assert _kenlm_perplexity(path, heldout) >= tuned - 1e-6
