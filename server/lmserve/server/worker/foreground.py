"""Interactive work first: a model's generation steps wait while its short requests compute.

    foreground = Foreground()
    with foreground.busy():            # a scoring pass, a typing session's step
        ...
    foreground.wait_idle(0.05)         # the generation scheduler, before each step

A model's scoring passes and autocomplete steps answer a caller who waits for them as a whole;
a generation step is one token of many for streams already running. Run side by side on a
saturated machine they split the model's CPU share, and a 4-line Score waited 100-250 ms behind
the steps of 20 streams. So the scheduler starts no new step while such work runs, for at most
`wait` seconds per step (generation is delayed, never starved). One object per model
(`EngineCore`); every thread of the model sees it. Across processes the same holds by
niceness: the generation thread runs GENERATION_NICENESS above its worker (`lower_this_thread`).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

# Niceness the generation thread adds to its own (Linux threads have their own): when a
# model's worker and the others want the cores, its scoring and session threads run first.
GENERATION_NICENESS = 9


def lower_this_thread() -> None:
    """Makes the calling thread (a generation scheduler) yield the CPU to the rest of its
    process and to other processes' interactive work. Raising niceness needs no privilege;
    where the OS has no per-thread niceness this does nothing."""
    with contextlib.suppress(OSError, AttributeError):
        tid = threading.get_native_id()
        now = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, min(19, now + GENERATION_NICENESS))


class Foreground:
    """Counts the interactive work running now; lets generation wait for it to end."""

    def __init__(self) -> None:
        self._running = 0
        self._idle = threading.Condition()
        self.waits = 0  # steps that waited (tests)

    @property
    def running(self) -> int:
        """Interactive tasks running now."""
        return self._running

    @contextmanager
    def busy(self) -> Iterator[None]:
        with self._idle:
            self._running += 1
        try:
            yield
        finally:
            with self._idle:
                self._running -= 1
                if not self._running:
                    self._idle.notify_all()

    def wait_idle(self, wait: float) -> None:
        """Returns once no interactive work runs, or after `wait` seconds."""
        if not self._running:  # the common case: no lock
            return
        with self._idle:
            if self._running:
                self.waits += 1
                self._idle.wait_for(lambda: not self._running, wait)
