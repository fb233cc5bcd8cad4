"""Sync and asyncio clients for the lmserve.v1 LanguageModelService.

Both are thin: one request message per call, results converted once into the frozen dataclasses
of `types.py`, failures raised as the exceptions of `errors.py`. Log-probabilities are nats.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from types import TracebackType
from typing import Any, Generic, Self, TypeVar

import grpc
import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lmserve.client import _requests as req
from lmserve.client import _wire
from lmserve.client.complete import AsyncCompletionSession, CompletionSession
from lmserve.client.errors import LmServeClientError, ModelNotFoundError, from_rpc_error
from lmserve.client.types import (
    BeamHypothesis,
    GenerationEvent,
    HealthStatus,
    ModelInfo,
    NBestInputError,
    PerplexityStats,
    RerankedLists,
    TextScore,
)
from lmserve.v1 import lm_service_pb2 as pb
from lmserve.v1 import lm_service_pb2_grpc

R = TypeVar("R")

DEFAULT_TARGET = req.DEFAULT_TARGET
DEFAULT_TIMEOUT = 30.0

_HEALTH_NAMES = {v: k for k, v in health_pb2.HealthCheckResponse.ServingStatus.items()}
# The server publishes one health entry per model under this prefix: "<service>/<model>".
SERVICE_NAME = "lmserve.v1.LanguageModelService"


def health_service(model: str | None) -> str:
    """The health-service name to check: "" for the whole server, else the model's entry."""
    return f"{SERVICE_NAME}/{model}" if model else ""


class _RerankOptions:
    """The weights and options of a rerank call, shared by its requests (one per batch)."""

    def __init__(self, model: str, **options: Any) -> None:
        self.model = model
        self.options = options

    def request(self, lists: req.NBestLists) -> pb.RerankRequest:
        return req.rerank_request(self.model, lists, **self.options)

    def stream_request(self, index: int, lists: req.NBestLists) -> pb.RerankRequest:
        """A batch's request; a bad batch's error names it as the server would:
        `requests[2].lists[0].hypotheses[1]: ...`."""
        try:
            return self.request(lists)
        except NBestInputError as exc:
            raise NBestInputError(f"requests[{index}].{exc.field}", exc.problem) from None


def _health_from_model(info: ModelInfo) -> HealthStatus:
    return HealthStatus(health_service(info.name), "SERVING" if info.ready else "NOT_SERVING")


def _score_calls(channel: Any) -> tuple[Any, Any]:
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


def _scores(resp: _wire.ScoreReply, with_tokens: bool) -> list[TextScore]:
    if isinstance(resp, list):  # totals, read from the wire bytes (`_wire`)
        return resp
    if with_tokens:
        return [TextScore.from_proto(r, True) for r in resp.results]
    # The common rescoring path: totals only, no per-token work.
    totals = TextScore.totals
    return [totals(r.log_prob, r.token_count, r.oov_count) for r in resp.results]


@contextlib.contextmanager
def _rpc_errors() -> Iterator[None]:
    """A failed call's RpcError raised as the client exception of its status code."""
    try:
        yield
    except grpc.RpcError as exc:
        raise from_rpc_error(exc) from None


class _RequestError:
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


class _CapturingIterator(_RequestError, Generic[R]):
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


