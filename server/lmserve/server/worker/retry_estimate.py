"""How long an overloaded queue asks callers to wait (the RetryInfo delay): one rule for all.

    delay = drain_delay(queued_tokens, throughput.rate)          # scoring queue
    delay = slot_delay(remaining_tokens, waiting, step_seconds)   # Generate admission
    delay = drain_delay(waiting + 1, running_limit * searches.rate)   # BeamSearch

A fixed delay is wrong both ways: after a burst that a fast model drains in 50 ms it keeps
callers idle for a second, and in front of minutes of queued work it brings them back (to be
refused again) long before anything fits. The estimate is the time the work that refused the
call needs at the rate recently measured, clipped to [MIN_DELAY, MAX_DELAY]: a client that
honours it neither hammers the server nor waits for ever on a stale guess. Before anything was
measured (a cold queue) the delay is `errors.DEFAULT_RETRY_AFTER`.
"""

from __future__ import annotations

from collections.abc import Sequence

from lmserve.server.errors import DEFAULT_RETRY_AFTER

__all__ = [
    "MAX_DELAY",
    "MIN_DELAY",
    "Throughput",
    "clip_delay",
    "drain_delay",
    "slot_delay",
]

# Shorter would be a busy loop for clients; longer outlives any useful guess about a queue.
MIN_DELAY = 0.05
MAX_DELAY = 30.0
# Weight of the newest measurement: about the last ten passes count.
WEIGHT = 0.2


def clip_delay(seconds: float) -> float:
    """`seconds` within [MIN_DELAY, MAX_DELAY] (NaN: the upper bound)."""
    if seconds != seconds:  # NaN
        return MAX_DELAY
    return min(MAX_DELAY, max(MIN_DELAY, seconds))


class Throughput:
    """Work done per busy second, exponentially weighted over the recent measurements.

    Work and time are averaged separately and divided (not an average of per-pass rates), so
    a burst of tiny, overhead-bound passes does not make a long pass look fast or slow.
    `record` runs on a worker thread and `rate` on the event loop: float stores are atomic.
    """

    def __init__(self, weight: float = WEIGHT) -> None:
        self._weight = weight
        self._work = 0.0
        self._seconds = 0.0

    def record(self, work: float, seconds: float) -> None:
        """One measurement: `work` (tokens, searches...) done in `seconds` of busy time."""
        if work <= 0 or seconds <= 0:
            return
        if self._seconds == 0.0:
            self._work, self._seconds = work, seconds
            return
        w = self._weight
        self._work = (1 - w) * self._work + w * work
        self._seconds = (1 - w) * self._seconds + w * seconds

    @property
    def rate(self) -> float | None:
        """Work per second, None before the first measurement."""
        return self._work / self._seconds if self._seconds > 0 else None


def drain_delay(work: float, rate: float | None) -> float:
    """Seconds for `work` to be done at `rate` (per second), clipped; the default delay when
    no rate was measured yet."""
    if rate is None or rate <= 0:
        return DEFAULT_RETRY_AFTER
    return clip_delay(work / rate)


def slot_delay(remaining: Sequence[int], waiting: int, step_seconds: float) -> float:
    """Seconds until `waiting` generation slots free (those ahead plus the caller's): running
    sequences free their slots at `len(remaining) / (mean(remaining) * step_seconds)` per second,
    where `remaining` are their tokens left (to max_new_tokens: an upper bound, EOS may end them
    sooner) and `step_seconds` the recent time of one batched step."""
    if not remaining or step_seconds <= 0:
        return DEFAULT_RETRY_AFTER
    mean_left = sum(max(r, 1) for r in remaining) / len(remaining)
    freed_per_second = len(remaining) / (mean_left * step_seconds)
    return drain_delay(max(waiting, 1), freed_per_second)
