"""Packed totals (`worker.replies.packing`) give the very message `results.add` builds, byte
for byte, and the client (`lmserve.client._wire`) reads them back as protobuf would."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lmserve.client import _wire as client_wire
from lmserve.client.client import _scores
from lmserve.client.types import TextScore
from lmserve.server.decoding.scored import ScoredTexts
from lmserve.server.worker.replies import packing as wire
from lmserve.server.worker.replies.score import score_response_bytes
from lmserve.v1 import lm_service_pb2 as pb


def _added(log_probs: list[float], tokens: list[int], oovs: list[int]) -> pb.ScoreResponse:
    response = pb.ScoreResponse(model="m")
    for lp, n, o in zip(log_probs, tokens, oovs, strict=True):
        response.results.add(log_prob=lp, token_count=n, oov_count=o)
    return response


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


def _packed(log_probs: list[float], tokens: list[int], oovs: list[int]) -> pb.ScoreResponse:
    """What Score answers, as the message a client parses from it."""
    answer = score_response_bytes("m", _scored(log_probs, tokens, oovs))
    return pb.ScoreResponse.FromString(answer) if isinstance(answer, bytes) else answer


def _same(log_probs: list[float], tokens: list[int], oovs: list[int]) -> bytes:
    expected = _added(log_probs, tokens, oovs).SerializeToString()
    assert _packed(log_probs, tokens, oovs).SerializeToString() == expected
    return expected


def test_random_values_serialize_identically() -> None:
    rng = np.random.default_rng(7)
    n = 300
    log_probs = (rng.standard_normal(n) * 80).tolist()
    tokens = rng.integers(1, wire.MAX_PACKED_COUNT + 1, n).tolist()
    oovs = rng.integers(0, 200, n).tolist()
    _same(log_probs, tokens, oovs)
    assert wire.packed_text_scores(np.array(log_probs), np.array(tokens), np.array(oovs))


def test_zeros_and_edges_serialize_identically() -> None:
    # Zero fields are left out of the canonical encoding; -0.0 is not zero bit-wise and stays.
    top = wire.MAX_PACKED_COUNT
    log_probs = [0.0, -0.0, -math.inf, math.inf, -1e-300, -5e300]
    _same(log_probs, [0, 1, 127, 128, 16383, top], [0, 0, 128, 16384, top, 1])


def test_nan_and_empty_batch() -> None:
    packed = _packed([math.nan, -2.5], [3, 4], [0, 1])
    assert math.isnan(packed.results[0].log_prob)
    assert (
        packed.SerializeToString() == _added([math.nan, -2.5], [3, 4], [0, 1]).SerializeToString()
    )
    assert _same([], [], []) == pb.ScoreResponse(model="m").SerializeToString()


@pytest.mark.parametrize(
    ("tokens", "oovs"),
    [([2**21], [0]), ([5], [2**21]), ([2**31 - 1], [7]), ([-1], [0]), ([3], [-2])],
)
def test_counts_that_do_not_fit_three_bytes_fall_back(tokens: list[int], oovs: list[int]) -> None:
    arrays = np.array(tokens), np.array(oovs)
    assert wire.packed_text_scores(np.array([-1.0]), *arrays) is None
    _same([-1.0], tokens, oovs)
    assert _packed([-1.0], tokens, oovs).results[0].token_count == tokens[0]


def test_details_still_built_field_by_field() -> None:
    from lmserve.server.decoding.scored import TokenDetails

    details = TokenDetails(
        tokens=["a", "</s>"],
        token_ids=np.array([3, 2], dtype=np.int32),
        log_probs=np.array([-1.0, -2.0]),
        oov=np.array([False, False]),
        ngram_lengths=np.array([1, 2], dtype=np.int32),
    )
    scored = ScoredTexts(
        log_probs=np.array([-3.0]),
        token_counts=np.array([2]),
        word_counts=np.array([2]),
        oov_counts=np.array([0]),
        oov_log_probs=None,
        details=[details],
        total_tokens=2,
    )
    answer = score_response_bytes("m", scored)
    assert isinstance(answer, pb.ScoreResponse)  # details are never packed
    [result] = answer.results
    assert list(result.details.tokens) == ["a", "</s>"]
    assert list(result.details.log_probs) == [-1.0, -2.0]
    assert (result.log_prob, result.token_count) == (-3.0, 2)


def test_c_packing_equals_numpy_packing() -> None:
    """`_wire.pack_totals` (C) writes the very bytes of `packed_text_scores` (numpy)."""
    from lmserve.server.worker.replies import _wire

    rng = np.random.default_rng(11)
    top = wire.MAX_PACKED_COUNT
    log_probs = np.concatenate(
        [rng.standard_normal(500) * 80, [0.0, -0.0, math.nan, -math.inf, math.inf, -5e300]]
    )
    n = len(log_probs)
    tokens = np.concatenate([rng.integers(0, top + 1, n - 4), [0, 127, 128, top]])
    oovs = np.concatenate([rng.integers(0, 300, n - 4), [top, 16383, 16384, 0]])
    packed = _wire.pack_totals(log_probs, tokens, oovs)
    assert packed is not None and len(packed) == 19 * n
    assert packed == wire.packed_text_scores(log_probs, tokens, oovs)
    empty = np.array([], dtype=np.float64), np.array([], dtype=np.int64)
    assert _wire.pack_totals(empty[0], empty[1], empty[1]) == b""
    for bad_tokens, bad_oovs in [([top + 1], [0]), ([1], [top + 1]), ([-1], [0]), ([1], [-3])]:
        assert _wire.pack_totals(np.array([-1.0]), np.array(bad_tokens), np.array(bad_oovs)) is None


def test_packing_takes_other_integer_and_float_arrays() -> None:
    """`wire.pack_totals` converts what the C writer does not take (int32 counts, float32 or
    strided log-probs) instead of failing the request."""
    log_probs = np.array([-1.5, -2.0, -3.25, -4.0])
    want = wire.packed_text_scores(log_probs[::2], np.array([3, 4]), np.array([0, 1]))
    got = wire.pack_totals(
        log_probs[::2], np.array([3, 4], dtype=np.int32), np.array([0, 1], dtype=np.int16)
    )
    assert got == want
    assert wire.pack_totals(
        log_probs[::2].astype(np.float32), np.array([3, 4]), np.array([0, 1])
    ) == wire.packed_text_scores(
        log_probs[::2].astype(np.float32), np.array([3, 4]), np.array([0, 1])
    )


def test_c_packing_refuses_wrong_arrays() -> None:
    from lmserve.server.worker.replies import _wire

    f64, i64 = np.zeros(3), np.zeros(3, dtype=np.int64)
    with pytest.raises(TypeError, match="log_probs"):
        _wire.pack_totals(f64.astype(np.float32), i64, i64)
    with pytest.raises(TypeError, match="oov_counts"):
        _wire.pack_totals(f64, i64, i64.astype(np.int32))
    with pytest.raises(ValueError, match="length"):
        _wire.pack_totals(f64, i64, i64[:2])
    with pytest.raises(TypeError):
        _wire.pack_totals(f64, i64)  # type: ignore[call-arg]


def test_response_bytes_parse_to_the_built_message() -> None:
    """What Score sends for totals alone: the model field and the packed records, which any
    protobuf parser reads as the message built field by field."""
    log_probs, tokens, oovs = [-3.5, -0.0, -12.25], [4, 1, 300], [0, 1, 2]
    for model in ("m", "kjv-5gram", "ü" * 100):  # a name longer than one varint byte
        data = score_response_bytes(model, _scored(log_probs, tokens, oovs))
        assert isinstance(data, bytes)
        want = _added(log_probs, tokens, oovs)
        want.model = model
        assert pb.ScoreResponse.FromString(data) == want


# -- the client's side: `lmserve.client._wire` reads those bytes back --------------------------


def _by_protobuf(data: bytes) -> list[TextScore]:
    return _scores(pb.ScoreResponse.FromString(data), False)


def _same_scores(a: list[TextScore], b: list[TextScore]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert (x.token_count, x.oov_count, x.tokens) == (y.token_count, y.oov_count, y.tokens)
        assert x.log_prob == y.log_prob or (math.isnan(x.log_prob) and math.isnan(y.log_prob))
        assert math.copysign(1, x.log_prob) == math.copysign(1, y.log_prob)


def test_client_reads_server_bytes_without_protobuf() -> None:
    rng = np.random.default_rng(3)
    n = 400
    log_probs = [*(rng.standard_normal(n) * 50).tolist(), 0.0, -0.0, -math.inf, math.nan]
    tokens = [*rng.integers(0, 1 << 21, n).tolist(), 0, 127, 128, (1 << 21) - 1]
    oovs = [*rng.integers(0, 300, n).tolist(), 16383, 16384, 0, 1]
    data = score_response_bytes("kjv-5gram", _scored(log_probs, tokens, oovs))
    assert isinstance(data, bytes)
    reply = client_wire.read_score_response(data)
    assert isinstance(reply, list)  # the fast path took it
    _same_scores(reply, _by_protobuf(data))
    assert [r.token_count for r in reply] == tokens


def test_client_reads_other_encodings_through_protobuf() -> None:
    scored = _scored([-1.5, -2.25], [3, 20000], [0, 2])
    served = score_response_bytes("m", scored)
    assert isinstance(served, bytes)
    canonical = pb.ScoreResponse.FromString(served).SerializeToString()  # minimal varints
    long_name = score_response_bytes("x" * 200, scored)  # a 2-byte length varint
    assert isinstance(long_name, bytes)
    for data in (canonical, long_name):
        reply = client_wire.read_score_response(data)
        assert isinstance(reply, pb.ScoreResponse)
        _same_scores(_scores(reply, False), _by_protobuf(served))
    # Per-token details are not totals: the message, with its details.
    with_details = pb.ScoreResponse(model="m")
    result = with_details.results.add(log_prob=-1.0, token_count=1)
    result.details.tokens.append("a")
    reply = client_wire.read_score_response(with_details.SerializeToString())
    assert isinstance(reply, pb.ScoreResponse) and list(reply.results[0].details.tokens) == ["a"]


def test_client_reads_empty_and_nameless_answers() -> None:
    empty = score_response_bytes("m", _scored([], [], []))
    assert isinstance(empty, bytes) and client_wire.read_score_response(empty) == []
    nameless = pb.ScoreResponse(results=[pb.TextScore(log_prob=-1.0, token_count=2)])
    reply = client_wire.read_score_response(nameless.SerializeToString())
    _same_scores(_scores(reply, False), [TextScore(-1.0, 2, 0)])
