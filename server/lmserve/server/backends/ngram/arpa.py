"""Reads ARPA back-off language models (as lmplz and SRILM write them) into numpy arrays.

The format: a `\\data\\` section with one `ngram N=count` line per order, then one
`\\N-grams:` section per order with lines `log10prob w1 ... wN [log10backoff]`, then `\\end\\`.
Fields may be separated by tabs or spaces; blank lines are ignored; files may be gzipped.

The file is read once, in order, in blocks of whole lines (`BLOCK_BYTES`), each parsed in bulk
(one `bytes.split()`, numpy for the per-line field counts, C-level `map` for numbers and word
ids) straight into the arrays the `\\data\\` counts size: no Python loop per line, and no copy
of the file or of all its tokens in memory. Any malformed input raises `ArpaFormatError` naming
the line.
"""

from __future__ import annotations

import gzip
import io
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import itemgetter
from pathlib import Path
from typing import BinaryIO

import numpy as np
import numpy.typing as npt

from lmserve.server.backends.ngram.arpa_blocks import LineBlocks, TokenSpans, WordIds
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
    lines: npt.NDArray[np.int32]  # [count] 1-based line numbers, for error messages


@dataclass
class ArpaModel:
    """An ARPA file's contents: the vocabulary (unigram order) and every order's entries."""

    vocab: list[str]
    orders: list[ArpaOrder]  # orders[0] holds the unigrams (words[:, 0] == arange)
    counts: list[int]  # as declared in \data\


# Bytes read per block of a section: the block's tokens are Python objects while it is parsed
# (about 40 bytes each), so this bounds the parser's own memory beside the arrays it fills.
BLOCK_BYTES = 2 * 1024 * 1024

# Called with (n-grams read so far, n-grams declared in \data\) after each block.
Progress = Callable[[int, int], None]


def open_arpa(path: Path) -> BinaryIO:
    """The file as a binary stream, gunzipped when it is gzip (by magic number, not by name)."""
    try:
        with path.open("rb") as f:
            head = f.read(2)
        if head == b"\x1f\x8b":
            return gzip.open(path, "rb")  # type: ignore[return-value]
        return path.open("rb")
    except OSError as exc:
        raise ArpaFormatError(str(path), "cannot read", f"{exc}") from exc


def read_arpa(
    path: str | Path, *, progress: Progress | None = None, block_bytes: int = BLOCK_BYTES
) -> ArpaModel:
    """Parses an ARPA file (plain or gzipped) of any order, reading it once, in blocks: the
    memory it takes is the arrays it returns plus one block, whatever the file's size."""
    path = Path(path)
    with open_arpa(path) as stream:
        try:
            return parse_arpa_stream(stream, str(path), progress=progress, block_bytes=block_bytes)
        except (OSError, EOFError) as exc:  # a truncated gzip stream, a read error
            raise ArpaFormatError(str(path), "cannot read", f"{exc}") from exc


def parse_arpa(data: bytes, name: str = "<arpa>") -> ArpaModel:
    """Parses ARPA text held in memory."""
    return parse_arpa_stream(io.BytesIO(data), name)


def parse_arpa_stream(
    stream: BinaryIO,
    name: str = "<arpa>",
    *,
    progress: Progress | None = None,
    block_bytes: int = BLOCK_BYTES,
) -> ArpaModel:
    fail = failing(name)
    lines = LineBlocks(stream, block_bytes)
    counts, text = read_counts(lines, fail)
    vocab: list[str] = []
    index: dict[bytes, int] = {}
    words: WordIds | None = None  # once the unigrams are read
    orders: list[ArpaOrder] = []
    total, done = sum(counts), 0
    for n, count in enumerate(counts, start=1):
        expect_section(lines, text, n, fail)
        order = ArpaOrder(
            words=np.empty((count, n), dtype=np.int32),
            log10_prob=np.empty(count, dtype=np.float64),
            log10_backoff=np.zeros(count, dtype=np.float64),
            lines=np.empty(count, dtype=np.int32),
        )
        filled = 0
        if n == 2:
            words = WordIds(vocab)
        for block, first_line in lines.section():
            filled = _parse_section(
                block,
                n,
                count,
                filled,
                n < len(counts),
                first_line,
                index,
                vocab,
                words,
                order,
                fail,
            )
            if progress is not None:
                progress(done + filled, total)
        text = end_section(lines, n, count, filled, fail)
        orders.append(order)
        done += count
    expect_end(lines, text, fail)
    return ArpaModel(vocab=vocab, orders=orders, counts=counts)


# Makes the error for a line: (line number, reason, what the line holds or None).
Fail = Callable[[int, str, bytes | None], ArpaFormatError]


def failing(name: str) -> Fail:
    """The error maker for file `name`: what a line holds goes to the log only (`detail`),
    never to clients."""

    def fail(line: int, reason: str, got: bytes | None = None) -> ArpaFormatError:
        detail = "" if got is None else f"got {got[:80]!r}"
        return ArpaFormatError(name, f"line {line}: {reason}", detail)

    return fail


