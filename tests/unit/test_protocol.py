"""The front/worker frames: every declared message decodes into its own type with its values,
from a byte stream cut anywhere; errors cross as the same `errors` class; the scoring request
and reply round-trip their arrays exactly; the worker's Generate messages merge as protobuf."""

from __future__ import annotations

import numpy as np

from lmserve.server.backends.base import BatchScores
from lmserve.server.decoding.beam import Hypothesis
from lmserve.server.decoding.params import (
    BeamParams,
    GenerateParams,
    SamplingParams,
    StoppingParams,
)
from lmserve.server.decoding.scoring import PreparedScoring, ScoreOptions
from lmserve.server.decoding.stopping import FinishReason
from lmserve.server.errors import InvalidArgument, Overloaded
from lmserve.server.shared import protocol as p
from lmserve.server.shared.edits import CompleteAnswer, CompleteEdit
from lmserve.server.text.vocab import EncodedBatch
from lmserve.server.worker.generation.sequence import FinishEvent, TokenEvent, Usage
from lmserve.server.worker.replies.generate import serialized_chunk
from lmserve.v1 import lm_service_pb2 as pb


def _round_trip(message: object, kind: object) -> object:
    reader = p.FrameReader(kind)
    data = p.encode(message)  # type: ignore[arg-type]
    out = []
    for i in range(len(data)):  # one byte at a time: frames cut anywhere
        out += reader.feed(data[i : i + 1])
    [decoded] = out
    return decoded


def test_every_call_decodes_into_its_declared_type() -> None:
    params = GenerateParams(
        StoppingParams(9, stop=("the end",)), SamplingParams(top_k=5, seed=3), n=2, logprobs=True
    )
    messages = [
        p.Generate(7, [1, 5, 9], params, 12.5, 3.25),
        p.BeamSearchCall(3, [4], BeamParams(4, 6, num_return=2), None),
        p.CompleteCall(2, CompleteEdit("s1", append=[5], partial="th", k=3, history=[["a"]])),
        p.Taken(7, 40),
        p.StreamCancel(7),
        p.Cancel(3),
        p.MetricsCall(9),
        p.Stop(),
    ]
    for message in messages:
        decoded = _round_trip(message, p.TO_WORKER)
        assert type(decoded) is type(message)
        assert decoded == message


def test_replies_and_events_decode_into_their_types() -> None:
    chunk = p.StreamChunk(4, [b"\x0a\x02\x08\x01"], 1, 0, True, False)
    messages = [
        p.Ready(1234, "\0lmserve-1-1-m"),
        p.Failed("m/step.onnx: ONNX Runtime cannot load it"),
        p.Events([chunk, p.StreamChunk(5, [], 0, 0, False, True, p.ErrorInfo("Cancelled", "x"))]),
        p.Parked(4, True),
        p.BeamSearchReply(3, [Hypothesis((1, 2), -1.5, -0.75, FinishReason.END_OF_SENTENCE)]),
        p.CompleteReply(2, CompleteAnswer("s1", 4, False, [("the", -1.25)])),
        p.ScoreReply(1, b"\x0a\x01m"),
    ]
    for message in messages:
        decoded = _round_trip(message, p.TO_FRONT)
        assert type(decoded) is type(message)
        assert decoded == message


def test_errors_cross_as_the_same_class_with_their_attributes() -> None:
    for exc in (
        InvalidArgument("texts[3]", "is not UTF-8"),
        Overloaded("queue full", limit="max_queued_requests", model="m", retry_after=0.25),
    ):
        info = _round_trip(p.ErrorReply(1, p.ErrorInfo.of(exc)), p.TO_FRONT).error  # type: ignore[attr-defined]
        rebuilt = info.error()
        assert type(rebuilt) is type(exc)
        assert str(rebuilt) == str(exc)
        assert rebuilt.__dict__ == exc.__dict__
    fault = p.ErrorInfo.of(ZeroDivisionError("division by zero")).error()
    assert isinstance(fault, RuntimeError) and "ZeroDivisionError" in str(fault)


def test_a_prepared_scoring_request_and_its_scores_round_trip_exactly() -> None:
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 1000, 50).astype(np.int32)
    offsets = np.array([0, 10, 10, 50], dtype=np.int64)
    oov = rng.random(50) < 0.1
    prepared = PreparedScoring(
        batch=EncodedBatch(ids, offsets, oov),
        lengths=np.diff(offsets),
        words=[2, 0, 9],
        word_lists=None,
        options=ScoreOptions(bos=True, eos=False),
        details=True,
        oov_log_probs=True,
        oov_counts=np.array([1, 0, 4], dtype=np.int64),
        per_token=True,
    )
    back = p.prepared_of(
        _round_trip(p.ScoreCall(1, p.scoring_work(prepared), None), p.TO_WORKER).work
    )  # type: ignore[attr-defined]
    np.testing.assert_array_equal(back.batch.ids, ids)
    np.testing.assert_array_equal(back.batch.offsets, offsets)
    np.testing.assert_array_equal(back.batch.oov, oov)
    assert back.options == prepared.options and back.words == [2, 0, 9]
    assert back.scored_tokens == prepared.scored_tokens
    scores = BatchScores(rng.random(3), rng.random(50), np.array([0, 10, 10, 50]))
    reply = _round_trip(p.batch_scores_reply(2, scores), p.TO_FRONT)
    np.testing.assert_array_equal(reply.totals.numpy(), scores.totals)  # type: ignore[attr-defined]
    np.testing.assert_array_equal(reply.token_log_probs.numpy(), scores.token_log_probs)  # type: ignore[attr-defined]
    assert reply.ngram_lengths is None  # type: ignore[attr-defined]


def test_generate_messages_are_the_servers_and_an_open_one_merges_by_concatenation() -> None:
    words = ["<unk>", "<s>", "</s>", "the", "cat"]
    first = [TokenEvent(0, 0, 3, "the", -1.0, ((3, -1.0), (4, -2.0)))]
    usage = Usage(2, 2, 0.01, 0.02)
    second = [
        TokenEvent(0, 1, 4, " cat", -2.0),
        FinishEvent(0, FinishReason.LENGTH, "the cat", -3.0, usage),
    ]
    a = serialized_chunk(first, words, logprobs=True, top_logprobs=1)
    b = serialized_chunk(second, words, logprobs=True, top_logprobs=1)
    assert a.open_tail and not b.open_tail and (a.events, b.events, b.finished) == (1, 2, 1)
    merged = pb.GenerateResponse.FromString(a.messages[-1] + b.messages[0])
    assert [t.token_id for t in merged.tokens] == [3, 4]
    assert [t.text for t in merged.tokens] == ["the", " cat"]
    assert merged.tokens[0].top_logprobs[0].text == "the"
    assert merged.finished.reason == pb.FINISH_REASON_LENGTH and merged.finished.text == "the cat"
