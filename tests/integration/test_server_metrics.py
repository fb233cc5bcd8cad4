"""A real HTTP scrape of /metrics after real calls shows the counters with the right labels."""

from __future__ import annotations

import grpc
import pytest
from metrics_scrape import scrape

from lmserve.server.front.process.app import BackgroundServer
from lmserve.v1 import lm_service_pb2 as pb
from lmserve.v1 import lm_service_pb2_grpc


def _value(samples: dict, name: str, **labels: str) -> float:  # type: ignore[type-arg]
    return samples.get((name, frozenset(labels.items())), 0.0)


def test_metrics_count_requests_tokens_and_models(
    server: BackgroundServer, stub: lm_service_pb2_grpc.LanguageModelServiceStub
) -> None:
    before = scrape(server)
    stub.Score(pb.ScoreRequest(model="test", texts=["a little", "looking on"]))
    stub.Score(pb.ScoreRequest(model="test", texts=["a"]))
    with pytest.raises(grpc.RpcError):
        stub.Score(pb.ScoreRequest(model="no-such-model", texts=["a"]))
    with pytest.raises(grpc.RpcError):
        stub.Score(pb.ScoreRequest(model="test"))
    after = scrape(server)

    def delta(name: str, **labels: str) -> float:
        return _value(after, name, **labels) - _value(before, name, **labels)

    total = "lmserve_requests_total"
    assert delta(total, method="Score", model="test", code="OK", front="grpc") == 2
    assert delta(total, method="Score", model="test", code="INVALID_ARGUMENT", front="grpc") == 1
    # Made-up model names never become label values.
    assert delta(total, method="Score", model="", code="NOT_FOUND", front="grpc") == 1
    assert not any("no-such-model" in str(key) for key in after)
    assert delta("lmserve_scored_texts_total", model="test") == 3
    assert delta("lmserve_scored_tokens_total", model="test") == 3 + 3 + 2  # </s> counted
    assert (
        delta("lmserve_request_duration_seconds_count", method="Score", model="test", front="grpc")
        == 3
    )
    assert _value(after, "lmserve_models", state="ready") == 4
    assert _value(after, "lmserve_models", state="failed") == 5
    assert _value(after, "lmserve_model_load_seconds", model="kjv3") > 0
    assert _value(after, "lmserve_inflight_requests", method="Score") == 0
