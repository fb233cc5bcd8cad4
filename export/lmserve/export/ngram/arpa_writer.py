"""Writes a `BackoffModel` as an ARPA file (log10 probabilities and back-off weights).

Layout (Doug Paul's ARPA format, as SRILM and KenLM write it): a `\\data\\` header with the
number of n-grams per order, then per order lines `log10 p <TAB> w1 .. wk [<TAB> log10 backoff]`
(the back-off column only below the highest order), then `\\end\\`. Impossible events (p = 0)
are written as -99, KenLM's and SRILM's stand-in for log10 0.

Speed: an n-gram's text is its context's text plus one word, built per order with one list
comprehension; each line is formatted by a single `str.format` mapped over whole columns.
"""

from __future__ import annotations

import gzip
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

import numpy as np

from lmserve.export.ngram.smoothing.base import BackoffModel, FloatArray

LOG_ZERO = -99.0


def log10_or_floor(values: FloatArray) -> list[float]:
    """log10 of each value, -99 where the value is 0 (or too small to matter)."""
    with np.errstate(divide="ignore"):
        logs = np.log10(values)
    return np.maximum(logs, LOG_ZERO).tolist()


def _write(out: TextIO, model: BackoffModel, words: Sequence[str]) -> None:
    counts = model.counts
    out.write("\\data\\\n")
    for table in counts.orders:
        out.write(f"ngram {table.order}={len(table)}\n")
    names: list[str] = list(words)
    for table in counts.orders:
        k = table.order
        if k > 1:
            previous = names
            names = [
                f"{previous[c]} {words[w]}"
                for c, w in zip(table.context.tolist(), table.word.tolist(), strict=True)
            ]
        out.write(f"\n\\{k}-grams:\n")
        probs = log10_or_floor(model.probs[k - 1])
        if k < counts.order:
            backoffs = log10_or_floor(model.backoffs[k - 1])
            lines = map("{:.7g}\t{}\t{:.7g}\n".format, probs, names, backoffs)
        else:
            lines = map("{:.7g}\t{}\n".format, probs, names)
        out.writelines(lines)
    out.write("\n\\end\\\n")


def write_arpa(model: BackoffModel, words: Sequence[str], path: Path) -> Path:
    """Writes the ARPA file, gzipped (fastest level) when the name ends in `.gz`."""
    if path.suffix == ".gz":
        with gzip.open(path, "wt", encoding="utf-8", compresslevel=1) as out:
            _write(out, model, words)
    else:
        with path.open("w", encoding="utf-8") as out:
            _write(out, model, words)
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
