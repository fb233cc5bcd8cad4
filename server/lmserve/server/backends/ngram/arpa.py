"""Reads ARPA back-off language models (as lmplz and SRILM write them) into numpy arrays.

The format: a `\\data\\` section with one `ngram N=count` line per order, then one
`\\N-grams:` section per order with lines `log10prob w1 ... wN [log10backoff]`, then `\\end\\`.
Fields may be separated by tabs or spaces; blank lines are ignored; files may be gzipped.

Each section is parsed in bulk (one `bytes.split()`, numpy for the per-line field counts, C-level
`map` for numbers and word ids) so that a 60 MB ARPA loads in about a second, with no Python loop
per line. Any malformed input raises `ArpaFormatError` naming the line.
"""

from __future__ import annotations

import gzip
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import itemgetter
from pathlib import Path

import numpy as np
import numpy.typing as npt

from lmserve.server.errors import ArpaFormatError

_COUNT_LINE = re.compile(rb"^ngram\s+(\d+)\s*=\s*(\d+)$")
_SECTION_LINE = re.compile(rb"^\\(\d+)-grams:$")

# The bytes `bytes.split()` treats as whitespace, except the newline that ends a line.
_SPACE = np.zeros(256, dtype=np.bool_)
_SPACE[[0x20, 0x09, 0x0B, 0x0C, 0x0D]] = True


@dataclass
class ArpaOrder:
    """The entries of one order, in file order. Values are log10, as in the file."""

    words: npt.NDArray[np.int32]  # [count, n] vocabulary ids
    log10_prob: npt.NDArray[np.float64]  # [count]
    log10_backoff: npt.NDArray[np.float64]  # [count], 0 where the file gave none
    lines: npt.NDArray[np.int64]  # [count] 1-based line numbers, for error messages


@dataclass
class ArpaModel:
    """An ARPA file's contents: the vocabulary (unigram order) and every order's entries."""

    vocab: list[str]
    orders: list[ArpaOrder]  # orders[0] holds the unigrams (words[:, 0] == arange)
    counts: list[int]  # as declared in \data\


def read_arpa_bytes(path: Path) -> bytes:
    """Whole file, gunzipped when it is gzip (by magic number, not by name)."""
    try:
        with path.open("rb") as f:
            head = f.read(2)
        if head == b"\x1f\x8b":
            with gzip.open(path, "rb") as g:
                return g.read()
        return path.read_bytes()
    except (OSError, EOFError) as exc:
        raise ArpaFormatError(str(path), "cannot read", f"{exc}") from exc


def read_arpa(path: str | Path) -> ArpaModel:
    """Parses an ARPA file (plain or gzipped) of any order."""
    path = Path(path)
    return parse_arpa(read_arpa_bytes(path), str(path))


def parse_arpa(data: bytes, name: str = "<arpa>") -> ArpaModel:
    def fail(line: int, reason: str, got: bytes | None = None) -> ArpaFormatError:
        # What the line holds goes to the log only (`detail`), never to clients.
        detail = "" if got is None else f"got {got[:80]!r}"
        return ArpaFormatError(name, f"line {line}: {reason}", detail)

    pos, line_no = 0, 0

    def next_line() -> bytes | None:
        nonlocal pos, line_no
        if pos >= len(data):
            return None
        end = data.find(b"\n", pos)
        end = len(data) if end < 0 else end
        text = data[pos:end].strip()
        pos, line_no = end + 1, line_no + 1
        return text

    # Header: anything before \data\ is ignored (SRILM may write comments there).
    while (text := next_line()) is not None and text != b"\\data\\":
        pass
    if text is None:
        raise fail(1, f"no \\data\\ section in {line_no} lines")
    counts: list[int] = []
    while (text := next_line()) is not None and not text.startswith(b"\\"):
        if not text:
            continue
        m = _COUNT_LINE.match(text)
        if m is None:
            raise fail(line_no, "expected 'ngram N=count'", text)
        if int(m.group(1)) != len(counts) + 1:
            raise fail(line_no, f"expected the count of order {len(counts) + 1}")
        counts.append(int(m.group(2)))
    if not counts:
        raise fail(line_no, "\\data\\ declares no n-gram counts")
    if counts[0] == 0:
        raise fail(line_no, "the model has no unigrams")

    vocab: list[str] = []
    index: dict[bytes, int] = {}
    orders: list[ArpaOrder] = []
    for n, count in enumerate(counts, start=1):
        if text is None or _SECTION_LINE.match(text) is None or int(text[1:-7]) != n:
            raise fail(line_no, f"expected \\{n}-grams:", text or b"end of file")
        start, first_line = pos, line_no + 1
        # The section runs to the next line that begins with a backslash.
        end = data.find(b"\n\\", start - 1)
        end = len(data) if end < 0 else end + 1
        block = data[start:end]
        order = _parse_section(block, n, count, n < len(counts), first_line, index, vocab, fail)
        orders.append(order)
        line_no += block.count(b"\n")
        pos = end
        text = next_line()
        while text == b"" and text is not None:
            text = next_line()
    if text != b"\\end\\":
        raise fail(line_no, "expected \\end\\", text or b"end of file")
    return ArpaModel(vocab=vocab, orders=orders, counts=counts)


