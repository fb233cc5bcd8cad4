"""ARPA file -> `NgramTables` in one streaming pass, holding nothing but the finished tables.

The file is framed here (header, `\\data\\` counts, section lines, gzip: `arpa.LineBlocks`) and
each section's lines go, in blocks, to the C builder (`_arpa_import.TableBuilder`), which parses
them straight into the probing tables the `\\data\\` counts size. The import's memory is the
model's own size plus a block, and the rate is KenLM's ARPA loading or better
(`bench/bench_ngram_scale.py`).

The in-memory numpy path (`arpa.read_arpa` + `build.build_tables`) remains the reference, and
the fallback when the C module is not built, or when a pruned file lacks more prefixes and
suffixes than the counted tables can take as fill-ins (`TooManyFillIns`, with a warning).
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import BinaryIO

import numpy as np

from lmserve.server.backends.ngram.arpa import (
    BLOCK_BYTES,
    Fail,
    LineBlocks,
    Progress,
    end_section,
    expect_end,
    expect_section,
    failing,
    open_arpa,
    read_arpa,
    read_counts,
)
from lmserve.server.backends.ngram.build import MISSING_UNK_LOG10, build_tables
from lmserve.server.backends.ngram.hashing import ProbingTable, slot_dtype
from lmserve.server.backends.ngram.tables import BOS, EOS, UNK, NgramTables
from lmserve.server.errors import ArpaFormatError

try:
    from lmserve.server.backends.ngram import _arpa_import
except ImportError:  # not compiled (a source checkout without `make install`)
    _arpa_import = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

LN10 = math.log(10.0)


def import_arpa(
    path: str | Path, *, progress: Progress | None = None, block_bytes: int = BLOCK_BYTES
) -> NgramTables:
    """Reads an ARPA file (plain or gzipped, any order) into the model's tables, streaming.

    Raises ArpaFormatError naming the line for malformed input. `progress(read, total)` is
    called after each block with the n-grams read and the total the counts declare."""
    path = Path(path)
    if _arpa_import is None:
        return _in_memory(path, progress, block_bytes)
    try:
        with open_arpa(path) as stream:
            try:
                return _stream(stream, str(path), progress, block_bytes)
            except (OSError, EOFError) as exc:  # a truncated gzip stream, a read error
                raise ArpaFormatError(str(path), "cannot read", f"{exc}") from exc
    except _arpa_import.TooManyFillIns as exc:
        logger.warning("%s: %s; building the model in memory instead", path, exc)
        return _in_memory(path, progress, block_bytes)


def _in_memory(path: Path, progress: Progress | None, block_bytes: int) -> NgramTables:
    return build_tables(read_arpa(path, progress=progress, block_bytes=block_bytes), str(path))


class _Feed:
    """The builder as `LineBlocks.consume_section`'s parser: errors become ArpaFormatError,
    and progress is reported after each block."""

    def __init__(
        self, builder: _arpa_import.TableBuilder, fail: Fail, progress: Progress | None, total: int
    ) -> None:
        self.builder, self.fail, self.progress, self.total = builder, fail, progress, total
        self.done = 0  # entries of the sections before this one
        self.filled = 0  # entries of this section

    def __call__(
        self, buffer: bytes, start: int, first_line: int, at_eof: bool
    ) -> tuple[int, int, bool]:
        try:
            end, n_lines, over, self.filled = self.builder.feed(buffer, start, first_line, at_eof)
        except ValueError as exc:
            line, reason, got = exc.args
            raise self.fail(line, reason, got) from None
        if self.progress is not None:
            self.progress(self.done + self.filled, self.total)
        return end, n_lines, over


def _stream(
    stream: BinaryIO, name: str, progress: Progress | None, block_bytes: int
) -> NgramTables:
    fail = failing(name)
    lines = LineBlocks(stream, block_bytes)
    counts, text = read_counts(lines, fail)
    builder = _arpa_import.TableBuilder(tuple(counts), LN10)
    feed = _Feed(builder, fail, progress, sum(counts))
    for n, count in enumerate(counts, start=1):
        expect_section(lines, text, n, fail)
        builder.start_section(n)
        feed.filled = 0
        lines.consume_section(feed)
        text = end_section(lines, n, count, feed.filled, fail)
        feed.done += count
    expect_end(lines, text, fail)
    vocab_bytes, uni_prob, uni_backoff, tables, fill_ins, lists = builder.finish()
    del builder
    try:
        vocab = vocab_bytes.decode("utf-8").split("\n")
    except UnicodeDecodeError as exc:
        raise fail(1, "a word is not UTF-8", str(exc).encode()) from None
    for marker in (BOS, EOS):
        if marker not in vocab:
            raise ArpaFormatError(name, f"the unigrams lack {marker}")
    probs = np.frombuffer(uni_prob, dtype=np.float32)
    backoffs = np.frombuffer(uni_backoff, dtype=np.float32)
    start = (
        np.frombuffer(lists[0], dtype=np.uint32) if lists else np.zeros(len(vocab) + 1, np.uint32)
    )
    words = np.frombuffer(lists[1], dtype=np.uint32) if lists else np.zeros(0, np.uint32)
    if UNK not in vocab:  # KenLM scores unknown words at log10 -100 then
        vocab.append(UNK)
        probs = np.append(probs, np.float32(MISSING_UNK_LOG10 * LN10))
        backoffs = np.append(backoffs, np.float32(0.0))
        start = np.append(start, start[-1])  # no bigram begins with it
    order = len(counts)
    return NgramTables(
        vocab=vocab,
        counts=counts,
        uni_prob=probs,
        uni_backoff=backoffs,
        tables=[
            ProbingTable(np.frombuffer(raw, dtype=slot_dtype(k == order)), n_home)
            for k, (raw, n_home) in enumerate(tables, start=2)
        ],
        fill_ins=list(fill_ins),
        bigram_start=start,
        bigram_words=words,
    )
