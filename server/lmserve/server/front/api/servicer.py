"""`LanguageModelService`: converts requests, delegates to the served models, converts back.

    servicer = LanguageModelServicer(ServedModels(repository, limits, metrics), metrics)
    lm_service_pb2_grpc.add_LanguageModelServiceServicer_to_server(servicer, server)

Errors are raised as `lmserve.server.errors` and mapped to status codes by the interceptor.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from typing import Protocol

from lmserve.server.decoding.perplexity import PerplexityAccumulator
from lmserve.server.decoding.scored import ScoredTexts
from lmserve.server.decoding.scoring import ScoreOptions
from lmserve.server.errors import (
    InvalidArgument,
)
from lmserve.server.front.api import convert, generation
from lmserve.server.front.api.bias import StreamBias
from lmserve.server.front.api.complete import complete_stream
from lmserve.server.front.api.fuse import fuse_stream
from lmserve.server.front.api.interceptors import note_model
from lmserve.server.front.api.lattice import rescore_lattice
from lmserve.server.front.api.model_use import same_model, use_model
from lmserve.server.front.api.pipelining import pipelined
from lmserve.server.front.api.rerank import rerank
from lmserve.server.front.api.validation import (
    check_text_bytes,
    validate_batch,
    validate_model_name,
    validate_options,
    validate_score_batch,
)
from lmserve.server.front.models.biasing import bias_matches
from lmserve.server.front.models.served_model import ServedModel, TextInput
from lmserve.server.front.models.served_models import ServedModels
from lmserve.server.metrics import Metrics
from lmserve.v1 import lm_service_pb2 as pb
from lmserve.v1 import lm_service_pb2_grpc


class RpcContext(Protocol):
    """What the servicer reads of a call's context: gRPC's `aio.ServicerContext`, or the HTTP
    front's (`api.http.connect_service`), which calls these same methods."""

    def time_remaining(self) -> float | None: ...


class NoDeadline:
    """The context of a call that carries no deadline (an OpenAI request, a WebSocket)."""

    __slots__ = ()

    def time_remaining(self) -> float | None:
        return None


