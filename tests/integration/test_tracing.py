"""OpenTelemetry tracing (`otel_tracing`): each RPC a span on a real server, read back from the
SDK's in-memory exporter; and the one-line error when the instrumentation is missing."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import grpc
import pytest
from http_calls import post_json
from prometheus_client import CollectorRegistry
from test_observability import write_bigram

from lmserve.server.front.api.observe import OTEL_MODULE, TracingUnavailable
from lmserve.server.front.process.app import start_background_server
from lmserve.server.settings import load_settings
from lmserve.v1 import lm_service_pb2 as pb
from lmserve.v1 import lm_service_pb2_grpc


def _settings(root: Path) -> dict[str, object]:
    return {
        "model_repository": root,
        "host": "127.0.0.1",
        "port": 0,
        "metrics_enabled": False,
        "otel_tracing": True,
    }


def test_each_rpc_is_a_span(tmp_path: Path) -> None:
    # Dev dependencies (the otel extra and the SDK): missing, the test fails rather than skips.
    importlib.import_module(OTEL_MODULE)
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)  # once per process; the interceptor uses the global one
    if trace.get_tracer_provider() is not provider:
        pytest.skip("another test set the global tracer provider first")

    write_bigram(tmp_path)
    with start_background_server(
        load_settings(_settings(tmp_path)), registry=CollectorRegistry()
    ) as running:
        with grpc.insecure_channel(running.address) as channel:
            stub = lm_service_pb2_grpc.LanguageModelServiceStub(channel)
            stub.Score(pb.ScoreRequest(model="bigram", texts=["the cat"]))
            with pytest.raises(grpc.RpcError):
                stub.Score(pb.ScoreRequest(model="no-such-model", texts=["the"]))
            # Streaming handlers (async generators) still stream through the span's wrapper.
            request = pb.GenerateRequest(model="bigram", prompt="the")
            request.stopping.max_new_tokens = 3
            request.stopping.ignore_eos = True
            answers = list(stub.Generate(request))
            assert sum(len(a.tokens) for a in answers) >= 3
        # The HTTP front's requests are spans on the same provider.
        status, _, _ = post_json(
            running.http_port or 0,
            "/lmserve.v1.LanguageModelService/Score",
            {"model": "bigram", "texts": ["the cat"]},
        )
        assert status == 200
    http_spans = [
        s
        for s in exporter.get_finished_spans()
        if s.attributes.get("http.target", s.attributes.get("url.path"))
        == "/lmserve.v1.LanguageModelService/Score"
    ]
    assert http_spans, [s.name for s in exporter.get_finished_spans()]
    assert any(
        s.attributes.get("http.status_code", s.attributes.get("http.response.status_code")) == 200
        for s in http_spans
    )
    names = [s.name for s in exporter.get_finished_spans()]
    assert "/lmserve.v1.LanguageModelService/Generate" in names
    spans = [
        s
        for s in exporter.get_finished_spans()
        if s.name.startswith("/") and s.name.endswith("/Score")
    ]
    assert [s.name for s in spans] == ["/lmserve.v1.LanguageModelService/Score"] * 2
    codes = [s.attributes.get("rpc.grpc.status_code") for s in spans]
    assert codes == [grpc.StatusCode.OK.value[0], grpc.StatusCode.NOT_FOUND.value[0]]


def test_tracing_without_the_package_fails_at_start_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, OTEL_MODULE, None)  # as if the otel extra were not installed
    with pytest.raises(TracingUnavailable) as info:
        start_background_server(load_settings(_settings(tmp_path)), registry=CollectorRegistry())
    message = str(info.value)
    assert "\n" not in message
    assert "otel_tracing" in message and "lmserve[otel]" in message
