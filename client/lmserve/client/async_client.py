"""The asyncio client of the lmserve.v1 LanguageModelService: `LmServeClient`'s methods, to be
awaited (or iterated with `async for`), built on `grpc.aio`. Shares its request building,
error mapping and health naming with the sync client (`_calls.py`, `_requests.py`).
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self, Unpack

import grpc
import grpc.aio

from lmserve.client import _health
from lmserve.client import _requests as req
from lmserve.client._calls import (
    DEFAULT_TARGET,
    DEFAULT_TIMEOUT,
    AsyncRequests,
    RerankOptions,
    health_from_model,
    health_service,
    rpc_errors,
    score_calls,
    scores,
)
from lmserve.client._channel import ChannelPlan, Targets
from lmserve.client.complete import AsyncCompletionSession
from lmserve.client.errors import ModelNotFoundError, from_rpc_error
from lmserve.client.fuse import AsyncFuseSession
from lmserve.client.lattices import (
    LatticeOptions,
    LatticeText,
    RescoredLattices,
    lattice_request,
)
from lmserve.client.rerank_types import RerankedLists
from lmserve.client.types import (
    BeamHypothesis,
    GenerationEvent,
    HealthStatus,
    ModelInfo,
    PerplexityStats,
    TextScore,
)
from lmserve.v1 import lm_service_pb2 as pb
from lmserve.v1 import lm_service_pb2_grpc


class AsyncLmServeClient:
    """asyncio client with the same methods as LmServeClient, to be awaited.

    >>> async with AsyncLmServeClient("localhost:50051") as client:
    ...     stats = await client.perplexity("kjv-5gram", ["and god said"])
    """

    def __init__(
        self,
        target: Targets = DEFAULT_TARGET,
        *,
        timeout: float | None = DEFAULT_TIMEOUT,
        tls_ca_file: str | Path | None = None,
        tls_cert_file: str | Path | None = None,
        tls_key_file: str | Path | None = None,
        token: str | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        """The arguments of `LmServeClient` (targets, TLS, token, timeout)."""
        plan = ChannelPlan.build(
            target,
            options=[*req.CHANNEL_OPTIONS, *options],
            credentials=credentials,
            tls_ca_file=tls_ca_file,
            tls_cert_file=tls_cert_file,
            tls_key_file=tls_key_file,
            token=token,
        )
        self.target = plan.target
        self.timeout = timeout
        self._channel = plan.async_channel()
        self._stub = lm_service_pb2_grpc.LanguageModelServiceStub(self._channel)
        self._health_check = self._channel.unary_unary(
            _health.CHECK_METHOD,
            request_serializer=_health.encode_check,
            response_deserializer=_health.decode_status,
        )
        self._score, self._score_stream = score_calls(self._channel)

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
        with rpc_errors():
            resp = await self._stub.ListModels(pb.ListModelsRequest(), timeout=self._t(timeout))
        return [ModelInfo.from_proto(m) for m in resp.models]

    async def get_model(self, model: str, *, timeout: float | None = None) -> ModelInfo:
        with rpc_errors():
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
        bias: req.Bias | None = None,
        bias_boost: float | None = None,
        timeout: float | None = None,
    ) -> list[TextScore]:
        bias_message = req.bias_list(bias, bias_boost)
        request = req.score_request(model, inputs, bos, eos, return_tokens, bias_message)
        with rpc_errors():
            resp = await self._score(request, timeout=self._t(timeout))
        return scores(resp, return_tokens, bias_message is not None)

    async def score_stream(
        self,
        model: str,
        batches: Iterable[req.Inputs] | AsyncIterable[req.Inputs],
        *,
        bos: bool = True,
        eos: bool = True,
        return_tokens: bool = False,
        bias: req.Bias | None = None,
        bias_boost: float | None = None,
        timeout: float | None = None,
    ) -> AsyncIterator[list[TextScore]]:
        """As `LmServeClient.score_stream`, from sync or async batches:
        `async for scores in client.score_stream(model, batches)`."""
        bias_message = req.bias_list(bias, bias_boost)  # sent once: the stream keeps it
        counter = iter(range(1 << 62))

        def request(batch: req.Inputs) -> pb.ScoreRequest:
            first = next(counter) == 0
            bias_field = bias_message if first else None
            return req.score_request(model, batch, bos, eos, return_tokens, bias_field)

        requests: AsyncRequests[pb.ScoreRequest] = AsyncRequests(batches, request)
        call = self._score_stream(requests.__aiter__(), timeout=self._t(timeout))
        try:
            with requests.errors():
                async for resp in call:
                    yield scores(resp, return_tokens, bias_message is not None)
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
        with rpc_errors():
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
        requests: AsyncRequests[pb.CorpusPerplexityRequest] = AsyncRequests(
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
            with rpc_errors():
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
        with rpc_errors():
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
        bias: req.Bias | None = None,
        bias_boost: float | None = None,
        timeout: float | None = None,
    ) -> RerankedLists:
        """As `LmServeClient.rerank`."""
        opts = RerankOptions(
            model,
            score_weights=score_weights,
            lm_weight=lm_weight,
            length_bonus=length_bonus,
            length_unit=length_unit,
            bos=bos,
            eos=eos,
            bias=bias,
            bias_boost=bias_boost,
        )
        request = opts.request(lists)
        with rpc_errors():
            resp = await self._stub.Rerank(request, timeout=self._t(timeout))
        return RerankedLists.from_proto(resp)

    async def rescore_lattice(
        self,
        model: str,
        lattices: Sequence[LatticeText],
        *,
        timeout: float | None = None,
        **options: Unpack[LatticeOptions],
    ) -> RescoredLattices:
        """As `LmServeClient.rescore_lattice`."""
        request = lattice_request(model, lattices, **options)
        with rpc_errors():
            resp = await self._stub.RescoreLattice(request, timeout=self._t(timeout))
        return RescoredLattices.from_proto(resp)

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
        bias: req.Bias | None = None,
        bias_boost: float | None = None,
        timeout: float | None = None,
    ) -> AsyncIterator[RerankedLists]:
        """As `LmServeClient.rerank_stream`, from sync or async batches."""
        opts = RerankOptions(
            model,
            score_weights=score_weights,
            lm_weight=lm_weight,
            length_bonus=length_bonus,
            length_unit=length_unit,
            bos=bos,
            eos=eos,
            bias=bias,
            bias_boost=bias_boost,
        )
        counter = iter(range(1 << 62))
        requests: AsyncRequests[pb.RerankRequest] = AsyncRequests(
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
        self,
        model: str,
        *,
        k: int = 3,
        session_id: str | None = None,
        user_words: Sequence[str] | None = None,
        cache_weight: float | None = None,
    ) -> AsyncCompletionSession:
        """As `LmServeClient.complete`: `async with client.complete(model) as session`."""
        return AsyncCompletionSession(
            self._stub.Complete,
            model,
            k=k,
            session_id=session_id,
            user_words=user_words,
            cache_weight=cache_weight,
        )

    def fuse(self, model: str, *, bos: bool = True) -> AsyncFuseSession:
        """As `LmServeClient.fuse`: `async with client.fuse(model) as lm`."""
        return AsyncFuseSession(self._stub.Fuse, model, bos=bos)

    async def health(
        self, model: str | None = None, *, timeout: float | None = None
    ) -> HealthStatus:
        service = health_service(model)
        try:
            status = await self._health_check(service, timeout=self._t(timeout))
        except grpc.RpcError as exc:
            err = from_rpc_error(exc)
            if model and isinstance(err, ModelNotFoundError):
                return health_from_model(await self.get_model(model, timeout=timeout))
            raise err from None
        return HealthStatus(service, _health.HEALTH_NAMES.get(status, "UNKNOWN"))

    @property
    def stub(self) -> lm_service_pb2_grpc.LanguageModelServiceStub:
        return self._stub


__all__ = ["AsyncLmServeClient"]
