"""The client's pieces that stand in for optional packages give the same answers as those
packages: the pure-Python Score reader (numpy absent), the hand-encoded health check
(grpcio-health-checking absent) and the RetryInfo reader (googleapis-common-protos absent)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from google.protobuf import duration_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_health.v1 import health_pb2

from lmserve.client import _health
from lmserve.client import _wire as client_wire
from lmserve.client._protowire import WireError, encode_varint, fields
from lmserve.client.errors import retry_delay
from lmserve.server.decoding.scored import ScoredTexts
from lmserve.server.worker.replies.score import score_response_bytes
from lmserve.v1 import lm_service_pb2 as pb


def _served(log_probs: list[float], tokens: list[int], oovs: list[int]) -> bytes:
    scored = ScoredTexts(
        log_probs=np.array(log_probs, dtype=np.float64),
        token_counts=np.array(tokens, dtype=np.int64),
        word_counts=np.array(tokens, dtype=np.int64),
        oov_counts=np.array(oovs, dtype=np.int64),
        oov_log_probs=None,
        details=None,
        total_tokens=sum(tokens),
    )
    data = score_response_bytes("kjv-5gram", scored)
    assert isinstance(data, bytes)
    return data


def _key(reply: object) -> list[tuple[str, int, int]]:
    assert isinstance(reply, list)
    # repr keeps nan, -0.0 and inf apart and equal to themselves
    return [(repr(s.log_prob), s.token_count, s.oov_count) for s in reply]


def _read_without_numpy(data: bytes, monkeypatch: pytest.MonkeyPatch) -> object:
    with monkeypatch.context() as patch:
        patch.setattr(client_wire, "np", None)
        return client_wire.read_score_response(data)


def test_pure_python_reader_equals_numpy_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(11)
    n = 300
    log_probs = [*(rng.standard_normal(n) * 50).tolist(), 0.0, -0.0, -math.inf, math.nan]
    tokens = [*rng.integers(0, 1 << 21, n).tolist(), 0, 127, 128, (1 << 21) - 1]
    oovs = [*rng.integers(0, 300, n).tolist(), 16383, 16384, 0, 1]
    data = _served(log_probs, tokens, oovs)
    with_numpy = client_wire.read_score_response(data)
    without = _read_without_numpy(data, monkeypatch)
    assert _key(without) == _key(with_numpy)
    assert [t for _, t, _ in _key(without)] == tokens
    assert [o for _, _, o in _key(without)] == oovs


def test_pure_python_reader_falls_back_to_protobuf_like_numpy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    served = _served([-1.5, -2.25], [3, 20000], [0, 2])
    canonical = pb.ScoreResponse.FromString(served).SerializeToString()  # minimal varints
    assert isinstance(client_wire.read_score_response(canonical), pb.ScoreResponse)
    assert isinstance(_read_without_numpy(canonical, monkeypatch), pb.ScoreResponse)
    for offset in (-19, -8, -4):  # the head, then each count's key byte
        corrupted = bytearray(served)
        corrupted[offset] ^= 0x40
        assert client_wire._read_totals(bytes(corrupted)) is None
        with monkeypatch.context() as patch:
            patch.setattr(client_wire, "np", None)
            assert client_wire._read_totals(bytes(corrupted)) is None
    assert _read_without_numpy(_served([], [], []), monkeypatch) == []


def test_health_codec_matches_the_generated_messages() -> None:
    for service in ("", "lmserve.v1.LanguageModelService/kjv-5gram", "é" * 100):
        expected = health_pb2.HealthCheckRequest(service=service).SerializeToString()
        assert _health.encode_check(service) == expected
    for status in (0, 1, 2, 3):
        data = health_pb2.HealthCheckResponse(status=status).SerializeToString()
        assert _health.decode_status(data) == status
        assert _health.HEALTH_NAMES[status] == health_pb2.HealthCheckResponse.ServingStatus.Name(
            status
        )
    assert _health.decode_status(b"\x08") == 0  # truncated: unknown


def test_retry_delay_read_without_googleapis_protos() -> None:
    status = status_pb2.Status(code=8, message="queue full")
    status.details.add().Pack(error_details_pb2.ErrorInfo(reason="QUEUE_FULL"))
    status.details.add().Pack(
        error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=2, nanos=500_000_000))
    )
    assert retry_delay(status.SerializeToString()) == 2.5
    without = status_pb2.Status(code=8, message="too large")
    without.details.add().Pack(error_details_pb2.ErrorInfo(reason="TOO_LARGE"))
    assert retry_delay(without.SerializeToString()) is None
    assert retry_delay(b"\x1a\x05abc") is None  # truncated detail


def test_wire_reader_rejects_malformed_bytes() -> None:
    assert encode_varint(300) == b"\xac\x02"
    with pytest.raises(WireError):
        list(fields(b"\x0a\x05ab"))
    with pytest.raises(WireError):
        list(fields(b"\x0b"))  # wire type 3 (groups) is not read
    assert list(fields(b"\x08\x96\x01\x12\x02hi")) == [(1, 150), (2, b"hi")]
