"""What the sync and the asyncio clients share: error mapping, request iterators that keep
their own exceptions, health-service naming, and how Score answers are read.

Kept apart from the clients so that each client module holds only its own methods.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator
from typing import Any, Generic, Self, TypeVar

import grpc

from lmserve.client import _requests as req
from lmserve.client import _wire
from lmserve.client.errors import from_rpc_error
from lmserve.client.rerank_types import NBestInputError
from lmserve.client.types import HealthStatus, ModelInfo, TextScore
from lmserve.v1 import lm_service_pb2 as pb

R = TypeVar("R")

DEFAULT_TARGET = req.DEFAULT_TARGET
DEFAULT_TIMEOUT = 30.0

# The server publishes one health entry per model under this prefix: "<service>/<model>".
SERVICE_NAME = "lmserve.v1.LanguageModelService"


def health_service(model: str | None) -> str:
    """The health-service name to check: "" for the whole server, else the model's entry."""
    return f"{SERVICE_NAME}/{model}" if model else ""


def health_from_model(info: ModelInfo) -> HealthStatus:
    """A model the health service does not know, answered from its GetModel state instead."""
    return HealthStatus(health_service(info.name), "SERVING" if info.ready else "NOT_SERVING")


class RerankOptions:
    """The weights and options of a rerank call, shared by its requests (one per batch); a
    bias list goes with the first request only (the server keeps it for the stream)."""

    def __init__(
        self,
        model: str,
        bias: req.Bias | None = None,
        bias_boost: float | None = None,
        **options: Any,
    ) -> None:
        self.model = model
        self.options = options
        self.bias = req.bias_list(bias, bias_boost)

    def request(self, lists: req.NBestLists, *, with_bias: bool = True) -> pb.RerankRequest:
        bias = self.bias if with_bias else None
        return req.rerank_request(self.model, lists, bias=bias, **self.options)

    def stream_request(self, index: int, lists: req.NBestLists) -> pb.RerankRequest:
        """A batch's request; a bad batch's error names it as the server would:
        `requests[2].lists[0].hypotheses[1]: ...`."""
        try:
            return self.request(lists, with_bias=index == 0)
        except NBestInputError as exc:
            raise NBestInputError(f"requests[{index}].{exc.field}", exc.problem) from None


def score_calls(channel: Any) -> tuple[Any, Any]:
    """Score and ScoreStream on `channel` (sync or asyncio), their answers read by `_wire`
    rather than as messages."""
    score = channel.unary_unary(
        _wire.SCORE_METHOD,
        request_serializer=pb.ScoreRequest.SerializeToString,
        response_deserializer=_wire.read_score_response,
    )
    score_stream = channel.stream_stream(
        _wire.SCORE_STREAM_METHOD,
        request_serializer=pb.ScoreRequest.SerializeToString,
        response_deserializer=_wire.read_score_response,
    )
    return score, score_stream


def scores(resp: _wire.ScoreReply, with_tokens: bool, biased: bool = False) -> list[TextScore]:
    """One Score answer as TextScores, whichever way `_wire` read it."""
    if isinstance(resp, list):  # totals, read from the wire bytes (`_wire`)
        return resp
    if with_tokens or biased:
        return [TextScore.from_proto(r, with_tokens, biased) for r in resp.results]
    # The common rescoring path: totals only, no per-token work.
    totals = TextScore.totals
    return [totals(r.log_prob, r.token_count, r.oov_count) for r in resp.results]


@contextlib.contextmanager
def rpc_errors() -> Iterator[None]:
    """A failed call's RpcError raised as the client exception of its status code."""
    try:
        yield
    except grpc.RpcError as exc:
        raise from_rpc_error(exc) from None


class RequestError:
    """The exception that stopped building a call's requests, kept so that the caller gets it
    instead of the CANCELLED (or CancelledError) gRPC turns it into."""

    error: BaseException | None = None

    @contextlib.contextmanager
    def errors(self) -> Iterator[None]:
        """Around the call: the requests' own exception first, else the RPC's, mapped."""
        try:
            yield
        except grpc.RpcError as exc:
            if self.error is not None:
                raise self.error from None
            raise from_rpc_error(exc) from None
        except asyncio.CancelledError:
            if self.error is not None:
                raise self.error from None
            raise
        if self.error is not None:  # the server saw a short, valid stream
            raise self.error


class CapturingIterator(RequestError, Generic[R]):
    """A request iterator that keeps the exception raised while building requests."""

    def __init__(self, inner: Iterator[R]) -> None:
        self._inner = inner

    def __iter__(self) -> Self:
        return self

    def __next__(self) -> R:
        try:
            return next(self._inner)
        except StopIteration:
            raise
        except BaseException as exc:
            self.error = exc
            raise


async def aiter_batches(batches: Iterable[Any] | AsyncIterable[Any]) -> AsyncIterator[Any]:
    """Sync or async batches, drawn the same way."""
    if isinstance(batches, AsyncIterable):
        async for batch in batches:
            yield batch
    else:
        for batch in batches:
            yield batch


class AsyncRequests(RequestError, Generic[R]):
    """Requests built from sync or async batches, keeping the exception that stopped them."""

    def __init__(self, batches: Iterable[Any] | AsyncIterable[Any], build: Any) -> None:
        self._batches = batches
        self._build = build

    async def __aiter__(self) -> AsyncIterator[R]:
        try:
            async for batch in aiter_batches(self._batches):
                yield self._build(batch)
        except Exception as exc:
            self.error = exc
            raise
