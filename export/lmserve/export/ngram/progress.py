"""Progress of a long `train-ngram` on stderr: tokens read, runs written, merges, lines written.

`update` lines are rate-limited (a terminal line rewritten at most 10 times a second; into a
log or a pipe a line every 5 seconds), so a small corpus prints nothing and a large one shows it
is alive without flooding the log; `note` lines (how counting was planned, a merge finished)
are always written. `Progress.silent()` is the default for library calls and tests.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    def __init__(self, stream: TextIO | None = None, *, enabled: bool = True) -> None:
        self._stream = stream or sys.stderr
        self._enabled = enabled
        self._tty = enabled and self._stream.isatty()
        self._interval = 0.1 if self._tty else 5.0
        self._started = time.monotonic()
        self._last = self._started
        self._open_line = False

    @classmethod
    def silent(cls) -> Progress:
        return cls(enabled=False)

    def update(self, message: str) -> None:
        """A progress line, shown only if the last one is old enough."""
        if not self._enabled:
            return
        now = time.monotonic()
        if now - self._last < self._interval:
            return
        self._last = now
        if self._tty:
            self._stream.write(f"\r{self._stamp(now)} {message}\x1b[K")
            self._open_line = True
        else:
            self._stream.write(f"{self._stamp(now)} {message}\n")
        self._stream.flush()

    def note(self, message: str) -> None:
        """A line that is always shown (ends a rewritten progress line first)."""
        if not self._enabled:
            return
        if self._open_line:
            self._stream.write("\n")
            self._open_line = False
        self._stream.write(f"{self._stamp(time.monotonic())} {message}\n")
        self._stream.flush()

    def _stamp(self, now: float) -> str:
        return f"[train-ngram {now - self._started:7.1f} s]"
