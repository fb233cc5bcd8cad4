"""`import-arpa`'s progress line on stderr: n-grams read, rate and time left.

On a terminal one line is rewritten in place (at most 10 times a second); into a log or a pipe a
line is written every 5 seconds, so a long import shows it is alive without flooding the log.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class ImportProgress:
    """`progress(read, total)` for `NgramModel.from_arpa`; `done()` ends the line."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream or sys.stderr
        self._tty = self._stream.isatty()
        self._interval = 0.1 if self._tty else 5.0
        self._started = time.monotonic()
        self._last = self._started
        self._shown = False

    def __call__(self, read: int, total: int) -> None:
        now = time.monotonic()
        if now - self._last < self._interval and read < total:
            return
        self._last = now
        elapsed = max(now - self._started, 1e-9)
        rate = read / elapsed
        left = (total - read) / rate if rate > 0 else 0.0
        share = 100.0 * read / total if total else 100.0
        line = (
            f"read {read:,} of {total:,} n-grams ({share:.0f}%), "
            f"{rate / 1e6:.2f} M/s, {left:.0f} s left"
        )
        if self._tty:
            self._stream.write("\r" + line + "\x1b[K")
        else:
            self._stream.write(line + "\n")
        self._stream.flush()
        self._shown = True

    def done(self, what: str) -> None:
        """Ends the progress line with what happens next (building, writing)."""
        if self._tty and self._shown:
            self._stream.write("\n")
        self._stream.write(f"{what} ({time.monotonic() - self._started:.1f} s)\n")
        self._stream.flush()
