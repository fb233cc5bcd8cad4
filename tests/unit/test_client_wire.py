"""The client reads totals-only Score answers from their wire bytes (`lmserve.client._wire`):
the same TextScores as protobuf parsing gives, for what the server writes and for anything else."""

from __future__ import annotations

import math

import numpy as np

from lmserve.client import _wire
from lmserve.client.client import _scores
from lmserve.client.types import TextScore
from lmserve.server.api import convert
from lmserve.server.decoding.scoring import ScoredTexts
from lmserve.v1 import lm_service_pb2 as pb


def _scored(log_probs: list[float], tokens: list[int], oovs: list[int]) -> ScoredTexts:
    return ScoredTexts(
        log_probs=np.array(log_probs, dtype=np.float64),
        token_counts=np.array(tokens, dtype=np.int64),
        word_counts=np.array(tokens, dtype=np.int64),
        oov_counts=np.array(oovs, dtype=np.int64),
        oov_log_probs=None,
        details=None,
        total_tokens=sum(tokens),
    )


def _by_protobuf(data: bytes) -> list[TextScore]:
    return _scores(pb.ScoreResponse.FromString(data), False)


def _same(a: list[TextScore], b: list[TextScore]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert (x.token_count, x.oov_count, x.tokens) == (y.token_count, y.oov_count, y.tokens)
        assert x.log_prob == y.log_prob or (math.isnan(x.log_prob) and math.isnan(y.log_prob))
        assert math.copysign(1, x.log_prob) == math.copysign(1, y.log_prob)


def test_server_bytes_are_read_without_protobuf() -> None:
    rng = np.random.default_rng(3)
    n = 400
    log_probs = [*(rng.standard_normal(n) * 50).tolist(), 0.0, -0.0, -math.inf, math.nan]
    tokens = [*rng.integers(0, 1 << 21, n).tolist(), 0, 127, 128, (1 << 21) - 1]
    oovs = [*rng.integers(0, 300, n).tolist(), 16383, 16384, 0, 1]
    data = convert.score_response_bytes("kjv-5gram", _scored(log_probs, tokens, oovs))
    assert isinstance(data, bytes)
    reply = _wire.read_score_response(data)
    assert isinstance(reply, list)  # the fast path took it
    _same(reply, _by_protobuf(data))
    assert [r.token_count for r in reply] == tokens


def test_other_encodings_go_through_protobuf() -> None:
    scored = _scored([-1.5, -2.25], [3, 20000], [0, 2])
    served = convert.score_response_bytes("m", scored)
    assert isinstance(served, bytes)
    canonical = pb.ScoreResponse.FromString(served).SerializeToString()  # minimal varints
    long_name = convert.score_response_bytes("x" * 200, scored)  # a 2-byte length varint
    assert isinstance(long_name, bytes)
    for data in (canonical, long_name):
        reply = _wire.read_score_response(data)
        assert isinstance(reply, pb.ScoreResponse)
        _same(_scores(reply, False), _by_protobuf(served))
    # Per-token details are not totals: the message, with its details.
    with_details = pb.ScoreResponse(model="m")
    result = with_details.results.add(log_prob=-1.0, token_count=1)
    result.details.tokens.append("a")
    reply = _wire.read_score_response(with_details.SerializeToString())
    assert isinstance(reply, pb.ScoreResponse) and list(reply.results[0].details.tokens) == ["a"]


def test_empty_and_nameless_answers() -> None:
    empty = convert.score_response_bytes("m", _scored([], [], []))
    assert isinstance(empty, bytes) and _wire.read_score_response(empty) == []
    nameless = pb.ScoreResponse(results=[pb.TextScore(log_prob=-1.0, token_count=2)])
    reply = _wire.read_score_response(nameless.SerializeToString())
    _same(_scores(reply, False), [TextScore(-1.0, 2, 0)])
