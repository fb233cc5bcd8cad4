"""How the ARPA reader walks a file without holding it: line-aligned blocks of a stream, and a
block's tokens as byte spans and vocabulary ids rather than Python objects (`arpa` uses them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import BinaryIO

import numpy as np
import numpy.typing as npt

from lmserve.server.text._wordindex import WordIndex

# parse(buffer, start, first_line, at_eof) -> (end offset, lines consumed, section over)
SectionParser = Callable[[bytes, int, int, bool], tuple[int, int, bool]]


class LineBlocks:
    """A binary stream read as lines (the header) and as blocks of whole lines (a section's
    body), counting line numbers for error messages."""

    def __init__(self, stream: BinaryIO, block_bytes: int) -> None:
        self._stream = stream
        self._block = max(block_bytes, 1)
        self._buf = b""
        self._pos = 0
        self._eof = False
        self.line_no = 0  # of the last line handed out

    def _fill(self) -> bool:
        """Reads another block after what is left; False at the end of the file."""
        if self._eof:
            return False
        more = self._stream.read(self._block)
        if not more:
            self._eof = True
            return False
        self._buf = self._buf[self._pos :] + more
        self._pos = 0
        return True

    def line(self) -> bytes | None:
        """The next line, stripped; None at the end of the file."""
        while True:
            end = self._buf.find(b"\n", self._pos)
            if end >= 0 or not self._fill():
                break
        if self._pos >= len(self._buf):
            return None
        end = len(self._buf) if end < 0 else end
        text = self._buf[self._pos : end].strip()
        self._pos = end + 1
        self.line_no += 1
        return text

    def section(self) -> Iterator[tuple[bytes, int]]:
        """Blocks of whole lines (with their first line's number) up to the next line that
        begins with a backslash, which `line()` reads next."""
        while True:
            if self._pos >= len(self._buf) and not self._fill():
                return
            buf, pos = self._buf, self._pos
            if buf.startswith(b"\\", pos):
                return
            end = buf.find(b"\n\\", pos)
            if end >= 0:
                yield self._take(end + 1)
                return
            last = buf.rfind(b"\n", pos)
            if last < 0 or len(buf) - pos < self._block // 2:
                if self._fill():  # too little here: read on before parsing
                    continue
                if last < 0:  # the file's last line, with no newline
                    yield self._take(len(buf))
                    return
            yield self._take(last + 1)

    def consume_section(self, parse: SectionParser) -> None:
        """Hands the section's body to `parse(buffer, start, first_line, at_eof)` without
        splitting it into blocks here: the parser reads whole lines from `start` on, stops at a
        line that begins with a backslash (which `line()` reads next) and returns (end offset,
        lines consumed, whether the section is over)."""
        while True:
            end, n_lines, over = parse(self._buf, self._pos, self.line_no + 1, self._eof)
            self._pos = end
            self.line_no += n_lines
            if over or (self._eof and self._pos >= len(self._buf)):
                return
            self._fill()  # the rest of the buffer is an incomplete line: read on

    def _take(self, end: int) -> tuple[bytes, int]:
        block = self._buf[self._pos : end]
        self._pos = end
        first = self.line_no + 1
        self.line_no += block.count(b"\n") + (0 if block.endswith(b"\n") else 1)
        return block, first


class TokenSpans:
    """A block's tokens as byte spans, without making them Python objects."""

    # Numbers longer than this are read one by one (no ARPA writer uses them).
    WIDTH = 32

    def __init__(
        self, block: npt.NDArray[np.uint8], begin: npt.NDArray[np.int64], end: npt.NDArray[np.int64]
    ) -> None:
        self.block, self.begin, self.end = block, begin, end

    def token(self, i: int) -> bytes:
        return self.block[self.begin[i] : self.end[i]].tobytes()

    def numbers(self, at: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        """Tokens `at` as floats, parsed by numpy as `float()` parses them (exactly); a token
        that is not a number raises ValueError."""
        begin, end = self.begin[at], self.end[at]
        lengths = end - begin
        width = int(lengths.max()) if len(at) else 1
        if width > self.WIDTH:
            return np.array([float(self.token(int(i))) for i in at], dtype=np.float64)
        offsets = np.arange(width, dtype=np.int64)
        cells = begin[:, None] + offsets
        inside = offsets < lengths[:, None]
        text = np.where(inside, self.block[np.minimum(cells, len(self.block) - 1)], 0)
        return text.astype(np.uint8).view(f"S{width}").ravel().astype(np.float64)


class WordIds:
    """The unigrams' ids of a block's tokens, split and looked up in C (the text layer's
    `WordIndex`, which splits on the same ASCII whitespace as `bytes.split`): a dict lookup
    per word in Python was most of a section's parse time. A token that is not a unigram gets
    `unknown`: the id of a sentinel word holding a newline, which no token can be."""

    def __init__(self, vocab: list[str]) -> None:
        self.unknown = len(vocab)
        self._index = WordIndex([*vocab, "\n"], self.unknown)

    def of_tokens(self, block: bytes) -> npt.NDArray[np.int32]:
        try:
            text = block.decode("utf-8")
        except UnicodeDecodeError:  # a word that is not UTF-8 cannot be a unigram (they are)
            text = block.decode("utf-8", "replace")
        ids, _offsets, _oov, _counts = self._index.encode([text])
        return np.frombuffer(ids, dtype=np.int32)
