"""The blocking client of the lmserve.v1 LanguageModelService (`AsyncLmServeClient`, re-exported
here, is its asyncio twin in `async_client.py`).

Thin: one request message per call, results converted once into the frozen dataclasses of
`types.py`, failures raised as the exceptions of `errors.py`. Log-probabilities are nats.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self, Unpack

import grpc

from lmserve.client import _health
from lmserve.client import _requests as req
from lmserve.client._calls import (
    DEFAULT_TARGET,
    DEFAULT_TIMEOUT,
    SERVICE_NAME,
    CapturingIterator,
    RerankOptions,
    health_from_model,
    health_service,
    rpc_errors,
    score_calls,
)
from lmserve.client._calls import scores as _scores
from lmserve.client._channel import ChannelPlan, Targets
from lmserve.client.async_client import AsyncLmServeClient
from lmserve.client.complete import CompletionSession
from lmserve.client.errors import LmServeClientError, ModelNotFoundError, from_rpc_error
from lmserve.client.fuse import FuseSession
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


class LmServeClient:
    """Blocking client. One channel per client; thread-safe (gRPC channels are).

    >>> with LmServeClient("localhost:50051") as client:
    ...     [s] = client.score("kjv-5gram", ["in the beginning god created"])
    ...     s.log_prob, s.token_count
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
        channel: grpc.Channel | None = None,
    ) -> None:
        """`target`: "host:port", a list of them, or "dns:///name:port" (several servers:
        round-robin, idempotent unary calls retried on UNAVAILABLE). `tls_ca_file` (or a client
        certificate and key, for mTLS) makes the channel TLS; `token` is sent as a bearer token.
        `timeout` is the default deadline of each call in seconds (None: no deadline); each
        method takes its own `timeout` too. Pass `channel` to reuse one you built."""
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
        self._channel = channel if channel is not None else plan.sync_channel()
        self._stub = lm_service_pb2_grpc.LanguageModelServiceStub(self._channel)
        self._health_check = self._channel.unary_unary(
            _health.CHECK_METHOD,
            request_serializer=_health.encode_check,
            response_deserializer=_health.decode_status,
        )
        self._score, self._score_stream = score_calls(self._channel)

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
        with rpc_errors():
            resp = self._stub.ListModels(pb.ListModelsRequest(), timeout=self._t(timeout))
        return [ModelInfo.from_proto(m) for m in resp.models]

    def get_model(self, model: str, *, timeout: float | None = None) -> ModelInfo:
        """One model's description; ModelNotFoundError if the server has none of that name."""
        with rpc_errors():
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
        bias: req.Bias | None = None,
        bias_boost: float | None = None,
        timeout: float | None = None,
    ) -> list[TextScore]:
        """Scores texts (strings) or token lists; one TextScore per input, in order.

        Log-probabilities are nats; `</s>` is scored and counted when `eos` is on."""
        bias_message = req.bias_list(bias, bias_boost)
        request = req.score_request(model, inputs, bos, eos, return_tokens, bias_message)
        with rpc_errors():
            resp = self._score(request, timeout=self._t(timeout))
        return _scores(resp, return_tokens, bias_message is not None)

    def score_stream(
        self,
        model: str,
        batches: Iterable[req.Inputs],
        *,
        bos: bool = True,
        eos: bool = True,
        return_tokens: bool = False,
        bias: req.Bias | None = None,
        bias_boost: float | None = None,
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
        bias_message = req.bias_list(bias, bias_boost)  # sent once: the stream keeps it
        requests = CapturingIterator(
            req.score_request(
                model, batch, bos, eos, return_tokens, bias_message if i == 0 else None
            )
            for i, batch in enumerate(batches)
        )
        call = self._score_stream(requests, timeout=self._t(timeout))
        try:
            with requests.errors():
                for resp in call:
                    yield _scores(resp, return_tokens, bias_message is not None)
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
        with rpc_errors():
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
        requests = CapturingIterator(req.corpus_requests(model, batches, bos, eos))
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
            with rpc_errors():
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
        with rpc_errors():
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
        bias: req.Bias | None = None,
        bias_boost: float | None = None,
        timeout: float | None = None,
    ) -> RerankedLists:
        """Reranks n-best lists (NBestList or `{"id", "hypotheses": [{"text", "scores"}]}`
        dicts): one RerankedList per list, in order, hypotheses best first by
        `sum_k score_weights.get(k, 1) * scores[k] + lm_weight * lm_log_prob
        + length_bonus * length`, `length` in `length_unit` (`words`, `tokens`, `characters`).
        The result also carries `request_tokens` and `computed_tokens`. Malformed lists raise
        NBestInputError before any call; the server's refusals raise the client's errors."""
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
            resp = self._stub.Rerank(request, timeout=self._t(timeout))
        return RerankedLists.from_proto(resp)

    def rescore_lattice(
        self,
        model: str,
        lattices: Sequence[LatticeText],
        *,
        timeout: float | None = None,
        **options: Unpack[LatticeOptions],
    ) -> RescoredLattices:
        """Rescores word lattices (`LatticeText`: HTK SLF or Kaldi text) with the model: per
        lattice its `nbest` best paths by `acoustic_scale * acoustic + lm_weight * lm_log_prob
        + old_lm_weight * old_lm + word_insertion_penalty * words (+ bias)`, nats; with
        `return_lattice` the rescored lattice in its format. `words` is Kaldi's words.txt for
        lattices whose labels are ids; `max_history` merges a neural model's histories (the
        server's default when None), `beam` prunes. `bias` maps phrases to boosts."""
        request = lattice_request(model, lattices, **options)
        with rpc_errors():
            resp = self._stub.RescoreLattice(request, timeout=self._t(timeout))
        return RescoredLattices.from_proto(resp)

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
        bias: req.Bias | None = None,
        bias_boost: float | None = None,
        timeout: float | None = None,
    ) -> Iterator[RerankedLists]:
        """`rerank` for many batches of lists on one RerankStream call, as `score_stream` does
        for Score: batches are sent as they are drawn while earlier answers come back, and each
        batch's answer is yielded in order. A bad batch raises its error, named
        `requests[i]....`, after the answers before it."""
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
        requests = CapturingIterator(
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
        self,
        model: str,
        *,
        k: int = 3,
        session_id: str | None = None,
        user_words: Sequence[str] | None = None,
        cache_weight: float | None = None,
    ) -> CompletionSession:
        """An autocomplete session on one Complete stream: `type`, `backspace`, `accept`...
        each answer the `k` most probable next words. `session_id` continues a session the
        server holds. Use it as a context manager (or `close()` it).

        On a word-level model the session adapts to its own words (a cache of its sentences,
        one per `reset`, mixed with the model): `user_words` are offered even when the model
        does not know them; `cache_weight` sets the mixture's weight (0: off)."""
        return CompletionSession(
            self._stub.Complete,
            model,
            k=k,
            session_id=session_id,
            user_words=user_words,
            cache_weight=cache_weight,
        )

    # -- shallow fusion -------------------------------------------------------------------------
    def fuse(self, model: str, *, bos: bool = True) -> FuseSession:
        """A beam search's language model on one Fuse stream: `step(extend=..., drop=...)`
        per frame, each hypothesis an id whose model state the server keeps (`bos` False: the
        root reads nothing, not `<s>`). Use it as a context manager (or `close()` it)."""
        return FuseSession(self._stub.Fuse, model, bos=bos)

    # -- health ---------------------------------------------------------------------------------
    def health(self, model: str | None = None, *, timeout: float | None = None) -> HealthStatus:
        """The standard gRPC health check of the server ("" service) or of one model
        (`lmserve.v1.LanguageModelService/<model>`).

        For a model the health service does not know, the model's state from GetModel answers
        instead (ModelNotFoundError if the server has no such model)."""
        service = health_service(model)
        try:
            status = self._health_check(service, timeout=self._t(timeout))
        except grpc.RpcError as exc:
            err = from_rpc_error(exc)
            if model and isinstance(err, ModelNotFoundError):
                return health_from_model(self.get_model(model, timeout=timeout))
            raise err from None
        return HealthStatus(service, _health.HEALTH_NAMES.get(status, "UNKNOWN"))

    @property
    def stub(self) -> lm_service_pb2_grpc.LanguageModelServiceStub:
        """The raw generated stub, for the RPCs this client does not wrap."""
        return self._stub


__all__ = [
    "DEFAULT_TARGET",
    "DEFAULT_TIMEOUT",
    "SERVICE_NAME",
    "AsyncLmServeClient",
    "LmServeClient",
    "LmServeClientError",
    "health_service",
]
