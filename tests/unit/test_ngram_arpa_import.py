"""The streaming C import (`arpa_import.import_arpa`) against the numpy reference build.

Both must give the same model: the same vocabulary, counts and fill-ins, the same score for
every text and the same next-word distributions (slots may differ: the C builder inserts in file
order, the numpy build in home order). Numbers must read exactly as Python's `float()`.
"""

from __future__ import annotations

import gzip
import logging
import math
import random
from pathlib import Path

import numpy as np
import pytest

from lmserve.server.backends.ngram.arpa import read_arpa
from lmserve.server.backends.ngram.arpa_import import import_arpa
from lmserve.server.backends.ngram.build import build_tables
from lmserve.server.backends.ngram.model import NgramModel
from lmserve.server.backends.ngram.tables import NgramTables
from lmserve.server.errors import ArpaFormatError
from lmserve.server.text.word import encode_token_lists

LN10 = math.log(10.0)
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "ngram"
SHARED = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"


def reference(path: Path) -> NgramTables:
    return build_tables(read_arpa(path), str(path))


def assert_same_model(got: NgramTables, want: NgramTables, texts: list[list[str]]) -> None:
    assert got.vocab == want.vocab
    assert got.counts == want.counts
    assert got.fill_ins == want.fill_ins
    np.testing.assert_array_equal(got.uni_prob, want.uni_prob)
    np.testing.assert_array_equal(got.uni_backoff, want.uni_backoff)
    assert [t.n_entries for t in got.tables] == [t.n_entries for t in want.tables]
    # The bigram lists: the same words after each word (their order follows the slots).
    np.testing.assert_array_equal(got.bigram_start, want.bigram_start)
    for w in range(0, len(got.vocab), max(1, len(got.vocab) // 500)):
        lo, hi = int(got.bigram_start[w]), int(got.bigram_start[w + 1])
        assert sorted(got.bigram_words[lo:hi]) == sorted(want.bigram_words[lo:hi])
    assert [t.final for t in got.tables] == [k == got.order for k in range(2, got.order + 1)]
    a, b = NgramModel(got), NgramModel(want)
    batch = encode_token_lists(texts, a.vocab)
    for bos in (True, False):
        sa = a.score(batch, bos=bos, per_token=True)
        sb = b.score(batch, bos=bos, per_token=True)
        assert sa.ngram_lengths is not None and sb.ngram_lengths is not None
        assert sa.ngram_lengths.tolist() == sb.ngram_lengths.tolist()
        # Fill-in entries sum float32 values here and log10 float64 values there: 1 ulp apart.
        np.testing.assert_allclose(sa.token_log_probs, sb.token_log_probs, rtol=0, atol=2e-6)
    contexts = [
        [int(i) for i in batch.ids[lo:hi]]
        for lo, hi in zip(batch.offsets[:-1], batch.offsets[1:], strict=True)
    ]
    np.testing.assert_allclose(
        a.next_token_log_probs_batch(contexts[:60]),
        b.next_token_log_probs_batch(contexts[:60]),
        rtol=0,
        atol=2e-6,
    )


def random_texts(vocab: list[str], n: int, seed: int) -> list[list[str]]:
    rng = random.Random(seed)
    return [
        [rng.choice(vocab) if rng.random() > 0.05 else "oov-word" for _ in range(rng.randrange(12))]
        for _ in range(n)
    ]


@pytest.mark.parametrize("name", ["toy.arpa", "toy_pruned.arpa"])
def test_fixtures_equal_the_reference(name: str) -> None:
    path = FIXTURES / name
    want = reference(path)
    assert_same_model(import_arpa(path), want, random_texts(want.vocab, 300, 1))


@pytest.mark.parametrize("name", ["test.arpa", "test_nounk.arpa"])
def test_kenlm_test_models_fill_in_as_the_reference(
    name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """KenLM's hand-made 5-grams lack prefixes and suffixes: the C builder fills them in itself
    (no fallback warning) exactly where the reference does."""
    path = SHARED / "kenlm-tests" / name
    want = reference(path)
    with caplog.at_level(logging.WARNING):
        got = import_arpa(path)
    assert "in memory instead" not in caplog.text
    assert sum(got.fill_ins) > 0
    assert_same_model(got, want, random_texts(want.vocab, 400, 2))


def test_kjv_3gram_equals_the_reference(shared_data: Path) -> None:
    path = shared_data / "kjv" / "kenlm" / "kjv.3gram.arpa"
    want = reference(path)
    texts = [line.split() for line in (shared_data / "kjv" / "test.txt").read_text().splitlines()]
    got = import_arpa(path)
    assert_same_model(got, want, texts[:1500])
    # Exactly KenLM's probing footprint or less: 24 bytes a context n-gram, 18 a highest one.
    assert got.nbytes() / got.n_entries() < 24


@pytest.mark.parametrize("block_bytes", [1, 7, 64, 1000])
def test_any_block_size_imports_the_same_model(tmp_path: Path, block_bytes: int) -> None:
    text = (FIXTURES / "toy_pruned.arpa").read_text()
    messy = text.replace("\\2-grams:\n", "\\2-grams:\n\n  \n").replace("\n", "\r\n")
    path = tmp_path / "m.arpa.gz"
    path.write_bytes(gzip.compress(messy.rstrip("\r\n").encode()))
    want = reference(FIXTURES / "toy_pruned.arpa")
    seen: list[tuple[int, int]] = []
    got = import_arpa(path, block_bytes=block_bytes, progress=lambda d, t: seen.append((d, t)))
    assert_same_model(got, want, random_texts(want.vocab, 100, 3))
    assert seen[-1] == (sum(want.counts), sum(want.counts))


def test_numbers_read_exactly_as_pythons_float(tmp_path: Path) -> None:
    """The C parser's fast path (<= 19 digits, a power of ten below 1e23) and its strtod path
    must both round as `float()` does, before the value becomes a float32 natural log."""
    rng = random.Random(7)
    forms = ["-1.2345678901234567", "-0", "0", "-99", "-inf", "1e-05", "-1.5E+02", "+0.5"]
    forms += [".5", "-.5", "5.", "-0.30102999566398120", "-0.000000000000000000000001234"]
    forms += ["-12345678901234567890.5", "-1.00000000000000000000001"]
    for _ in range(3000):
        x = -rng.random() * 10 ** rng.randrange(-3, 3)
        forms.append(rng.choice([repr(x), f"{x:.6f}", f"{x:.7g}", f"{x:e}", f"{x:.17f}"]))
    unigrams = "".join(f"{p}\tw{i}\t{p}\n" for i, p in enumerate(forms))
    arpa = tmp_path / "numbers.arpa"
    arpa.write_text(
        f"\\data\\\nngram 1={len(forms) + 2}\nngram 2=1\n\n\\1-grams:\n-1\t<s>\t0\n-1\t</s>\n"
        f"{unigrams}\n\\2-grams:\n-0.5\t<s> </s>\n\n\\end\\\n"
    )
    got = import_arpa(arpa)
    want_prob = [np.float32(min(float(f), 0.0) * LN10) for f in forms]
    want_backoff = [np.float32(float(f) * LN10) for f in forms]
    np.testing.assert_array_equal(got.uni_prob[2 : 2 + len(forms)], want_prob)
    np.testing.assert_array_equal(got.uni_backoff[2 : 2 + len(forms)], want_backoff)


def _chain_arpa(n_words: int, declared_bigrams: int) -> str:
    """Trigrams "w_i w_i+1 w_i+2" with almost none of their bigrams: every prefix and suffix is a
    fill-in."""
    words = [f"w{i}" for i in range(n_words)]
    unigrams = "".join(f"-{1 + i % 7 / 10}\t{w}\t-0.{i % 9 + 1}\n" for i, w in enumerate(words))
    trigrams = "".join(
        f"-0.{i % 8 + 1}\t{words[i]} {words[i + 1]} {words[i + 2]}\n" for i in range(n_words - 2)
    )
    bigrams = "".join(f"-0.3\t{words[i]} {words[i + 1]}\t-0.2\n" for i in range(declared_bigrams))
    return (
        f"\\data\\\nngram 1={n_words + 2}\nngram 2={declared_bigrams}\nngram 3={n_words - 2}\n\n"
        f"\\1-grams:\n-99\t<s>\t-0.4\n-1.5\t</s>\n{unigrams}\n\\2-grams:\n{bigrams}\n"
        f"\\3-grams:\n{trigrams}\n\\end\\\n"
    )


@pytest.mark.parametrize("n_words", [40, 400])
def test_missing_prefixes_and_suffixes(
    tmp_path: Path, n_words: int, caplog: pytest.LogCaptureFixture
) -> None:
    """40 words: the fill-ins fit the table's spare room and the C builder adds them; 400: more
    than a table sized for 2 bigrams can take, so the import falls back to the numpy build (with
    a warning). The model is the reference's either way."""
    path = tmp_path / "chain.arpa"
    path.write_text(_chain_arpa(n_words, declared_bigrams=2))
    want = reference(path)
    with caplog.at_level(logging.WARNING):
        got = import_arpa(path)
    assert ("in memory instead" in caplog.text) == (n_words == 400)
    assert got.fill_ins[1] == n_words - 1 - 2  # every bigram of the chain but the declared two
    words = want.vocab
    texts = [words[i : i + 5] for i in range(len(words) - 5)] + random_texts(words, 200, 4)
    assert_same_model(got, want, texts)


@pytest.mark.parametrize(
    ("old", "new", "line", "words"),
    [
        ("-0.2\t<s> a\t-0.4", "-0.2\t<s> a\t-0.4\t1", 15, "fields"),
        ("-0.2\t<s> a\t-0.4", "-0.2\t<s> zz\t-0.4", 15, "not among the unigrams"),
        ("-0.2\t<s> a\t-0.4", "x\t<s> a\t-0.4", 15, "not a number"),
        ("-0.2\t<s> a\t-0.4", "-0.2\t<s> a\t-0.4e", 15, "not a number"),
        ("-0.3\ta b\t-0.25", "-0.3\t<s> a\t-0.25", 16, "duplicate 2-gram"),
        ("-0.8\tc\t-0.1", "-0.8\ta\t-0.1", 12, "duplicate unigram"),
        ("ngram 3=3", "ngram 3=2", 24, "declares 2 3-grams, the section has more"),
    ],
)
def test_malformed_lines_are_named(
    tmp_path: Path, old: str, new: str, line: int, words: str
) -> None:
    text = (FIXTURES / "toy_pruned.arpa").read_text()
    assert old in text
    path = tmp_path / "bad.arpa"
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(ArpaFormatError) as info:
        import_arpa(path)
    assert f"line {line}:" in str(info.value) and words in str(info.value)
