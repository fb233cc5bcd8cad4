"""Kneser-Ney training: discounts by hand, entry-by-entry parity with KenLM's lmplz, and the
KJV 5-gram's test perplexity (KenLM's reference: 57.3512)."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from lmserve.export.corpora import KJV_TOKEN_PATTERN, kjv_split
from lmserve.export.ngram.arpa_writer import read_arpa_entries, write_arpa
from lmserve.export.ngram.counting import count_ngrams
from lmserve.export.ngram.smoothing import smooth_kneser_ney
from lmserve.export.ngram.vocab import encode_corpus, select_vocabulary
from lmserve.server.text.word import WordTokenizer

TOKENIZER = WordTokenizer(lowercase=True, pattern=KJV_TOKEN_PATTERN)


def _read(path: Path, lines: int | None = None) -> list[list[str]]:
    text = path.read_text(encoding="utf-8").splitlines()
    return TOKENIZER.split_batch(text[:lines] if lines else text)


def _hand_adjusted_counts(sentences: list[list[str]], order: int) -> list[Counter[tuple[str, ...]]]:
    """Chen & Goodman's adjusted counts with plain dicts, one n-gram at a time: raw counts at the
    top order and for n-grams starting with <s>, else the number of distinct left neighbours."""
    raw = [Counter[tuple[str, ...]]() for _ in range(order)]
    for s in sentences:
        tokens = ["<s>", *s, "</s>"]
        for k in range(1, order + 1):
            for i in range(len(tokens) - k + 1):
                raw[k - 1][tuple(tokens[i : i + k])] += 1
    adjusted = []
    for k in range(1, order + 1):
        if k == order:
            adjusted.append(raw[k - 1])
            continue
        left: defaultdict[tuple[str, ...], set[str]] = defaultdict(set)
        for gram in raw[k]:
            left[gram[1:]].add(gram[0])
        adjusted.append(
            Counter(
                {
                    g: (c if g[0] == "<s>" else len(left[g]))
                    for g, c in raw[k - 1].items()
                    if g != ("<s>",)
                }  # fmt: skip
            )
        )
    return adjusted


def _hand_discounts(counts: Counter[tuple[str, ...]]) -> list[float]:
    n = Counter(counts.values())
    y = n[1] / (n[1] + 2 * n[2])
    return [1 - 2 * y * n[2] / n[1], 2 - 3 * y * n[3] / n[2], 3 - 4 * y * n[4] / n[3]]


def _train(sentences: list[list[str]], order: int, modified: bool, path: Path):  # type: ignore[no-untyped-def]
    words = select_vocabulary(sentences)
    index = {w: i for i, w in enumerate(words)}
    model = smooth_kneser_ney(count_ngrams(encode_corpus(sentences, index), order, len(words)),
                              modified=modified)  # fmt: skip
    return write_arpa(model, words, path), model


@pytest.mark.parametrize("order", [2, 3, 4])
def test_modified_discounts_match_hand_computed_count_of_counts(order: int, tmp_path: Path) -> None:
    sentences = _read(kjv_split("train"), 500)
    _, model = _train(sentences, order, True, tmp_path / "m.arpa")
    expected = [d for c in _hand_adjusted_counts(sentences, order) for d in _hand_discounts(c)]
    assert model.info["discounts"] == pytest.approx(expected, rel=1e-12)


def test_plain_kneser_ney_uses_one_discount_per_order(tmp_path: Path) -> None:
    sentences = _read(kjv_split("train"), 500)
    _, model = _train(sentences, 3, False, tmp_path / "m.arpa")
    for k, counts in enumerate(_hand_adjusted_counts(sentences, 3)):
        n = Counter(counts.values())
        assert model.info["discounts"][3 * k : 3 * k + 3] == pytest.approx(
            [n[1] / (n[1] + 2 * n[2])] * 3
        )


def test_kjv_trigram_matches_lmplz_entry_by_entry(shared_data: Path, tmp_path: Path) -> None:
    reference = read_arpa_entries(shared_data / "kjv" / "kenlm" / "kjv.3gram.arpa")
    arpa, _ = _train(_read(shared_data / "kjv" / "train.txt"), 3, True, tmp_path / "m.arpa")
    ours = read_arpa_entries(arpa)
    assert ours.keys() == reference.keys()
    # lmplz writes log10 p(<s>) = 0, we write -99; neither is ever used (<s> is never predicted).
    assert ours.pop("<s>")[1] == pytest.approx(reference.pop("<s>")[1], abs=1e-4)
    prob_diff = max(abs(ours[g][0] - p) for g, (p, _) in reference.items())
    backoff_diff = max(abs(ours[g][1] - b) for g, (_, b) in reference.items())
    assert prob_diff < 1e-4 and backoff_diff < 1e-4, (prob_diff, backoff_diff)


@pytest.mark.slow
def test_kjv_5gram_test_perplexity_matches_kenlm(shared_data: Path, kjv_5gram: Path) -> None:
    """`make models`'s kjv-5gram (the session's `kjv_5gram`: `lmserve train-ngram` with the
    Makefile's flags, `--heldout` and `--test` among them), its recorded perplexities."""
    from lmserve.server.manifest import read_manifest

    kjv = shared_data / "kjv"
    metrics = read_manifest(kjv_5gram).provenance.metrics
    # Scored by our engine; KenLM's figures are in ../shared/data/kjv/README.md.
    assert metrics["test_perplexity"] == pytest.approx(57.3512, rel=0.01)
    assert metrics["test_perplexity_no_oov"] == pytest.approx(54.3300, rel=0.01)
    assert metrics["test_tokens"] == 41387 and metrics["test_oov"] == 230
    # Independent cross-check of the same ARPA with KenLM.
    import kenlm

    lm = kenlm.Model(str(kjv_5gram / "model.arpa.gz"))
    log10 = sum(lm.score(" ".join(s), bos=True, eos=True) for s in _read(kjv / "test.txt"))
    assert metrics["test_perplexity"] == pytest.approx(10 ** (-log10 / 41387), rel=1e-4)
    assert math.isfinite(metrics["valid_perplexity"])