def _parse_section(
    block: bytes,
    n: int,
    count: int,
    has_backoff: bool,
    first_line: int,
    index: dict[bytes, int],
    vocab: list[str],
    raise_at: Callable[[int, str, bytes | None], ArpaFormatError],
) -> ArpaOrder:
    """Parses one `\\n-grams:` block; unigrams also fill `index`/`vocab`."""
    arr = np.frombuffer(block, dtype=np.uint8)
    newline = arr == 0x0A
    space = _SPACE[arr] | newline
    # A field starts at a non-space byte that follows a space (or the block start); the fields
    # of a line are a segmented sum of those starts between newlines.
    starts = ~space
    starts[1:] &= space[:-1]
    line_begin = np.concatenate([[0], np.flatnonzero(newline) + 1])
    line_begin = line_begin[line_begin < len(arr)]
    n_lines = len(line_begin)
    fields = (
        np.add.reduceat(starts, line_begin, dtype=np.int64) if n_lines else np.zeros(0, np.int64)
    )
    nonblank = np.flatnonzero(fields)
    lines = nonblank.astype(np.int64) + first_line
    fields = fields[nonblank]
    if len(fields) != count:
        where = int(lines[count]) if len(fields) > count else first_line + n_lines - 1
        raise raise_at(
            where, f"\\data\\ declares {count} {n}-grams, the section has {len(fields)}", None
        )
    allowed = (fields == n + 1) | ((fields == n + 2) & has_backoff)
    if not allowed.all():
        bad = int(np.argmin(allowed))
        want = f"{n + 1} or {n + 2}" if has_backoff else f"{n + 1}"
        raise raise_at(
            int(lines[bad]),
            f"a {n}-gram line needs {want} fields, it has {int(fields[bad])}",
            None,
        )
    tokens = block.split()
    first = np.zeros(count, dtype=np.int64)
    np.cumsum(fields[:-1], out=first[1:])
    # lmplz writes every line of a section with the same number of fields: then a column is a
    # plain slice of the token list, much cheaper than gathering by index.
    stride = int(fields[0]) if count and (fields == fields[0]).all() else 0

    def column(at: npt.NDArray[np.int64]) -> Sequence[bytes]:
        if stride and len(at) == count:
            return tokens[int(at[0]) :: stride]
        return _gather(tokens, at)

    def floats(at: npt.NDArray[np.int64], which: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        got = column(at)
        try:
            return np.fromiter(map(float, got), dtype=np.float64, count=len(at))
        except ValueError:
            for i, tok in enumerate(got):
                try:
                    float(tok)
                except ValueError:
                    line = int(lines[which[i]])
                    raise raise_at(line, "not a number", tok) from None
            raise

    everything = np.arange(count, dtype=np.int64)
    log10_prob = floats(first, everything)
    # KenLM clamps positive log-probabilities to 0 (with a warning); so do we.
    np.minimum(log10_prob, 0.0, out=log10_prob)
    log10_backoff = np.zeros(count, dtype=np.float64)
    with_backoff = np.flatnonzero(fields == n + 2)
    if len(with_backoff):
        log10_backoff[with_backoff] = floats(first[with_backoff] + n + 1, with_backoff)

    words = np.empty((count, n), dtype=np.int32)
    if n == 1:
        raw = column(first + 1)
        for i, word in enumerate(raw):
            if word in index:
                raise raise_at(int(lines[i]), "duplicate unigram", word)
            index[word] = i
        try:
            vocab.extend(w.decode("utf-8") for w in raw)
        except UnicodeDecodeError as exc:
            raise raise_at(first_line, "a word is not UTF-8", str(exc).encode()) from None
        words[:, 0] = np.arange(count, dtype=np.int32)
    else:
        for j in range(n):
            raw = column(first + 1 + j)
            ids = np.fromiter(map(index.get, raw, repeat(-1)), dtype=np.int32, count=count)
            if (ids < 0).any():
                bad = int(np.argmin(ids))
                raise raise_at(int(lines[bad]), "a word is not among the unigrams", raw[bad])
            words[:, j] = ids
    return ArpaOrder(words=words, log10_prob=log10_prob, log10_backoff=log10_backoff, lines=lines)


def _gather(tokens: list[bytes], at: npt.NDArray[np.int64]) -> Sequence[bytes]:
    """tokens[at] for a list, in C (itemgetter returns a bare item for one index)."""
    if len(at) == 0:
        return []
    if len(at) == 1:
        return [tokens[int(at[0])]]
    got: Sequence[bytes] = itemgetter(*at.tolist())(tokens)
    return got
