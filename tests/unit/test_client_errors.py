"""The client maps gRPC statuses to its exception hierarchy, against a fake in-process server."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Iterator
from concurrent import futures

import grpc
import pytest

from lmserve.client import (
    AsyncLmServeClient,
    DeadlineExceededError,
    InvalidArgumentError,
    LmServeClient,
    LmServeClientError,
    ModelNotFoundError,
    ResourceExhaustedError,
    UnavailableError,
)
from lmserve.client.errors import error_for_status, from_rpc_error
from lmserve.v1 import lm_service_pb2 as pb
from lmserve.v1 import lm_service_pb2_grpc

EXPECTED = [
    (grpc.StatusCode.NOT_FOUND, ModelNotFoundError),
    (grpc.StatusCode.INVALID_ARGUMENT, InvalidArgumentError),
    (grpc.StatusCode.UNAVAILABLE, UnavailableError),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, ResourceExhaustedError),
    (grpc.StatusCode.DEADLINE_EXCEEDED, DeadlineExceededError),
]


class _FakeService(lm_service_pb2_grpc.LanguageModelServiceServicer):
    """Aborts Score with the status code named by the request's model (e.g. "NOT_FOUND");
    model "slow" sleeps past any short deadline; anything else gets one empty result."""

    def Score(self, request: pb.ScoreRequest, context: grpc.ServicerContext) -> pb.ScoreResponse:
        if request.model == "slow":
            time.sleep(1.0)
        elif request.model in grpc.StatusCode.__members__:
            context.abort(grpc.StatusCode[request.model], f"server says {request.model.lower()}")
        return pb.ScoreResponse(model=request.model, results=[pb.TextScore(token_count=1)])

    def CorpusPerplexity(
        self, request_iterator: Iterator[pb.CorpusPerplexityRequest], context: grpc.ServicerContext
    ) -> pb.CorpusPerplexityResponse:
        n = sum(len(r.texts) for r in request_iterator)
        return pb.CorpusPerplexityResponse(stats=pb.PerplexityStats(text_count=n))


@pytest.fixture(scope="module")
def fake_target() -> Iterator[str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    lm_service_pb2_grpc.add_LanguageModelServiceServicer_to_server(_FakeService(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(grace=None)


@pytest.mark.parametrize(("code", "cls"), EXPECTED)
def test_error_for_status_picks_the_subclass(code: grpc.StatusCode, cls: type) -> None:
    err = error_for_status(code, "why")
    assert type(err) is cls
    assert isinstance(err, LmServeClientError)
    assert err.code is code and err.message == "why"
    assert code.name in str(err) and "why" in str(err)


@pytest.mark.parametrize("code", [grpc.StatusCode.INTERNAL, grpc.StatusCode.UNIMPLEMENTED, None])
def test_other_statuses_raise_the_base_class(code: grpc.StatusCode | None) -> None:
    assert type(error_for_status(code, "")) is LmServeClientError


def test_from_rpc_error_reads_code_and_details() -> None:
    class FakeRpcError(grpc.RpcError):
        def code(self) -> grpc.StatusCode:
            return grpc.StatusCode.NOT_FOUND

        def details(self) -> str:
            return "model 'x' not found"

    err = from_rpc_error(FakeRpcError())
    assert isinstance(err, ModelNotFoundError)
    assert err.message == "model 'x' not found"


@pytest.mark.parametrize(("code", "cls"), EXPECTED[:4])
def test_server_status_reaches_caller_as_exception(
    fake_target: str, code: grpc.StatusCode, cls: type
) -> None:
    with LmServeClient(fake_target, timeout=5) as client:
        with pytest.raises(cls) as info:
            client.score(code.name, ["a b"])
    assert info.value.code is code
    assert info.value.message == f"server says {code.name.lower()}"


def test_call_deadline_gives_deadline_exceeded(fake_target: str) -> None:
    with LmServeClient(fake_target, timeout=5) as client:
        with pytest.raises(DeadlineExceededError):
            client.score("slow", ["a"], timeout=0.05)
        # The same client still works, with its default deadline.
        assert client.score("ok", ["a"])[0].token_count == 1


def test_unreachable_server_is_unavailable() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with LmServeClient(f"127.0.0.1:{port}", timeout=2) as client:
        with pytest.raises(UnavailableError):
            client.score("m", ["a"])
        with pytest.raises(UnavailableError):
            client.wait_for_ready(timeout=0.2)


def test_a_bare_string_is_rejected_before_any_call(fake_target: str) -> None:
    with LmServeClient(fake_target) as client:
        with pytest.raises(TypeError):
            client.score("ok", "a single string")
        with pytest.raises(TypeError):
            client.score("ok", ["text", ["tok", "list"]])


def test_error_in_corpus_batches_reaches_the_caller_unchanged(fake_target: str) -> None:
    def batches() -> Iterator[list[str]]:
        yield ["a b", "c"]
        raise ValueError("reading the corpus failed")

    with LmServeClient(fake_target, timeout=5) as client:
        assert client.corpus_perplexity("m", iter([["a"], ["b", "c"]])).text_count == 3
        with pytest.raises(ValueError, match="reading the corpus failed"):
            client.corpus_perplexity("m", batches())


def test_async_client_maps_errors_the_same_way(fake_target: str) -> None:
    async def batches() -> AsyncIterator[list[str]]:
        yield ["a"]
        raise ValueError("async corpus failed")

    async def main() -> None:
        async with AsyncLmServeClient(fake_target, timeout=5) as client:
            with pytest.raises(ModelNotFoundError) as info:
                await client.score("NOT_FOUND", ["a"])
            assert info.value.message == "server says not_found"
            with pytest.raises(DeadlineExceededError):
                await client.score("slow", ["a"], timeout=0.05)
            with pytest.raises(ValueError, match="async corpus failed"):
                await client.corpus_perplexity("m", batches())
            assert (await client.corpus_perplexity("m", [["a", "b"], ["c"]])).text_count == 3

    asyncio.run(main())