class LanguageModelServicer(lm_service_pb2_grpc.LanguageModelServiceServicer):
    """Answers every RPC of `lmserve.v1.LanguageModelService`."""

    def __init__(self, models: ServedModels, metrics: Metrics) -> None:
        self._models = models
        self._limits = models.limits
        self._metrics = metrics

    @property
    def models(self) -> ServedModels:
        """The served models (the HTTP front's tokenizer endpoints read their codecs)."""
        return self._models

    # -- models ----------------------------------------------------------------------------

    async def ListModels(
        self, request: pb.ListModelsRequest, context: RpcContext
    ) -> pb.ListModelsResponse:
        return pb.ListModelsResponse(models=[convert.model_info(e) for e in self._models.entries()])

    async def GetModel(
        self, request: pb.GetModelRequest, context: RpcContext
    ) -> pb.GetModelResponse:
        entry = self._models.entry(validate_model_name(request.model))
        note_model(entry.name)  # GetModel holds no model: it only reads the entry
        return pb.GetModelResponse(model=convert.model_info(entry))

    # -- scoring ---------------------------------------------------------------------------

    async def Score(self, request: pb.ScoreRequest, context: RpcContext) -> bytes:
        return await self._score_request(request, _deadline(context))

    async def ScoreStream(
        self, request_iterator: AsyncIterator[pb.ScoreRequest], context: RpcContext
    ) -> AsyncIterator[bytes]:
        """Score per message, answered in order; a failure names the request's index."""
        deadline = _deadline(context)
        bias = StreamBias()  # a list sent once biases the stream's later messages too
        async for response in pipelined(
            request_iterator, lambda request: self._score_request(request, deadline, bias)
        ):
            yield response

    async def _score_request(
        self,
        request: pb.ScoreRequest,
        deadline: float | None,
        stream_bias: StreamBias | None = None,
    ) -> bytes:
        """One Score request (Score and ScoreStream): validated and tokenized here, scored and
        its response built where the model computes (an engine worker), which answers with the
        response's wire bytes; the interceptor sends them as they are."""
        limits = self._limits.requests
        with use_model(self._models, request.model) as served:
            batch = validate_score_batch(request, limits, len(served.vocab))
            options = validate_options(request)
            bias = (stream_bias or StreamBias()).bias(request, served, limits)
            matches = None if bias is None else bias_matches(served.codec, bias, batch)
            return await served.score_response(
                request.model,
                batch,
                options,
                details=request.return_tokens,
                bias=matches,
                deadline=deadline,
            )

    async def Perplexity(
        self, request: pb.PerplexityRequest, context: RpcContext
    ) -> pb.PerplexityResponse:
        with use_model(self._models, request.model) as served:
            batch = validate_batch(request, self._limits.requests)
            options = validate_options(request)
            stats = PerplexityAccumulator()
            stats.add(await _perplexity_scores(served, batch, options, _deadline(context)))
        return pb.PerplexityResponse(
            model=request.model, stats=convert.perplexity_stats(stats.result())
        )

    async def CorpusPerplexity(
        self,
        request_iterator: AsyncIterator[pb.CorpusPerplexityRequest],
        context: RpcContext,
    ) -> pb.CorpusPerplexityResponse:
        served: ServedModel | None = None
        options = ScoreOptions()
        options_message: pb.ScoreOptions | None = None
        stats = PerplexityAccumulator()
        deadline = _deadline(context)
        with contextlib.ExitStack() as held:
            async for message in request_iterator:
                if served is None:
                    served = held.enter_context(use_model(self._models, message.model))
                    options = validate_options(message)
                    options_message = message.options
                elif not same_model(self._models, served, message.model):
                    raise InvalidArgument(
                        "model",
                        f"changed mid-stream from {served.name!r} to {message.model!r}; "
                        "send one model",
                    )
                else:
                    _check_same_options(options_message, message)
                batch = validate_batch(message, self._limits.requests, allow_empty=True)
                if len(batch):
                    stats.add(await _perplexity_scores(served, batch, options, deadline))
        if served is None:
            raise InvalidArgument("model", "the stream had no messages; the first names the model")
        return pb.CorpusPerplexityResponse(
            model=served.name, stats=convert.perplexity_stats(stats.result())
        )

    # -- generation ------------------------------------------------------------------------

    async def Generate(
        self, request: pb.GenerateRequest, context: RpcContext
    ) -> AsyncIterator[bytes]:
        """GenerateResponse messages as wire bytes, built where the tokens are computed (an
        engine worker) and written to the call as they are."""
        with use_model(self._models, request.model) as served:
            words = served.token_texts  # alternatives' texts: never raw BPE pieces
            params = generation.generate_params(request, self._limits.generation, len(words))
            prompt = self._prompt(served, request.prompt, request.prompt_token_ids)
            deadline = _deadline(context)
            stream = served.generate(prompt, params, deadline)
            try:
                async for messages in stream.messages():
                    for message in messages:
                        yield message
            finally:
                stream.cancel()  # no-op when finished; frees the slots of a client that left

    async def BeamSearch(
        self, request: pb.BeamSearchRequest, context: RpcContext
    ) -> pb.BeamSearchResponse:
        with use_model(self._models, request.model) as served:
            vocab = served.vocab
            params = generation.beam_params(request, self._limits.generation, len(vocab))
            prompt = self._prompt(served, request.prompt, request.prompt_token_ids)
            hypotheses = await served.beam_search(prompt, params, _deadline(context))
        detokenizer, texts = served.detokenizer(), served.token_texts
        return pb.BeamSearchResponse(
            hypotheses=[generation.beam_hypothesis(h, texts, detokenizer()) for h in hypotheses]
        )

    async def Rerank(self, request: pb.RerankRequest, context: RpcContext) -> pb.RerankResponse:
        return await rerank(self._models, self._limits.requests, request, _deadline(context))

    async def RerankStream(
        self, request_iterator: AsyncIterator[pb.RerankRequest], context: RpcContext
    ) -> AsyncIterator[pb.RerankResponse]:
        """Rerank per message, answered in order; a failure names the request's index."""
        deadline = _deadline(context)
        limits = self._limits.requests
        bias = StreamBias()  # a list sent once biases the stream's later messages too
        async for response in pipelined(
            request_iterator, lambda request: rerank(self._models, limits, request, deadline, bias)
        ):
            yield response

    async def RescoreLattice(
        self, request: pb.RescoreLatticeRequest, context: RpcContext
    ) -> pb.RescoreLatticeResponse:
        return await rescore_lattice(
            self._models, self._limits.requests, request, _deadline(context)
        )

    async def RescoreLatticeStream(
        self, request_iterator: AsyncIterator[pb.RescoreLatticeRequest], context: RpcContext
    ) -> AsyncIterator[pb.RescoreLatticeResponse]:
        """RescoreLattice per message, answered in order; a failure names the request's index."""
        deadline = _deadline(context)
        limits = self._limits.requests
        bias = StreamBias()  # a list sent once biases the stream's later messages too
        async for response in pipelined(
            request_iterator,
            lambda request: rescore_lattice(self._models, limits, request, deadline, bias),
        ):
            yield response

    async def Complete(
        self, request_iterator: AsyncIterator[pb.CompleteRequest], context: RpcContext
    ) -> AsyncIterator[pb.CompleteResponse]:
        async for response in complete_stream(
            self._models, self._limits.requests, request_iterator
        ):
            yield response

    async def Fuse(
        self, request_iterator: AsyncIterator[pb.FuseRequest], context: RpcContext
    ) -> AsyncIterator[pb.FuseResponse]:
        async for response in fuse_stream(self._models, self._limits.fusion, request_iterator):
            yield response

    # -- helpers ---------------------------------------------------------------------------

    def close(self) -> None:
        """Stops every model's threads (never waits behind model work)."""
        self._models.close()

    def _prompt(self, served: ServedModel, text: str, ids: Sequence[int]) -> list[int]:
        """The prompt as ids: `prompt_token_ids` checked, or `prompt` text tokenized."""
        if ids:
            if text:
                raise InvalidArgument("prompt", "set either prompt or prompt_token_ids, not both")
            prompt = generation.prompt_ids(ids, len(served.vocab))
            # A leading `<s>` is the start every prompt is read from: read once, not twice.
            return prompt[1:] if prompt[0] == served.vocab.bos_id else prompt
        check_text_bytes("prompt", text, self._limits.requests)
        return served.encode_prompt(text)


async def _perplexity_scores(
    served: ServedModel, batch: TextInput, options: ScoreOptions, deadline: float | None
) -> ScoredTexts:
    return await served.score(batch, options, oov_log_probs=True, deadline=deadline)


def _deadline(context: RpcContext) -> float | None:
    """The call's deadline as a `time.monotonic()` instant (None: no deadline)."""
    remaining = context.time_remaining()
    return None if remaining is None else time.monotonic() + remaining


def _check_same_options(
    first_options: pb.ScoreOptions | None, message: pb.CorpusPerplexityRequest
) -> None:
    """Later corpus messages may leave options empty, or must repeat the first's."""
    if message.HasField("options") and message.options != first_options:
        raise InvalidArgument("options", "changed mid-stream; later messages must repeat them")