class LmServeClient:
    """Blocking client. One channel per client; thread-safe (gRPC channels are).

    >>> with LmServeClient("localhost:50051") as client:
    ...     [s] = client.score("kjv-5gram", ["in the beginning god created"])
    ...     s.log_prob, s.token_count
    """

    def __init__(
        self,
        target: str = DEFAULT_TARGET,
        *,
        timeout: float | None = DEFAULT_TIMEOUT,
        credentials: grpc.ChannelCredentials | None = None,
        options: Sequence[tuple[str, Any]] = (),
        channel: grpc.Channel | None = None,
    ) -> None:
        """`timeout` is the default deadline of each call in seconds (None: no deadline); each
        method takes its own `timeout` too. Pass `channel` to reuse one you built."""
        self.target = target
        self.timeout = timeout
        opts = [*req.CHANNEL_OPTIONS, *options]
        if channel is not None:
            self._channel = channel
        elif credentials is not None:
            self._channel = grpc.secure_channel(target, credentials, options=opts)
        else:
            self._channel = grpc.insecure_channel(target, options=opts)
        self._stub = lm_service_pb2_grpc.LanguageModelServiceStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)
        self._score, self._score_stream = _score_calls(self._channel)

    # -- lifecycle ------------------------------------------------------------------------------
    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def wait_for_ready(self, timeout: float = 10.0) -> None:
        """Blocks until the channel connects; UnavailableError after `timeout` seconds."""
        try:
            grpc.channel_ready_future(self._channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            from lmserve.client.errors import UnavailableError

            raise UnavailableError(
                grpc.StatusCode.UNAVAILABLE, f"no server at {self.target} after {timeout}s"
            ) from None

    def _t(self, timeout: float | None) -> float | None:
        return self.timeout if timeout is None else timeout

    # -- models ---------------------------------------------------------------------------------
    def list_models(self, *, timeout: float | None = None) -> list[ModelInfo]:
        """Every model of the server's repository, failed ones included, sorted by name."""
        with _rpc_errors():
            resp = self._stub.ListModels(pb.ListModelsRequest(), timeout=self._t(timeout))
        return [ModelInfo.from_proto(m) for m in resp.models]

    def get_model(self, model: str, *, timeout: float | None = None) -> ModelInfo:
        """One model's description; ModelNotFoundError if the server has none of that name."""
        with _rpc_errors():
            resp = self._stub.GetModel(pb.GetModelRequest(model=model), timeout=self._t(timeout))
        return ModelInfo.from_proto(resp.model)

    # -- scoring --------------------------------------------------------------------------------
    def score(
        self,
        model: str,
        inputs: req.Inputs,
        *,
        bos: bool = True,
        eos: bool = True,
        return_tokens: bool = False,
        timeout: float | None = None,
    ) -> list[TextScore]:
        """Scores texts (strings) or token lists; one TextScore per input, in order.

        Log-probabilities are nats; `</s>` is scored and counted when `eos` is on."""
        request = req.score_request(model, inputs, bos, eos, return_tokens)
        with _rpc_errors():
            resp = self._score(request, timeout=self._t(timeout))
        return _scores(resp, return_tokens)

    def score_stream(
        self,
        model: str,
        batches: Iterable[req.Inputs],
        *,
        bos: bool = True,
        eos: bool = True,
        return_tokens: bool = False,
        timeout: float | None = None,
    ) -> Iterator[list[TextScore]]:
        """Scores many batches on one ScoreStream call: yields each batch's TextScores, in the
        order of `batches`, as the server answers them.

        Batches are sent as they are drawn from `batches` (lazily, in gRPC's own thread) while
        earlier answers travel back, so the round trip per batch that `score` waits for is
        overlapped: the fast way to score a big corpus from one client. `timeout` bounds the
        whole stream. Leaving the iteration early cancels the call. A bad batch raises its
        error (the message names its index, e.g. `requests[3].texts[5]: ...`) after the
        answers to the batches before it were yielded."""
        requests = _CapturingIterator(
            req.score_request(model, batch, bos, eos, return_tokens) for batch in batches
        )
        call = self._score_stream(requests, timeout=self._t(timeout))
        try:
            with requests.errors():
                for resp in call:
                    yield _scores(resp, return_tokens)
        finally:
            call.cancel()  # a no-op when the stream already ended

    def perplexity(
        self,
        model: str,
        inputs: req.Inputs,
        *,
        bos: bool = True,
        eos: bool = True,
        timeout: float | None = None,
    ) -> PerplexityStats:
        """Perplexity of a batch of texts taken together."""
        request = req.perplexity_request(model, inputs, bos, eos)
        with _rpc_errors():
            resp = self._stub.Perplexity(request, timeout=self._t(timeout))
        return PerplexityStats.from_proto(resp.stats)

    def corpus_perplexity(
        self,
        model: str,
        batches: Iterable[req.Inputs],
        *,
        bos: bool = True,
        eos: bool = True,
        timeout: float | None = None,
    ) -> PerplexityStats:
        """Perplexity of a corpus streamed as batches (e.g. 1000 lines each); one answer at the
        end. The batches are consumed lazily, so a file need not fit in memory."""
        requests = _CapturingIterator(req.corpus_requests(model, batches, bos, eos))
        with requests.errors():
            resp = self._stub.CorpusPerplexity(requests, timeout=self._t(timeout))
        return PerplexityStats.from_proto(resp.stats)

    # -- generation -----------------------------------------------------------------------------
    def generate(
        self,
        model: str,
        prompt: str | Sequence[int] = "",
        *,
        max_new_tokens: int = 20,
        timeout: float | None = None,
        **options: Any,
    ) -> Iterator[GenerationEvent]:
        """Streams a generation: a GeneratedToken per token as it is produced, then one
        GenerationFinished per sample. `prompt` is text (the model's tokenizer) or token ids;
        `options` are the fields of `_requests.generate_request` (temperature, top_k, top_p,
        min_p, typical_p, penalties, seed, stop, stop_token_ids, n, logprobs, top_logprobs...).
        Leaving the iteration early cancels the call, and the server stops computing it."""
        request = req.generate_request(model, prompt, max_new_tokens=max_new_tokens, **options)
        call = self._stub.Generate(request, timeout=self._t(timeout))
        try:
            with _rpc_errors():
                for resp in call:
                    yield from req.generation_events(resp)
        finally:
            call.cancel()  # a no-op when the stream already ended

    def beam_search(
        self,
        model: str,
        prompt: str | Sequence[int] = "",
        *,
        beam_width: int = 4,
        max_length: int = 20,
        timeout: float | None = None,
        **options: Any,
    ) -> list[BeamHypothesis]:
        """The n best continuations by beam search, best first (`options`: num_return,
        length_penalty `none`/`gnmt`/`average`, length_penalty_alpha, min_length,
        early_stopping, no_repeat_ngram_size, stop_token_ids)."""
        request = req.beam_search_request(
            model, prompt, beam_width=beam_width, max_length=max_length, **options
        )
        with _rpc_errors():
            resp = self._stub.BeamSearch(request, timeout=self._t(timeout))
        return [BeamHypothesis.from_proto(h) for h in resp.hypotheses]

    # -- reranking ------------------------------------------------------------------------------
    def rerank(
        self,
        model: str,
        lists: req.NBestLists,
        *,
        score_weights: Mapping[str, float] | None = None,
        lm_weight: float = 1.0,
        length_bonus: float = 0.0,
        length_unit: str = "words",
        bos: bool = True,
        eos: bool = True,
        timeout: float | None = None,
    ) -> RerankedLists:
        """Reranks n-best lists (NBestList or `{"id", "hypotheses": [{"text", "scores"}]}`
        dicts): one RerankedList per list, in order, hypotheses best first by
        `sum_k score_weights.get(k, 1) * scores[k] + lm_weight * lm_log_prob
        + length_bonus * length`, `length` in `length_unit` (`words`, `tokens`, `characters`).
        The result also carries `request_tokens` and `computed_tokens`. Malformed lists raise
        NBestInputError before any call; the server's refusals raise the client's errors."""
        opts = _RerankOptions(
            model,
            score_weights=score_weights,
            lm_weight=lm_weight,
            length_bonus=length_bonus,
            length_unit=length_unit,
            bos=bos,
            eos=eos,
        )
        request = opts.request(lists)
        with _rpc_errors():
            resp = self._stub.Rerank(request, timeout=self._t(timeout))
        return RerankedLists.from_proto(resp)

    def rerank_stream(
        self,
        model: str,
        batches: Iterable[req.NBestLists],
        *,
        score_weights: Mapping[str, float] | None = None,
        lm_weight: float = 1.0,
        length_bonus: float = 0.0,
        length_unit: str = "words",
        bos: bool = True,
        eos: bool = True,
        timeout: float | None = None,
    ) -> Iterator[RerankedLists]:
        """`rerank` for many batches of lists on one RerankStream call, as `score_stream` does
        for Score: batches are sent as they are drawn while earlier answers come back, and each
        batch's answer is yielded in order. A bad batch raises its error, named
        `requests[i]....`, after the answers before it."""
        opts = _RerankOptions(
            model,
            score_weights=score_weights,
            lm_weight=lm_weight,
            length_bonus=length_bonus,
            length_unit=length_unit,
            bos=bos,
            eos=eos,
        )
        requests = _CapturingIterator(
            opts.stream_request(i, batch) for i, batch in enumerate(batches)
        )
        call = self._stub.RerankStream(requests, timeout=self._t(timeout))
        try:
            with requests.errors():
                for resp in call:
                    yield RerankedLists.from_proto(resp)
        finally:
            call.cancel()
    # -- autocomplete ---------------------------------------------------------------------------
    def complete(
        self, model: str, *, k: int = 3, session_id: str | None = None
    ) -> CompletionSession:
        """An autocomplete session on one Complete stream: `type`, `backspace`, `accept`...
        each answer the `k` most probable next words. `session_id` continues a session the
        server holds. Use it as a context manager (or `close()` it)."""
        return CompletionSession(self._stub.Complete, model, k=k, session_id=session_id)

    # -- health ---------------------------------------------------------------------------------
    def health(self, model: str | None = None, *, timeout: float | None = None) -> HealthStatus:
        """The standard gRPC health check of the server ("" service) or of one model
        (`lmserve.v1.LanguageModelService/<model>`).

        For a model the health service does not know, the model's state from GetModel answers
        instead (ModelNotFoundError if the server has no such model)."""
        service = health_service(model)
        try:
            resp = self._health.Check(
                health_pb2.HealthCheckRequest(service=service), timeout=self._t(timeout)
            )
        except grpc.RpcError as exc:
            err = from_rpc_error(exc)
            if model and isinstance(err, ModelNotFoundError):
                return _health_from_model(self.get_model(model, timeout=timeout))
            raise err from None
        return HealthStatus(service, _HEALTH_NAMES.get(resp.status, "UNKNOWN"))

    @property
    def stub(self) -> lm_service_pb2_grpc.LanguageModelServiceStub:
        """The raw generated stub, for the RPCs this client does not wrap."""
        return self._stub


async def _aiter(batches: Iterable[Any] | AsyncIterable[Any]) -> AsyncIterator[Any]:
    if isinstance(batches, AsyncIterable):
        async for batch in batches:
            yield batch
    else:
        for batch in batches:
            yield batch


class _AsyncRequests(_RequestError, Generic[R]):
    """Requests built from sync or async batches, keeping the exception that stopped them."""

    def __init__(self, batches: Iterable[Any] | AsyncIterable[Any], build: Any) -> None:
        self._batches = batches
        self._build = build

    async def __aiter__(self) -> AsyncIterator[R]:
        try:
            async for batch in _aiter(self._batches):
                yield self._build(batch)
        except Exception as exc:
            self.error = exc
            raise


class AsyncLmServeClient:
    """asyncio client with the same methods as LmServeClient, to be awaited.

    >>> async with AsyncLmServeClient("localhost:50051") as client:
    ...     stats = await client.perplexity("kjv-5gram", ["and god said"])
    """

    def __init__(
        self,
        target: str = DEFAULT_TARGET,
        *,
        timeout: float | None = DEFAULT_TIMEOUT,
        credentials: grpc.ChannelCredentials | None = None,
        options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        self.target = target
        self.timeout = timeout
        opts = [*req.CHANNEL_OPTIONS, *options]
        if credentials is not None:
            self._channel = grpc.aio.secure_channel(target, credentials, options=opts)
        else:
            self._channel = grpc.aio.insecure_channel(target, options=opts)
        self._stub = lm_service_pb2_grpc.LanguageModelServiceStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)
        self._score, self._score_stream = _score_calls(self._channel)

    async def close(self) -> None:
        await self._channel.close(grace=None)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def _t(self, timeout: float | None) -> float | None:
        return self.timeout if timeout is None else timeout

    async def list_models(self, *, timeout: float | None = None) -> list[ModelInfo]:
        with _rpc_errors():
            resp = await self._stub.ListModels(pb.ListModelsRequest(), timeout=self._t(timeout))
        return [ModelInfo.from_proto(m) for m in resp.models]

    async def get_model(self, model: str, *, timeout: float | None = None) -> ModelInfo:
        with _rpc_errors():
            resp = await self._stub.GetModel(
                pb.GetModelRequest(model=model), timeout=self._t(timeout)
            )
        return ModelInfo.from_proto(resp.model)

    async def score(
        self,
        model: str,
        inputs: req.Inputs,
        *,
        bos: bool = True,
        eos: bool = True,
        return_tokens: bool = False,
        timeout: float | None = None,
    ) -> list[TextScore]:
        request = req.score_request(model, inputs, bos, eos, return_tokens)
        with _rpc_errors():
            resp = await self._score(request, timeout=self._t(timeout))
        return _scores(resp, return_tokens)

    async def score_stream(
        self,
        model: str,
        batches: Iterable[req.Inputs] | AsyncIterable[req.Inputs],
        *,
        bos: bool = True,
        eos: bool = True,
        return_tokens: bool = False,
        timeout: float | None = None,
    ) -> AsyncIterator[list[TextScore]]:
        """As `LmServeClient.score_stream`, from sync or async batches:
        `async for scores in client.score_stream(model, batches)`."""
        requests: _AsyncRequests[pb.ScoreRequest] = _AsyncRequests(
            batches, lambda batch: req.score_request(model, batch, bos, eos, return_tokens)
        )
        call = self._score_stream(requests.__aiter__(), timeout=self._t(timeout))
        try:
            with requests.errors():
                async for resp in call:
                    yield _scores(resp, return_tokens)
        finally:
            call.cancel()

    async def perplexity(
        self,
        model: str,
        inputs: req.Inputs,
        *,
        bos: bool = True,
        eos: bool = True,
        timeout: float | None = None,
    ) -> PerplexityStats:
        request = req.perplexity_request(model, inputs, bos, eos)
        with _rpc_errors():
            resp = await self._stub.Perplexity(request, timeout=self._t(timeout))
        return PerplexityStats.from_proto(resp.stats)

    async def corpus_perplexity(
        self,
        model: str,
        batches: Iterable[req.Inputs] | AsyncIterable[req.Inputs],
        *,
        bos: bool = True,
        eos: bool = True,
        timeout: float | None = None,
    ) -> PerplexityStats:
        """Streams sync or async batches; one answer at the end."""
        requests: _AsyncRequests[pb.CorpusPerplexityRequest] = _AsyncRequests(
            batches, lambda batch: req.corpus_request(model, batch, bos, eos)
        )
        with requests.errors():
            resp = await self._stub.CorpusPerplexity(requests.__aiter__(), timeout=self._t(timeout))
        return PerplexityStats.from_proto(resp.stats)

    async def generate(
        self,
        model: str,
        prompt: str | Sequence[int] = "",
        *,
        max_new_tokens: int = 20,
        timeout: float | None = None,
        **options: Any,
    ) -> AsyncIterator[GenerationEvent]:
        """As `LmServeClient.generate`: `async for event in client.generate(...)`."""
        request = req.generate_request(model, prompt, max_new_tokens=max_new_tokens, **options)
        call = self._stub.Generate(request, timeout=self._t(timeout))
        try:
            with _rpc_errors():
                async for resp in call:
                    for event in req.generation_events(resp):
                        yield event
        finally:
            call.cancel()

    async def beam_search(
        self,
        model: str,
        prompt: str | Sequence[int] = "",
        *,
        beam_width: int = 4,
        max_length: int = 20,
        timeout: float | None = None,
        **options: Any,
    ) -> list[BeamHypothesis]:
        request = req.beam_search_request(
            model, prompt, beam_width=beam_width, max_length=max_length, **options
        )
        with _rpc_errors():
            resp = await self._stub.BeamSearch(request, timeout=self._t(timeout))
        return [BeamHypothesis.from_proto(h) for h in resp.hypotheses]

    async def rerank(
        self,
        model: str,
        lists: req.NBestLists,
        *,
        score_weights: Mapping[str, float] | None = None,
        lm_weight: float = 1.0,
        length_bonus: float = 0.0,
        length_unit: str = "words",
        bos: bool = True,
        eos: bool = True,
        timeout: float | None = None,
    ) -> RerankedLists:
        """As `LmServeClient.rerank`."""
        opts = _RerankOptions(
            model,
            score_weights=score_weights,
            lm_weight=lm_weight,
            length_bonus=length_bonus,
            length_unit=length_unit,
            bos=bos,
            eos=eos,
        )
        request = opts.request(lists)
        with _rpc_errors():
            resp = await self._stub.Rerank(request, timeout=self._t(timeout))
        return RerankedLists.from_proto(resp)

    async def rerank_stream(
        self,
        model: str,
        batches: Iterable[req.NBestLists] | AsyncIterable[req.NBestLists],
        *,
        score_weights: Mapping[str, float] | None = None,
        lm_weight: float = 1.0,
        length_bonus: float = 0.0,
        length_unit: str = "words",
        bos: bool = True,
        eos: bool = True,
        timeout: float | None = None,
    ) -> AsyncIterator[RerankedLists]:
        """As `LmServeClient.rerank_stream`, from sync or async batches."""
        opts = _RerankOptions(
            model,
            score_weights=score_weights,
            lm_weight=lm_weight,
            length_bonus=length_bonus,
            length_unit=length_unit,
            bos=bos,
            eos=eos,
        )
        counter = iter(range(1 << 62))
        requests: _AsyncRequests[pb.RerankRequest] = _AsyncRequests(
            batches, lambda batch: opts.stream_request(next(counter), batch)
        )
        call = self._stub.RerankStream(requests.__aiter__(), timeout=self._t(timeout))
        try:
            with requests.errors():
                async for resp in call:
                    yield RerankedLists.from_proto(resp)
        finally:
            call.cancel()
    def complete(
        self, model: str, *, k: int = 3, session_id: str | None = None
    ) -> AsyncCompletionSession:
        """As `LmServeClient.complete`: `async with client.complete(model) as session`."""
        return AsyncCompletionSession(self._stub.Complete, model, k=k, session_id=session_id)

    async def health(
        self, model: str | None = None, *, timeout: float | None = None
    ) -> HealthStatus:
        service = health_service(model)
        try:
            resp = await self._health.Check(
                health_pb2.HealthCheckRequest(service=service), timeout=self._t(timeout)
            )
        except grpc.RpcError as exc:
            err = from_rpc_error(exc)
            if model and isinstance(err, ModelNotFoundError):
                return _health_from_model(await self.get_model(model, timeout=timeout))
            raise err from None
        return HealthStatus(service, _HEALTH_NAMES.get(resp.status, "UNKNOWN"))

    @property
    def stub(self) -> lm_service_pb2_grpc.LanguageModelServiceStub:
        return self._stub


__all__ = ["AsyncLmServeClient", "LmServeClient", "LmServeClientError"]
