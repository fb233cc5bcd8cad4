"""Packed totals (`api.wire`) give the very message `results.add` builds, byte for byte."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lmserve.server.api import convert, wire
from lmserve.server.decoding.scoring import ScoredTexts
from lmserve.v1 import lm_service_pb2 as pb


def _added(log_probs: list[float], tokens: list[int], oovs: list[int]) -> pb.ScoreResponse:
    response = pb.ScoreResponse(model="m")
    for lp, n, o in zip(log_probs, tokens, oovs, strict=True):
        response.results.add(log_prob=lp, token_count=n, oov_count=o)
    return response


def _packed(log_probs: list[float], tokens: list[int], oovs: list[int]) -> pb.ScoreResponse:
    scored = ScoredTexts(
        log_probs=np.array(log_probs, dtype=np.float64),
        token_counts=np.array(tokens, dtype=np.int64),
        word_counts=np.array(tokens, dtype=np.int64),
        oov_counts=np.array(oovs, dtype=np.int64),
        oov_log_probs=None,
        details=None,
    )
    return convert.score_response("m", scored)


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
    from lmserve.server.decoding.scoring import TokenDetails

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
    )
    [result] = convert.score_response("m", scored).results
    assert list(result.details.tokens) == ["a", "</s>"]
    assert list(result.details.log_probs) == [-1.0, -2.0]
    assert (result.log_prob, result.token_count) == (-3.0, 2)
