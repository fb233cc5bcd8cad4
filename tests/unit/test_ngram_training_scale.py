"""The trainer at scale: bounded-memory counting (sorted runs on disk, merged) gives exactly the
in-memory counts and the same ARPA file, the streaming reader gives exactly the whole-text
vocabulary and ids, and the narrow array steps equal numpy's own."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

from lmserve.export.corpora import KJV_TOKEN_PATTERN, kjv_split
from lmserve.export.ngram import tables
from lmserve.export.ngram.arpa_writer import read_arpa_entries
from lmserve.export.ngram.corpus_stream import TokenStore, line_blocks, read_corpus
from lmserve.export.ngram.counting import count_ngrams, count_store
from lmserve.export.ngram.memory import parse_memory, physical_memory
from lmserve.export.ngram.progress import Progress
from lmserve.export.ngram.spill import RawFile, merge_runs, write_run
from lmserve.export.ngram.tokens import make_tokenizer
from lmserve.export.ngram.vocab import encode_corpus, select_vocabulary
from lmserve.server.cli import main

TOKENS = make_tokenizer("word", [], lowercase=True, pattern=KJV_TOKEN_PATTERN)


def _kjv_corpus(tmp_path: Path, lines: int) -> Path:
    path = tmp_path / "train.txt"
    text = kjv_split("train").read_text(encoding="utf-8").splitlines()[:lines]
    path.write_text("\n".join(text) + "\n", encoding="utf-8")
    return path


def _assert_same_counts(a: tables.NgramCounts, b: tables.NgramCounts) -> None:
    assert a.vocab_size == b.vocab_size and len(a.orders) == len(b.orders)
    for x, y in zip(a.orders, b.orders, strict=True):
        for field in ("context", "word", "suffix", "count"):
            got, want = getattr(x, field), getattr(y, field)
            assert got.dtype == want.dtype, (x.order, field)
            np.testing.assert_array_equal(got, want, err_msg=f"{x.order}-gram {field}")


def test_spilled_counts_equal_in_memory_counts(tmp_path: Path) -> None:
    sentences = TOKENS.read(_kjv_corpus(tmp_path, 3000))
    words = select_vocabulary(sentences)
    corpus = encode_corpus(sentences, {w: i for i, w in enumerate(words)})
    in_memory = count_ngrams(corpus, 5, len(words))
    log = io.StringIO()
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    # 64 KB of working memory: chunks of ~1,600 tokens, dozens of runs per order.
    spilled = count_store(TokenStore.from_corpus(corpus), 5, len(words), memory=64 * 1024,
                          temp_dir=scratch, progress=Progress(log))  # fmt: skip
    _assert_same_counts(spilled, in_memory)
    assert " runs in " in log.getvalue() and "5-grams:" in log.getvalue()
    assert list(scratch.iterdir()) == []  # runs and node files are gone


def test_spilled_training_writes_the_same_arpa(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = _kjv_corpus(tmp_path, 4000)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    common = ["train-ngram", "--order", "4", "--lowercase", "--token-pattern", KJV_TOKEN_PATTERN,
              "--min-count", "2", "--arpa-only", "--no-gzip"]  # fmt: skip
    assert main([*common, str(corpus), str(tmp_path / "memory")]) == 0
    # The corpus's ids go to disk too (then remapped as read back, since --min-count drops words).
    argv = [*common, "--memory", "100K", "--temp-dir", str(scratch), str(corpus)]
    assert main([*argv, str(tmp_path / "spilled")]) == 0
    progress = capsys.readouterr().err
    assert "its ids go to" in progress and "4-grams:" in progress  # it did spill
    written = (tmp_path / "spilled" / "model.arpa").read_bytes()
    assert written == (tmp_path / "memory" / "model.arpa").read_bytes()
    assert list(scratch.iterdir()) == []


def test_merge_runs_sums_counts_of_equal_keys(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    runs, everything = [], []
    for i, size in enumerate([0, 1, 50, 3000, 3000, 777]):
        keys = np.unique(rng.integers(0, 5000, size))
        counts = rng.integers(1, 9, len(keys)).astype(np.int32)
        runs.append(write_run(tmp_path, f"r{i}", keys, counts))
        everything.append((keys, counts))
    out = (RawFile(tmp_path / "m.keys", np.int64), RawFile(tmp_path / "m.counts", np.int32))
    distinct = merge_runs(runs, out, block=64)
    keys = np.concatenate([k for k, _ in everything])
    want_keys, inverse = np.unique(keys, return_inverse=True)
    want_counts = np.bincount(inverse, weights=np.concatenate([c for _, c in everything]))
    assert distinct == len(want_keys)
    np.testing.assert_array_equal(out[0].read_all(), want_keys)
    np.testing.assert_array_equal(out[1].read_all(), want_counts.astype(np.int32))


@pytest.mark.parametrize("high", [3, 5000, 2**40, 2**62])  # 2**62: too wide to pack positions
def test_sorted_unique_equals_numpy_unique(high: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tables, "_BLOCK", 1000)  # many blocks, boundaries inside runs
    rng = np.random.default_rng(high)
    for n in (1, 2, 999, 1000, 1001, 12345):
        keys = rng.integers(0, high, n, dtype=np.int64)
        want, inverse, counts = np.unique(keys, return_inverse=True, return_counts=True)
        got = tables.sorted_unique(keys.copy())
        for a, b in zip(got, (want, counts, inverse), strict=True):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("spill", [False, True])
@pytest.mark.parametrize(("min_count", "top_n"), [(1, None), (2, None), (1, 300)])
def test_streamed_corpus_equals_whole_text_encoding(
    tmp_path: Path, spill: bool, min_count: int, top_n: int | None
) -> None:
    path = _kjv_corpus(tmp_path, 1500)
    with path.open("a", encoding="utf-8") as f:  # literal markers are their special ids
        f.write("and <s> god </s> said <unk>\n\n")
    sentences = TOKENS.read(path)
    want_words = select_vocabulary(sentences, min_count=min_count, top_n=top_n)
    want = encode_corpus(sentences, {w: i for i, w in enumerate(want_words)})
    limit = 1000 if spill else None
    words, store = read_corpus(
        TOKENS, path, min_count=min_count, top_n=top_n, memory_tokens=limit, temp_dir=tmp_path
    )
    assert words == want_words and store.in_memory is not spill
    np.testing.assert_array_equal(store.read(0, len(store.lengths)), want.ids)
    part = want.ids[store.offsets[10] : store.offsets[20]]
    np.testing.assert_array_equal(store.read(10, 20), part)
    chunks = store.chunks(200)  # whole sentences, at most 200 tokens unless one is longer
    assert [a for a, _ in chunks[1:]] == [b for _, b in chunks[:-1]]
    assert chunks[0][0] == 0 and chunks[-1][1] == len(store.lengths)
    assert all(store.offsets[b] - store.offsets[a] <= 200 or b == a + 1 for a, b in chunks)
    store.remove()


def test_line_blocks_split_as_splitlines(tmp_path: Path) -> None:
    text = "a b\r\nc\rd\x0be\u2028f\n\nlast line without newline " * 5
    path = tmp_path / "t.txt"
    path.write_bytes(text.encode("utf-8"))
    want = path.read_text(encoding="utf-8").splitlines()
    for size in (1, 2, 3, 7, 1000):
        assert [line for block in line_blocks(path, size) for line in block] == want


def test_bos_range_is_the_ngrams_starting_with_bos(tmp_path: Path) -> None:
    sentences = TOKENS.read(_kjv_corpus(tmp_path, 500))
    words = select_vocabulary(sentences)
    counts = count_ngrams(encode_corpus(sentences, {w: i for i, w in enumerate(words)}), 4,
                          len(words))  # fmt: skip
    first = np.arange(len(words))  # a unigram's first word is itself
    for k, table in enumerate(counts.orders, start=1):
        if k > 1:
            first = first[table.context]
        want = np.flatnonzero(first == 1)
        got = tables.bos_range(counts, k)
        assert (got.start, got.stop) == (want[0], want[-1] + 1)
        assert len(want) == got.stop - got.start  # one block


def test_memory_sizes() -> None:
    assert parse_memory("2G") == 2 * 2**30
    assert parse_memory("1.5g") == 3 * 2**29
    assert parse_memory("800MB") == 800 * 2**20
    assert parse_memory("4096") == 4096
    assert parse_memory("50%") == pytest.approx(physical_memory() / 2, abs=1)
    for bad in ("", "2X", "-1G", "0", "G"):
        with pytest.raises(ValueError):
            parse_memory(bad)


@pytest.mark.slow
def test_kjv_5gram_counted_in_runs_matches_lmplz(shared_data: Path, tmp_path: Path) -> None:
    """Modified Kneser-Ney on the whole KJV, counted with 2 MB of working memory, equals lmplz's
    5-gram entry by entry (the in-memory path is `test_kjv_trigram_matches_lmplz...`)."""
    out = tmp_path / "kjv5"
    train = shared_data / "kjv" / "train.txt"
    argv = ["train-ngram", "--order", "5", "--memory", "2M", "--temp-dir", str(tmp_path),
            "--arpa-only", "--no-gzip", str(train), str(out)]  # fmt: skip
    assert main(argv) == 0
    reference = read_arpa_entries(shared_data / "kjv" / "kenlm" / "kjv.5gram.arpa.gz")
    ours = read_arpa_entries(out / "model.arpa")
    assert ours.keys() == reference.keys()
    # lmplz writes log10 p(<s>) = 0, we write -99; neither is ever used (<s> is never predicted).
    assert ours.pop("<s>")[1] == pytest.approx(reference.pop("<s>")[1], abs=1e-4)
    prob_diff = max(abs(ours[g][0] - p) for g, (p, _) in reference.items())
    backoff_diff = max(abs(ours[g][1] - b) for g, (_, b) in reference.items())
    assert prob_diff < 1e-4 and backoff_diff < 1e-4, (prob_diff, backoff_diff)
