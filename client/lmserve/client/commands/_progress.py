"""A one-line progress counter on stderr, for commands that read files (no tqdm needed)."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """`label: N items (R/s)` rewritten in place, at most every `interval` seconds; silent
    unless enabled, so pipes and logs stay clean."""

    def __init__(
        self, label: str, enabled: bool, stream: TextIO | None = None, interval: float = 0.2
    ) -> None:
        self.label = label
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.interval = interval
        self.count = 0
        self._start = time.monotonic()
        self._shown = 0.0

    def advance(self, n: int) -> None:
        self.count += n
        now = time.monotonic()
        if self.enabled and now - self._shown >= self.interval:
            self._shown = now
            self._write(now)

    def _write(self, now: float) -> None:
        rate = self.count / max(now - self._start, 1e-9)
        self.stream.write(f"\r{self.label}: {self.count} lists ({rate:.0f}/s)")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self._write(time.monotonic())
            self.stream.write("\n")
            self.stream.flush()