def read_counts(lines: LineBlocks, fail: Fail) -> tuple[list[int], bytes | None]:
    """The `\\data\\` section's counts, orders 1..N, and the line after them."""
    # Header: anything before \data\ is ignored (SRILM may write comments there).
    while (text := lines.line()) is not None and text != b"\\data\\":
        pass
    if text is None:
        raise fail(1, f"no \\data\\ section in {lines.line_no} lines", None)
    counts: list[int] = []
    while (text := lines.line()) is not None and not text.startswith(b"\\"):
        if not text:
            continue
        m = _COUNT_LINE.match(text)
        if m is None:
            raise fail(lines.line_no, "expected 'ngram N=count'", text)
        if int(m.group(1)) != len(counts) + 1:
            raise fail(lines.line_no, f"expected the count of order {len(counts) + 1}", None)
        counts.append(int(m.group(2)))
    if not counts:
        raise fail(lines.line_no, "\\data\\ declares no n-gram counts", None)
    if counts[0] == 0:
        raise fail(lines.line_no, "the model has no unigrams", None)
    return counts, text


def expect_section(lines: LineBlocks, text: bytes | None, n: int, fail: Fail) -> None:
    """Raises unless `text` is the `\\n-grams:` line."""
    if text is None or _SECTION_LINE.match(text) is None or int(text[1:-7]) != n:
        raise fail(lines.line_no, f"expected \\{n}-grams:", text or b"end of file")


def end_section(lines: LineBlocks, n: int, count: int, filled: int, fail: Fail) -> bytes | None:
    """Checks the section held its declared count; returns the next non-blank line."""
    if filled != count:
        raise fail(  # the section's last line
            lines.line_no, f"\\data\\ declares {count} {n}-grams, the section has {filled}", None
        )
    text = lines.line()
    while text == b"" and text is not None:
        text = lines.line()
    return text


def expect_end(lines: LineBlocks, text: bytes | None, fail: Fail) -> None:
    if text != b"\\end\\":
        raise fail(lines.line_no, "expected \\end\\", text or b"end of file")


def _parse_section(
    block: bytes,
    n: int,
    count: int,
    filled: int,
    has_backoff: bool,
    first_line: int,
    index: dict[bytes, int],
    vocab: list[str],
    word_ids: WordIds | None,
    out: ArpaOrder,
    raise_at: Callable[[int, str, bytes | None], ArpaFormatError],
) -> int:
    """Parses a block of whole lines of a `\\n-grams:` section into `out` from entry `filled`
    on (unigrams also fill `index`/`vocab`); returns the entries filled after it."""
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
    here = len(fields)
    if filled + here > count:
        raise raise_at(
            int(lines[count - filled]),
            f"\\data\\ declares {count} {n}-grams, the section has more",
            None,
        )
    if here == 0:
        return filled
    allowed = (fields == n + 1) | ((fields == n + 2) & has_backoff)
    if not allowed.all():
        bad = int(np.argmin(allowed))
        want = f"{n + 1} or {n + 2}" if has_backoff else f"{n + 1}"
        raise raise_at(
            int(lines[bad]),
            f"a {n}-gram line needs {want} fields, it has {int(fields[bad])}",
            None,
        )
    first = np.zeros(here, dtype=np.int64)
    np.cumsum(fields[:-1], out=first[1:])
    # Every token's bytes [start, end): numbers are read from the block in place, words by
    # `WordIds`; only the unigram section (small) is split into Python bytes objects.
    ends = ~space
    ends[:-1] &= space[1:]
    span = TokenSpans(arr, np.flatnonzero(starts), np.flatnonzero(ends) + 1)
    tokens = block.split() if n == 1 else None

    def column(at: npt.NDArray[np.int64]) -> Sequence[bytes]:
        if tokens is not None:
            return _gather(tokens, at)
        return [span.token(int(i)) for i in at]

    def floats(at: npt.NDArray[np.int64], which: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        try:
            return span.numbers(at)
        except ValueError:
            for i, tok in enumerate(column(at)):
                try:
                    float(tok)
                except ValueError:
                    line = int(lines[which[i]])
                    raise raise_at(line, "not a number", tok) from None
            raise

    rows = slice(filled, filled + here)
    everything = np.arange(here, dtype=np.int64)
    log10_prob = floats(first, everything)
    # KenLM clamps positive log-probabilities to 0 (with a warning); so do we.
    np.minimum(log10_prob, 0.0, out=out.log10_prob[rows])
    with_backoff = np.flatnonzero(fields == n + 2)
    if len(with_backoff):
        out.log10_backoff[filled + with_backoff] = floats(first[with_backoff] + n + 1, with_backoff)
    out.lines[rows] = lines
    words = out.words[rows]
    if n == 1:
        raw = column(first + 1)
        for i, word in enumerate(raw):
            if word in index:
                raise raise_at(int(lines[i]), "duplicate unigram", word)
            index[word] = filled + i
        try:
            vocab.extend(w.decode("utf-8") for w in raw)
        except UnicodeDecodeError as exc:
            raise raise_at(first_line, "a word is not UTF-8", str(exc).encode()) from None
        words[:, 0] = np.arange(filled, filled + here, dtype=np.int32)
    else:
        assert word_ids is not None
        ids = word_ids.of_tokens(block)  # every token's id; numbers are unknown words
        for j in range(n):
            column_ids = ids[first + 1 + j]
            unknown = column_ids == word_ids.unknown
            if unknown.any():
                bad = int(np.argmax(unknown))
                raw = column(first[bad : bad + 1] + 1 + j)
                raise raise_at(int(lines[bad]), "a word is not among the unigrams", raw[0])
            words[:, j] = column_ids
    return filled + here


def _gather(tokens: list[bytes], at: npt.NDArray[np.int64]) -> Sequence[bytes]:
    """tokens[at] for a list, in C (itemgetter returns a bare item for one index)."""
    if len(at) == 0:
        return []
    if len(at) == 1:
        return [tokens[int(at[0])]]
    got: Sequence[bytes] = itemgetter(*at.tolist())(tokens)
    return got
