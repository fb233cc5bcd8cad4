"""The client's result types: conversion from the protobuf messages, and the fast constructor."""

from __future__ import annotations

import dataclasses
import math

import pytest

from lmserve.client import ModelInfo, PerplexityStats, TextScore
from lmserve.v1 import lm_service_pb2 as pb


def test_fast_totals_equal_the_dataclass_constructor() -> None:
    fast = TextScore.totals(-12.5, 7, 1)
    slow = TextScore(-12.5, 7, 1)
    assert fast == slow and hash(fast) == hash(slow) and repr(fast) == repr(slow)
    assert {f.name: getattr(fast, f.name) for f in dataclasses.fields(TextScore)} == {
        "log_prob": -12.5,
        "token_count": 7,
        "oov_count": 1,
        "tokens": None,
        "bias": 0.0,
        "bias_phrases": (),
    }
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.log_prob = 0.0  # type: ignore[misc]


def test_text_score_from_proto_with_and_without_details() -> None:
    msg = pb.TextScore(
        log_prob=-3.0,
        token_count=2,
        oov_count=1,
        details=pb.TokenDetails(
            tokens=["zebra", "</s>"],
            token_ids=[0, 2],
            log_probs=[-2.5, -0.5],
            oov=[True, False],
            ngram_lengths=[1, 2],
        ),
    )
    assert TextScore.from_proto(msg, False) == TextScore(-3.0, 2, 1)
    detailed = TextScore.from_proto(msg, True)
    assert detailed.tokens is not None
    assert [(t.token, t.token_id, t.log_prob, t.oov, t.ngram_length) for t in detailed.tokens] == [
        ("zebra", 0, -2.5, True, 1),
        ("</s>", 2, -0.5, False, 2),
    ]
    neural = pb.TextScore(
        details=pb.TokenDetails(tokens=["a"], token_ids=[5], log_probs=[-1.0], oov=[False])
    )
    [token] = TextScore.from_proto(neural, True).tokens or ()
    assert token.ngram_length is None


def test_model_info_and_stats_from_proto() -> None:
    info = ModelInfo.from_proto(
        pb.ModelInfo(
            name="m",
            kind=pb.MODEL_KIND_NGRAM,
            format=pb.MODEL_FORMAT_ARPA,
            state=pb.MODEL_STATE_READY,
            order=3,
            tokenizer=pb.TokenizerInfo(kind=pb.TOKENIZER_KIND_WORD, lowercase=True),
            capabilities=pb.ModelCapabilities(score=True, perplexity=True),
            provenance=pb.Provenance(metrics={"test_perplexity": 57.3}),
        )
    )
    assert (info.kind, info.format, info.state, info.tokenizer.kind) == (
        "ngram",
        "arpa",
        "ready",
        "word",
    )
    assert info.ready and info.capabilities == {"score", "perplexity"}
    assert dict(info.provenance.metrics) == {"test_perplexity": 57.3}
    stats = PerplexityStats.from_proto(
        pb.PerplexityStats(log_prob=-10.0, token_count=5, perplexity=math.exp(2.0))
    )
    assert (stats.log_prob, stats.token_count, stats.perplexity) == (-10.0, 5, math.exp(2.0))
