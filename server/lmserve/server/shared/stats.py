"""One model's engine statistics as plain Python values; `stats_export` makes them Prometheus.

    stats = EngineStats("kjv-lstm")
    stats.generated(32)                                  # counters: a method
    stats.inter_token_latency.observe(0.012, count=32)   # histograms: bind once, observe
    stats.active_sequences = 12                          # gauges: plain attributes

Why plain values: an engine runs in its own worker process (or in the front with
`engine_workers: false`); its numbers cross the process boundary as one pickled `snapshot()`
per scrape, and no engine module needs the metrics library. Each number has one writer thread
(the scheduler, the scoring queue's thread, the event loop) and the GIL keeps every update and
read whole; a scrape may see a histogram's sum one observation ahead of its buckets, no worse.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Sequence

# The bucket bounds the front's histograms use too (one definition, in `metrics`).
from lmserve.server.metrics import BATCH_BUCKETS, DURATION_BUCKETS


class Histogram:
    """Observations counted in fixed buckets, Prometheus-style (a value equal to a bound counts
    in that bound's bucket); `counts[-1]` is +Inf. Per-bucket counts, not cumulative."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(float(b) for b in bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float, count: int = 1) -> None:
        """`count` observations of `value` in one update: a step's sequences share their times,
        so the scheduler records once per distinct time, not once per token."""
        self.counts[bisect_left(self.bounds, value)] += count
        self.sum += value * count

    @property
    def count(self) -> int:
        return sum(self.counts)

    def copy(self) -> Histogram:
        twin = Histogram.__new__(Histogram)
        twin.bounds, twin.counts, twin.sum = self.bounds, list(self.counts), self.sum
        return twin


class EngineStats:
    """One model's engine numbers (see the module doc); `stats_export` names and exports them."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.created = time.time()  # the counters' and histograms' `_created`
        # Generation (the continuous-batching scheduler's thread).
        self.generated_tokens = 0
        self.active_sequences = 0
        self.parked_sequences = 0
        self.pending_requests = 0  # also set by `submit` on the event loop
        self.cache_bytes_reserved = 0  # a transformer's key/value cache held for its samples
        self.time_to_first_token = Histogram(DURATION_BUCKETS)
        self.inter_token_latency = Histogram(DURATION_BUCKETS)
        # Scoring (the scoring queue's thread).
        self.batch_size = Histogram(BATCH_BUCKETS)
        self.queue_duration = Histogram(DURATION_BUCKETS)
        # Autocomplete sessions (the event loop).
        self.sessions_active = 0
        self.session_events: dict[str, int] = {}  # hit, miss, rebuild, evicted

    def generated(self, tokens: int) -> None:
        self.generated_tokens += tokens

    def session_event(self, event: str) -> None:
        events = self.session_events
        events[event] = events.get(event, 0) + 1

    def snapshot(self) -> EngineStats:
        """A copy that other threads no longer change (to pickle it, or to add others to)."""
        twin = EngineStats.__new__(EngineStats)
        twin.__dict__.update(self.__dict__)
        for name, value in self.__dict__.items():
            if isinstance(value, Histogram):
                setattr(twin, name, value.copy())
        twin.session_events = dict(self.session_events)
        return twin
