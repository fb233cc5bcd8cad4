"""The front's Prometheus metrics, bound to one registry (a fresh one per test), and /metrics.

metrics = Metrics(CollectorRegistry())
metrics.requests.labels(method="Score", model="kjv", code="OK", front="grpc").inc()
serve_metrics(metrics.registry, host, port)

These are the front's own metrics (requests, scored texts, models, workers). The engines'
(batches, queue waits, generation, sessions) are plain `shared.stats.EngineStats` that
`front.process.stats_export` turns into metric families: a collector on this registry asks
every live engine worker (or reads the in-process engines) at each scrape, so /metrics reads as one
server. prometheus-client's multiprocess mode was the alternative: files per process and no
live gauges; a scrape that asks costs one round trip per worker.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import start_http_server

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

# Scoring requests take from tens of microseconds to seconds (engine stats too).
DURATION_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip
# Texts per micro-batched forward pass (the engines' histogram, `shared.stats`).
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)


class Metrics:
    """The server's metrics. `registry` decides where they are collected."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.requests = Counter(
            "lmserve_requests",
            "RPCs answered, by method, model, gRPC status code and the front that carried them "
            "(grpc, http).",
            ["method", "model", "code", "front"],
            registry=registry,
        )
        self.http_refused_origins = Counter(
            "lmserve_http_refused_origins",
            "HTTP requests and WebSocket handshakes refused for their Origin (a web page of "
            "another origin, not in allowed_origins), by kind (http, websocket).",
            ["kind"],
            registry=registry,
        )
        self.request_duration = Histogram(
            "lmserve_request_duration_seconds",
            "Time from an RPC's start to its answer, by the front that carried it (grpc, http).",
            ["method", "model", "front"],
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self.scored_tokens = Counter(
            "lmserve_scored_tokens",
            "Tokens scored (</s> included when end-of-sentence is on).",
            ["model"],
            registry=registry,
        )
        self.scored_texts = Counter(
            "lmserve_scored_texts", "Texts scored.", ["model"], registry=registry
        )
        self.model_load_seconds = Gauge(
            "lmserve_model_load_seconds",
            "Seconds it took to verify and load each model.",
            ["model"],
            registry=registry,
        )
        self.models = Gauge(
            "lmserve_models", "Models in the repository by state.", ["state"], registry=registry
        )
        self.inflight = Gauge(
            "lmserve_inflight_requests",
            "RPCs being handled right now.",
            ["method"],
            registry=registry,
        )

        self.rerank_request_tokens = Counter(
            "lmserve_rerank_request_tokens",
            "Tokens the Rerank hypotheses hold (</s> included when scored).",
            ["model"],
            registry=registry,
        )
        self.rerank_computed_tokens = Counter(
            "lmserve_rerank_computed_tokens",
            "Tokens the model computed for Rerank (prefixes shared by hypotheses count once).",
            ["model"],
            registry=registry,
        )
        self.worker_rss = Gauge(
            "lmserve_engine_worker_rss_bytes",
            "Resident memory of each model's engine worker process.",
            ["model"],
            registry=registry,
        )
        self.worker_restarts = Counter(
            "lmserve_engine_worker_restarts",
            "Engine worker processes started again after one died, by model.",
            ["model"],
            registry=registry,
        )
        self.model_reloads = Counter(
            "lmserve_model_reloads",
            "Models a repository reload changed: added, replaced, removed, or failed (the "
            "version before keeps serving).",
            ["model", "result"],
            registry=registry,
        )

        # The labelled children the per-request paths use, looked up once per label values:
        # `labels()` validates and locks on every call (~2.5 us), five times per Score request.
        # The label values are bounded (methods, status codes, models that exist), and so are
        # these dicts; a race only makes two lookups that return the same child.
        self._scored: dict[str, tuple[Counter, Counter]] = {}
        self._answered: dict[tuple[str, str, str, str], tuple[Counter, Histogram]] = {}
        self._inflight: dict[str, Gauge] = {}

    def record_scored(self, model: str, texts: int, tokens: int) -> None:
        children = self._scored.get(model)
        if children is None:
            children = self._scored[model] = (
                self.scored_texts.labels(model=model),
                self.scored_tokens.labels(model=model),
            )
        children[0].inc(texts)
        children[1].inc(tokens)

    def record_request(
        self, method: str, model: str, code: str, seconds: float, front: str = "grpc"
    ) -> None:
        """One answered RPC: its count by status code and its duration, by front."""
        key = (method, model, code, front)
        children = self._answered.get(key)
        if children is None:
            children = self._answered[key] = (
                self.requests.labels(method=method, model=model, code=code, front=front),
                self.request_duration.labels(method=method, model=model, front=front),
            )
        children[0].inc()
        children[1].observe(seconds)

    def inflight_of(self, method: str) -> Gauge:
        """The in-flight gauge of one method (`inc()` when an RPC starts, `dec()` when done)."""
        gauge = self._inflight.get(method)
        if gauge is None:
            gauge = self._inflight[method] = self.inflight.labels(method=method)
        return gauge


def serve_metrics(registry: CollectorRegistry, host: str, port: int) -> tuple[WSGIServer, int]:
    """Starts the `/metrics` HTTP endpoint in a thread; returns the server and its bound port."""
    httpd, _thread = start_http_server(port, addr=host, registry=registry)
    return httpd, int(httpd.server_port)
