"""The one place engine stats become Prometheus metrics: names, help texts, types and labels.

    families = metric_families([core.stats for core in engines])
    registry.register(EngineStatsCollector(pool.engine_stats))     # or in_process.stats

The front serves them beside its own metrics (`metrics.Metrics`) through one
`EngineStatsCollector` on its registry, whose source is the in-process engines' stats or each
engine worker's pickled `EngineStats`, asked for at the scrape (`WorkerPool.engine_stats`).
Stats of one model from several engines (an old and a new one during a reload) add up into one
series.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import Metric
from prometheus_client import metrics as prometheus_metrics
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from lmserve.server.shared.stats import EngineStats, Histogram

# (metric name, help, EngineStats attribute), in the order /metrics shows them.
HISTOGRAMS = (
    (
        "lmserve_batch_size",
        "Texts per forward pass of the micro-batcher (requests merged into one).",
        "batch_size",
    ),
    (
        "lmserve_queue_duration_seconds",
        "Time a request waited in the micro-batching queue before its forward pass began.",
        "queue_duration",
    ),
    (
        "lmserve_time_to_first_token_seconds",
        "Time from a Generate request's arrival to its first generated token.",
        "time_to_first_token",
    ),
    (
        "lmserve_inter_token_latency_seconds",
        "Time between two consecutive tokens of one generated sequence.",
        "inter_token_latency",
    ),
)
COUNTERS = (
    (
        "lmserve_generated_tokens",
        "Tokens generated (every sample of every request).",
        "generated_tokens",
    ),
)
GAUGES = (
    (
        "lmserve_active_sequences",
        "Sequences the generation scheduler is stepping right now.",
        "active_sequences",
    ),
    (
        "lmserve_parked_sequences",
        "Sequences paused because their client reads slower than they generate.",
        "parked_sequences",
    ),
    (
        "lmserve_pending_requests",
        "Generate requests waiting for a slot in the generation scheduler.",
        "pending_requests",
    ),
    (
        "lmserve_kv_cache_reserved_bytes",
        "Key/value cache a transformer's generating samples reserve (admission's measure).",
        "cache_bytes_reserved",
    ),
    (
        "lmserve_complete_sessions",
        "Autocomplete sessions whose state the server holds.",
        "sessions_active",
    ),
)
SESSION_EVENTS = (
    "lmserve_complete_session_events",
    "Autocomplete session cache events: hit, miss, rebuild, evicted.",
)


def metric_families(stats: Iterable[EngineStats]) -> list[Metric]:
    """Every engine metric family, with one series per model of `stats` (none: no samples)."""
    models = _by_model(stats)
    # prometheus-client's own switch (PROMETHEUS_DISABLE_CREATED_SERIES) for `_created`.
    use_created = getattr(prometheus_metrics, "_use_created", True)
    created = {s.model: s.created if use_created else None for s in models}
    families: list[Metric] = []
    for name, text, attribute in HISTOGRAMS:
        histogram = HistogramMetricFamily(name, text, labels=["model"])
        for s in models:
            _add_histogram(histogram, s.model, getattr(s, attribute), created[s.model])
        families.append(histogram)
    for name, text, attribute in COUNTERS:
        counter = CounterMetricFamily(name, text, labels=["model"])
        for s in models:
            counter.add_metric([s.model], getattr(s, attribute), created[s.model])
        families.append(counter)
    for name, text, attribute in GAUGES:
        gauge = GaugeMetricFamily(name, text, labels=["model"])
        for s in models:
            gauge.add_metric([s.model], getattr(s, attribute))
        families.append(gauge)
    events = CounterMetricFamily(*SESSION_EVENTS, labels=["model", "event"])
    for s in models:
        for event, count in dict(s.session_events).items():
            events.add_metric([s.model, event], count, created[s.model])
    families.append(events)
    return families


class EngineStatsCollector:
    """Exports the stats `source` returns at each collection (the front's in-process engines);
    `describe` lets the registry refuse a family that `Metrics` defines as well."""

    def __init__(self, source: Callable[[], Iterable[EngineStats]]) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        return iter(metric_families(self._source()))

    def describe(self) -> Iterator[Metric]:
        return iter(metric_families([]))


def _add_histogram(
    family: HistogramMetricFamily, model: str, histogram: Histogram, created: float | None
) -> None:
    buckets: list[tuple[str, float]] = []
    total = 0
    for bound, count in zip((*histogram.bounds, float("inf")), list(histogram.counts), strict=True):
        total += count
        # prometheus_client's own label format for bounds (unannotated there).
        buckets.append((floatToGoString(bound), total))  # type: ignore[no-untyped-call]
    family.add_metric([model], buckets, histogram.sum)  # _bucket..., _count, _sum
    if created is not None:
        family.samples.append(Sample(family.name + "_created", {"model": model}, created))


def _by_model(stats: Iterable[EngineStats]) -> list[EngineStats]:
    """One `EngineStats` per model, by name: several of one model (a reload's old and new
    engine) added up into a copy."""
    groups: dict[str, list[EngineStats]] = {}
    for s in stats:
        groups.setdefault(s.model, []).append(s)
    models = []
    for model in sorted(groups):
        first, *others = groups[model]
        if others:
            first = first.snapshot()
            for other in others:
                _add(first, other)
        models.append(first)
    return models


def _add(into: EngineStats, other: EngineStats) -> None:
    into.created = min(into.created, other.created)
    for _, _, attribute in (*COUNTERS, *GAUGES):
        setattr(into, attribute, getattr(into, attribute) + getattr(other, attribute))
    for _, _, attribute in HISTOGRAMS:
        mine, theirs = getattr(into, attribute), getattr(other, attribute)
        mine.counts = [a + b for a, b in zip(mine.counts, list(theirs.counts), strict=True)]
        mine.sum += theirs.sum
    for event, count in dict(other.session_events).items():
        into.session_events[event] = into.session_events.get(event, 0) + count
