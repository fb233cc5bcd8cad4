"""Writes a `BackoffModel` as an ARPA file (log10 probabilities and back-off weights).

Layout (Doug Paul's ARPA format, as SRILM and KenLM write it): a `\\data\\` header with the
number of n-grams per order, then per order lines `log10 p <TAB> w1 .. wk [<TAB> log10 backoff]`
(the back-off column only below the highest order), then `\\end\\`. Impossible events (p = 0)
are written as -99, KenLM's and SRILM's stand-in for log10 0.

Memory: orders are written as the model computes them (`BackoffModel.orders`), each in blocks
of `BLOCK` lines: a block's words are found by following its n-grams' contexts down the tables
(one gather per order, in order, since a sorted block's contexts ascend), and only that block's
text exists as Python strings. Each line is formatted by a single `str.format` mapped over
whole columns.
"""

from __future__ import annotations

import gzip
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

import numpy as np

from lmserve.export.ngram.progress import Progress
from lmserve.export.ngram.smoothing.base import BackoffModel, FloatArray
from lmserve.export.ngram.tables import IndexArray, NgramCounts

LOG_ZERO = -99.0
BLOCK = 1 << 16


def log10_or_floor(values: FloatArray) -> list[float]:
    """log10 of each value, -99 where the value is 0 (or too small to matter)."""
    with np.errstate(divide="ignore"):
        logs = np.log10(values)
    return np.maximum(logs, LOG_ZERO).tolist()


def ngram_words(counts: NgramCounts, k: int, start: int, stop: int) -> list[IndexArray]:
    """The word ids of order-k n-grams start..stop-1, one array per position (first word
    first), found by following the contexts down to the unigrams."""
    table = counts.orders[k - 1]
    columns = [table.word[start:stop]]
    context = table.context[start:stop]
    for lower in reversed(counts.orders[1 : k - 1]):
        columns.append(lower.word[context])
        context = lower.context[context]
    if k > 1:
        columns.append(context)  # a unigram's index is its word id
    columns.reverse()
    return columns


def _names(words: Sequence[str], columns: list[IndexArray]) -> list[str]:
    """Each n-gram's words joined by spaces."""
    if len(columns) == 1:
        return [words[w] for w in columns[0].tolist()]
    texts = [[words[w] for w in column.tolist()] for column in columns]
    return list(map(" ".join, zip(*texts, strict=True)))


def _write(out: TextIO, model: BackoffModel, words: Sequence[str], progress: Progress) -> None:
    counts = model.counts
    out.write("\\data\\\n")
    for table in counts.orders:
        out.write(f"ngram {table.order}={len(table)}\n")
    total = sum(len(t) for t in counts.orders)
    written = 0
    for k, probs, backoffs in model.orders():
        out.write(f"\n\\{k}-grams:\n")
        for start in range(0, len(probs), BLOCK):
            stop = min(start + BLOCK, len(probs))
            names = _names(words, ngram_words(counts, k, start, stop))
            logs = log10_or_floor(probs[start:stop])
            if backoffs is not None:
                weights = log10_or_floor(backoffs[start:stop])
                lines = map("{:.7g}\t{}\t{:.7g}\n".format, logs, names, weights)
            else:
                lines = map("{:.7g}\t{}\n".format, logs, names)
            out.writelines(lines)
            written += stop - start
            progress.update(f"writing the ARPA: {written:,} of {total:,} n-grams "
                            f"({100.0 * written / total:.0f}%)")  # fmt: skip
        del probs, backoffs
    out.write("\n\\end\\\n")


def write_arpa(
    model: BackoffModel, words: Sequence[str], path: Path, progress: Progress | None = None
) -> Path:
    """Writes the ARPA file, gzipped (fastest level) when the name ends in `.gz`."""
    progress = progress or Progress.silent()
    if path.suffix == ".gz":
        with gzip.open(path, "wt", encoding="utf-8", compresslevel=1) as out:
            _write(out, model, words, progress)
    else:
        with path.open("w", encoding="utf-8") as out:
            _write(out, model, words, progress)
    return path


def read_arpa_entries(path: Path) -> dict[str, tuple[float, float]]:
    """Every n-gram of an ARPA file (`.gz` read directly) -> (log10 p, log10 backoff or 0).

    A plain reader for checks and comparisons (the serving engine has its own loader)."""
    opener = gzip.open if path.suffix == ".gz" else open
    entries: dict[str, tuple[float, float]] = {}
    in_ngrams = False
    with opener(path, "rt", encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith("\\"):
                in_ngrams = line.endswith("-grams:")
                continue
            if in_ngrams and line:
                fields = line.split("\t")
                backoff = float(fields[2]) if len(fields) > 2 else 0.0
                entries[fields[1]] = (float(fields[0]), backoff)
    return entries
