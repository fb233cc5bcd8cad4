"""Every rejected request: the right status code, the field named, and the server unharmed."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import grpc
import pytest
from integration_data import MAX_TEXTS, MAX_TOKENS

from lmserve.v1 import lm_service_pb2 as pb
from lmserve.v1 import lm_service_pb2_grpc

Stub = lm_service_pb2_grpc.LanguageModelServiceStub


def _fails(call: Callable[[], object], code: grpc.StatusCode, *phrases: str) -> str:
    with pytest.raises(grpc.RpcError) as err:
        call()
    assert err.value.code() == code, err.value.details()
    details = err.value.details()
    for phrase in phrases:
        assert phrase in details
    assert "Traceback" not in details
    return details


def _tokens(*lists: list[str]) -> list[pb.TokenList]:
    return [pb.TokenList(tokens=t) for t in lists]


INVALID = grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize(
    ("request_", "phrases"),
    [
        (pb.ScoreRequest(model="", texts=["a"]), ("model", "empty")),
        (pb.ScoreRequest(model="test"), ("texts", "no texts")),
        (
            pb.ScoreRequest(model="test", texts=["a"], token_lists=_tokens(["a"])),
            ("texts", "not both"),
        ),
        (pb.ScoreRequest(model="test", texts=["a"] * (MAX_TEXTS + 1)), ("texts", str(MAX_TEXTS))),
        (
            pb.ScoreRequest(model="test", texts=["a", "a " * (MAX_TOKENS + 1)]),
            ("texts[1]", str(MAX_TOKENS)),
        ),
        (
            pb.ScoreRequest(model="test", token_lists=_tokens(["a"], ["a"] * (MAX_TOKENS + 1))),
            ("token_lists[1]", "limit"),
        ),
        (
            pb.ScoreRequest(model="test", token_lists=_tokens(["a"], ["b", ""])),
            ("token_lists[1].tokens[1]", "empty token"),
        ),
    ],
)
def test_score_invalid_arguments(
    stub: Stub, request_: pb.ScoreRequest, phrases: tuple[str, ...]
) -> None:
    _fails(lambda: stub.Score(request_), INVALID, *phrases)


def test_perplexity_validates_like_score(stub: Stub) -> None:
    _fails(lambda: stub.Perplexity(pb.PerplexityRequest(model="test")), INVALID, "texts")
    _fails(lambda: stub.Perplexity(pb.PerplexityRequest(texts=["a"])), INVALID, "model")


def test_unknown_model_lists_the_available_ones(stub: Stub) -> None:
    details = _fails(
        lambda: stub.Score(pb.ScoreRequest(model="nope", texts=["a"])),
        grpc.StatusCode.NOT_FOUND,
        "'nope'",
        "available:",
        "kjv3",
    )
    assert "test-nounk" in details
    _fails(lambda: stub.GetModel(pb.GetModelRequest(model="nope")), grpc.StatusCode.NOT_FOUND)
    _fails(lambda: stub.GetModel(pb.GetModelRequest()), INVALID, "model")


def test_failed_model_is_unavailable_with_its_load_error(stub: Stub) -> None:
    _fails(
        lambda: stub.Score(pb.ScoreRequest(model="bad-checksum", texts=["a"])),
        grpc.StatusCode.UNAVAILABLE,
        "bad-checksum",
        "sha256",
    )


def _stream(*messages: pb.CorpusPerplexityRequest) -> Iterator[pb.CorpusPerplexityRequest]:
    yield from messages


def test_corpus_perplexity_rejects_changes_mid_stream(stub: Stub) -> None:
    first = pb.CorpusPerplexityRequest(model="test", texts=["a little"])
    _fails(
        lambda: stub.CorpusPerplexity(
            _stream(first, pb.CorpusPerplexityRequest(model="kjv3", texts=["a"]))
        ),
        INVALID,
        "model",
        "mid-stream",
    )
    _fails(
        lambda: stub.CorpusPerplexity(
            _stream(
                first,
                pb.CorpusPerplexityRequest(texts=["a"], options=pb.ScoreOptions(eos=False)),
            )
        ),
        INVALID,
        "options",
    )
    _fails(lambda: stub.CorpusPerplexity(_stream()), INVALID, "model")
    _fails(
        lambda: stub.CorpusPerplexity(
            _stream(first, pb.CorpusPerplexityRequest(token_lists=_tokens([""])))
        ),
        INVALID,
        "token_lists[0].tokens[0]",
    )


def test_rerank_and_complete_check_their_first_fields(stub: Stub) -> None:
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    _fails(lambda: stub.Rerank(pb.RerankRequest(model="test")), invalid, "lists")
    _fails(lambda: list(stub.Complete(iter([pb.CompleteRequest(model="test")]))), invalid, "k")
    _fails(lambda: list(stub.Complete(iter([pb.CompleteRequest()]))), invalid, "model")


class _ExpiredContext:
    """Only what the deadline check reads: a deadline already behind us."""

    def time_remaining(self) -> float:
        return -0.5


def test_expired_deadline_is_refused_before_work() -> None:
    from lmserve.server.errors import DeadlineExceeded
    from lmserve.server.front.api.interceptors import _check_deadline

    with pytest.raises(DeadlineExceeded):
        _check_deadline(_ExpiredContext())  # type: ignore[arg-type]


def test_server_still_answers_after_bad_requests(stub: Stub) -> None:
    for _ in range(3):
        with pytest.raises(grpc.RpcError):
            stub.Score(pb.ScoreRequest(model="test", token_lists=_tokens([""])))
    result = stub.Score(pb.ScoreRequest(model="test", texts=["a little"])).results[0]
    assert result.token_count == 3
