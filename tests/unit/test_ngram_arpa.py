"""ARPA reading: format variations are accepted, malformed files name the offending line."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from lmserve.server.backends.ngram.arpa import ArpaModel, read_arpa
from lmserve.server.backends.ngram.model import NgramModel
from lmserve.server.errors import ArpaFormatError
from lmserve.server.text.word import encode_token_lists

GOOD = """\\data\\
ngram 1=4
ngram 2=2

\\1-grams:
-1.0\t<unk>\t0
-99\t<s>\t-0.5
-0.5\t</s>
-0.6\ta\t-0.3

\\2-grams:
-0.2\t<s> a
-0.1\ta </s>

\\end\\
"""


def write(tmp_path: Path, text: str, name: str = "m.arpa") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_reads_counts_and_vocab(tmp_path: Path) -> None:
    arpa = read_arpa(write(tmp_path, GOOD))
    assert arpa.counts == [4, 2]
    assert arpa.vocab == ["<unk>", "<s>", "</s>", "a"]
    assert arpa.orders[1].words.tolist() == [[1, 3], [3, 2]]
    assert arpa.orders[0].log10_backoff.tolist() == [0.0, -0.5, 0.0, -0.3]


def test_gzip_spaces_and_blank_lines_score_the_same(tmp_path: Path) -> None:
    plain = NgramModel.from_arpa(write(tmp_path, GOOD))
    messy = GOOD.replace("\t", "   ").replace("\\2-grams:\n", "\\2-grams:\n\n  \n")
    gz = tmp_path / "m.arpa.gz"
    gz.write_bytes(gzip.compress(messy.replace("\n", "\r\n").encode()))
    other = NgramModel.from_arpa(gz)
    batch = encode_token_lists([["a"], ["a", "a"], []], plain.vocab)
    assert plain.score(batch).totals.tolist() == other.score(batch).totals.tolist()


@pytest.mark.parametrize(
    ("edit", "line", "words"),
    [
        (("ngram 2=2", "ngram 2=x"), 3, "ngram N=count"),
        (("ngram 2=2", "ngram 2=3"), 14, "declares 3 2-grams"),
        (("-0.6\ta\t-0.3", "-0.6\ta\t-0.3\textra"), 9, "fields"),
        (("-0.1\ta </s>", "-0.1\ta </s>\t-0.5"), 13, "fields"),
        (("-0.2\t<s> a", "-0.2x\t<s> a"), 12, "not a number"),
        (("-0.6\ta\t-0.3", "-0.6\ta\tminus"), 9, "not a number"),
        (("-0.1\ta </s>", "-0.1\ta b"), 13, "not among the unigrams"),
        (("\\end\\\n", ""), 14, "\\end\\"),
        (("\\data\\", "\\date\\"), 1, "\\data\\"),
        (("-0.5\t</s>", "-0.5\ta"), 9, "duplicate unigram"),
        (("-0.1\ta </s>", "-0.1\t<s> a"), 13, "duplicate 2-gram"),
    ],
)
def test_malformed_names_the_line(tmp_path: Path, edit, line: int, words: str) -> None:
    old, new = edit
    assert old in GOOD
    path = write(tmp_path, GOOD.replace(old, new, 1))
    with pytest.raises(ArpaFormatError) as info:
        NgramModel.from_arpa(path)
    assert f"line {line}:" in str(info.value)
    assert words in str(info.value)
    assert info.value.path == str(path)


def test_missing_sentence_markers(tmp_path: Path) -> None:
    text = GOOD.replace("ngram 1=4", "ngram 1=3").replace("-0.5\t</s>\n", "")
    text = text.replace("ngram 2=2", "ngram 2=1").replace("-0.1\ta </s>\n", "")
    with pytest.raises(ArpaFormatError, match="lack </s>"):
        NgramModel.from_arpa(write(tmp_path, text))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ArpaFormatError, match="cannot read"):
        NgramModel.from_arpa(tmp_path / "absent.arpa")


def _same(a: ArpaModel, b: ArpaModel) -> bool:
    return (
        a.vocab == b.vocab
        and a.counts == b.counts
        and all(
            np.array_equal(x.words, y.words)
            and np.array_equal(x.log10_prob, y.log10_prob)
            and np.array_equal(x.log10_backoff, y.log10_backoff)
            and np.array_equal(x.lines, y.lines)
            for x, y in zip(a.orders, b.orders, strict=True)
        )
    )


@pytest.mark.parametrize("block_bytes", [1, 2, 3, 5, 7, 16, 31, 64, 1000])
def test_any_block_size_reads_the_same_model(tmp_path: Path, block_bytes: int) -> None:
    """The file is read in blocks of whole lines: where a block ends must not matter (blank
    lines, CRLF and a last line without a newline included)."""
    messy = GOOD.replace("\\2-grams:\n", "\\2-grams:\n\n  \n").replace("\n", "\r\n")
    for text in (GOOD, messy, GOOD.rstrip("\n")):
        path = write(tmp_path, text)
        whole = read_arpa(path, block_bytes=1 << 30)
        assert _same(read_arpa(path, block_bytes=block_bytes), whole)


def test_a_real_model_read_in_small_blocks_is_the_same(shared_data: Path) -> None:
    path = shared_data / "kjv" / "kenlm" / "kjv.3gram.arpa"
    seen: list[tuple[int, int]] = []
    small = read_arpa(
        path, block_bytes=4093, progress=lambda done, total: seen.append((done, total))
    )
    assert _same(small, read_arpa(path))
    total = sum(small.counts)
    assert seen[-1] == (total, total) and len(seen) > 100  # progress after every block
    assert all(a[0] <= b[0] for a, b in zip(seen, seen[1:], strict=False))


def test_a_truncated_gzip_is_one_clear_error(tmp_path: Path) -> None:
    data = gzip.compress(GOOD.encode())
    path = tmp_path / "cut.arpa.gz"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ArpaFormatError, match="cannot read|expected"):
        read_arpa(path)


def test_numbers_read_in_place_equal_pythons_float(tmp_path: Path) -> None:
    """Higher orders' numbers are parsed from the block's bytes by numpy: every form an ARPA
    writer uses must give exactly what `float()` gives."""
    forms = ["-1.2345678901234567", "-0", "0", "-99", "-inf", "1e-05", "-1.5E+02", "+0.5"]
    forms += [".5", "-.5", "5.", "-0.30102999566398120"]
    bigrams = "".join(f"{p}\t<s> a\n" for p in forms)  # read only: repeats do not matter
    text = GOOD.replace("ngram 2=2", f"ngram 2={len(forms)}").replace(
        "-0.2\t<s> a\n-0.1\ta </s>\n", bigrams
    )
    order = read_arpa(write(tmp_path, text)).orders[1]
    assert order.log10_prob.tolist() == [min(float(f), 0.0) for f in forms]
