"""One `ServedModel` per loaded model: the front's side of it, behind one set of methods.

    served = ServedModel(entry, EngineLimits(), metrics, engine)
    scored = await served.score(TextInput(texts=["the cat"]), ScoreOptions(), deadline=None)
    stream = served.generate(prompt_ids, params, deadline)     # continuous batching
    hypotheses = await served.beam_search(prompt_ids, params, deadline)
    answer = await served.complete(CompleteEdit(session_id, partial="th", k=3))

It keeps the text side of the model (its codec: tokenizing, the limits a text is held to,
detokenized token texts) and hands the compute to its `engine`: an `EngineCore` in an engine
worker process of the model's own (`front.workers.WorkerEngine`), where the weights are (the
front reads only the vocabulary, codec and manifest), or in this process (`engine_workers:
false`). Scoring small enough to cost less than a hop runs inline (`ScoringLimits.runs_inline`):
in the engine, or here for a model whose weights are a memory map every process shares (an
n-gram binary, `ModelFamily.maps_weights`). The API layer converts messages and calls these
methods; it never reaches into a backend.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from lmserve.server.backends.base import BatchScores, LanguageModelBackend, Vocabulary
from lmserve.server.decoding.beam import Hypothesis
from lmserve.server.decoding.bias import BiasMatch
from lmserve.server.decoding.detokenize import Detokenizer, detokenizer_factory, token_texts
from lmserve.server.decoding.lattice.expand import LatticeParams, RescoredPaths, TokenLattice
from lmserve.server.decoding.params import BeamParams, GenerateParams
from lmserve.server.decoding.scoring import (
    PreparedScoring,
    ScoredTexts,
    ScoreOptions,
    Scorer,
    check_token_count,
)
from lmserve.server.errors import Unimplemented
from lmserve.server.metrics import Metrics
from lmserve.server.registry.repository import ModelEntry
from lmserve.server.shared.edits import CompleteAnswer, CompleteEdit
from lmserve.server.shared.fusion import FuseAnswer, FuseStep
from lmserve.server.text.codec import TextCodec
from lmserve.server.worker.core import PrefixTotals
from lmserve.server.worker.generation.sequence import GenerationRequest, GenerationStream
from lmserve.server.worker.limits import EngineLimits
from lmserve.server.worker.replies.score import response_bytes

# Requests with more characters than this are tokenized off the event loop.
_INLINE_ENCODE_CHARS = 65_536


class ModelEngine(Protocol):
    """What computes for a model: `EngineCore` in-process, or `workers.WorkerEngine`."""

    # Why the engine stopped for good (a worker that kept dying, or could not load the
    # model), else None; `load_error` is that load error when it is one.
    failure: str | None
    load_error: str | None

    async def score(
        self, prepared: PreparedScoring, deadline: float | None = None
    ) -> BatchScores: ...

    async def score_response(
        self,
        prepared: PreparedScoring,
        model: str,
        bias: Sequence[BiasMatch] | None = None,
        deadline: float | None = None,
    ) -> bytes: ...

    async def prefix_totals(
        self,
        ids: npt.NDArray[np.integer],
        offsets: npt.NDArray[np.integer],
        *,
        eos: bool,
        deadline: float | None = None,
    ) -> PrefixTotals: ...

    def generate(self, request: GenerationRequest) -> GenerationStream: ...

    async def beam_search(
        self, prompt_ids: Sequence[int], params: BeamParams, deadline: float | None
    ) -> list[Hypothesis]: ...

    async def rescore_lattices(
        self,
        lattices: Sequence[TokenLattice],
        params: LatticeParams,
        deadline: float | None = None,
    ) -> list[RescoredPaths]: ...

    async def complete(self, edit: CompleteEdit) -> CompleteAnswer: ...

    async def fuse(self, session: int, step: FuseStep) -> FuseAnswer: ...

    def fuse_close(self, session: int) -> None: ...

    def close(self) -> None: ...

    def join(self, timeout: float) -> None: ...


@dataclass(frozen=True)
class TextInput:
    """The texts of a request: raw `texts`, pre-tokenized `token_lists` or the model's
    `token_ids` (checked in range), exactly one of them."""

    texts: Sequence[str] | None = None
    token_lists: Sequence[Sequence[str]] | None = None
    token_ids: Sequence[Sequence[int]] | None = None

    def __len__(self) -> int:
        if self.texts is not None:
            return len(self.texts)
        return len(self.token_lists if self.token_lists is not None else self.token_ids or [])

    @property
    def field(self) -> str:
        """The request field the texts came in (what a refusal names)."""
        if self.texts is not None:
            return "texts"
        return "token_lists" if self.token_lists is not None else "token_ids"

    def characters(self) -> int:
        if self.texts is not None:
            return sum(len(t) for t in self.texts)
        if self.token_ids is not None:
            return sum(len(ids) for ids in self.token_ids)
        return sum(len(w) + 1 for tokens in self.token_lists or [] for w in tokens)


@dataclass(frozen=True)
class LmScores:
    """Per-text LM results for Rerank: totals in nats, the model's tokens (`</s>` not counted),
    OOV counts, and the positions the request holds against those the model computed."""

    log_probs: npt.NDArray[np.float64]
    token_counts: npt.NDArray[np.int64]
    oov_counts: npt.NDArray[np.int64]
    request_tokens: int
    computed_tokens: int


class ServedModel:
    """Serves one READY model: text here, compute on its engine (see the module doc)."""

    def __init__(
        self,
        entry: ModelEntry,
        limits: EngineLimits,
        metrics: Metrics | None,
        engine: ModelEngine,
    ) -> None:
        assert entry.scorer is not None, "only READY models are served"
        self.entry = entry
        self.name = entry.name
        self.limits = limits
        self.scorer: Scorer = entry.scorer
        self.engine = engine
        self._metrics = metrics
        # A model that computes without the GIL (ONNX Runtime, torch) is neural.
        self.neural = entry.neural
        # How long its texts may be, and how Rerank runs on it: its family's rules.
        self.positions = entry.rules.positions
        self.rerank_feeds_prefixes = entry.rules.rerank_feeds_prefixes
        # Whether a text's first token is scored given `<s>` (its family's rule).
        self.reads_from_start = entry.rules.reads_from_start
        # A memory-mapped model (an n-gram binary) this front scores itself when a request is
        # small: its pages are the worker's, and the lookups cost less than the hop.
        self._mapped = entry.backend if entry.rules.scored_in_front else None

    @property
    def backend(self) -> LanguageModelBackend:
        return self.scorer.backend

    @property
    def codec(self) -> TextCodec:
        return self.scorer.codec

    @property
    def vocab(self) -> Vocabulary:
        return self.scorer.vocab

    # -- scoring -------------------------------------------------------------------------------

    async def score(
        self,
        texts: TextInput,
        options: ScoreOptions,
        *,
        details: bool = False,
        oov_log_probs: bool = False,
        deadline: float | None = None,
    ) -> ScoredTexts:
        """Scores texts in bounded units on the model's engine; natural logs."""
        prepared = await self.prepare(texts, options, details=details, oov_log_probs=oov_log_probs)
        return await self.score_prepared(prepared, deadline)

    async def score_response(
        self,
        model: str,
        texts: TextInput,
        options: ScoreOptions,
        *,
        details: bool = False,
        bias: Sequence[BiasMatch] | None = None,
        deadline: float | None = None,
    ) -> bytes:
        """Score's whole response as wire bytes (`model` as the request named it): tokenized
        here, scored and built by the engine, handed on as they are."""
        prepared = await self.prepare(texts, options, details=details)
        here = self._scored_here(prepared)
        if here is not None:
            answer = response_bytes(model, self.scorer.finish(prepared, here), bias)
        else:
            answer = await self.engine.score_response(prepared, model, bias, deadline)
        if self._metrics is not None:
            self._metrics.record_scored(self.name, len(prepared.lengths), prepared.scored_tokens)
        return answer

    async def prepare(
        self,
        texts: TextInput,
        options: ScoreOptions,
        *,
        details: bool = False,
        oov_log_probs: bool = False,
    ) -> PreparedScoring:
        """Tokenizes and checks the limits (off the event loop for large requests)."""
        limit = self.limits.requests.max_tokens_per_text

        def run() -> PreparedScoring:
            prepared = tokenize()
            if not options.bos and not self.reads_from_start:
                prepared = prepared.from_first_tokens(texts.field)
            return self._within_positions(prepared, texts.field)

        def tokenize() -> PreparedScoring:
            if texts.token_ids is not None:
                return self.scorer.prepare_ids(
                    texts.token_ids,
                    options,
                    details=details,
                    oov_log_probs=oov_log_probs,
                    max_tokens_per_text=limit,
                )
            if texts.texts is not None:
                return self.scorer.prepare_texts(
                    texts.texts,
                    options,
                    details=details,
                    oov_log_probs=oov_log_probs,
                    max_tokens_per_text=limit,
                )
            return self.scorer.prepare_token_lists(
                texts.token_lists or [],
                options,
                details=details,
                oov_log_probs=oov_log_probs,
                max_tokens_per_text=limit,
            )

        if texts.characters() <= _INLINE_ENCODE_CHARS:
            return run()
        return await asyncio.to_thread(run)

    @property
    def max_text_tokens(self) -> int:
        """Tokens one text may have: the request limit, and the model's positions less its
        `<s>` (what tokenizer endpoints report as the model's length)."""
        return self.positions.text_tokens(self.limits.requests.max_tokens_per_text)

    def _within_positions(self, prepared: PreparedScoring, field: str) -> PreparedScoring:
        """Texts must each fit the model's positions: `<s>` and every token read before the
        last scored one (`</s>` when it is scored). Refused here, by the request's own index,
        before any work is queued."""
        if self.positions.limit is not None:
            read = 1 if prepared.options.eos else 0  # `<s>`, less the last token if unscored
            for i, count in enumerate(np.diff(prepared.batch.offsets).tolist()):
                self.positions.check(count + read, f"{field}[{i}]")
        return prepared

    async def score_prepared(
        self, prepared: PreparedScoring, deadline: float | None = None
    ) -> ScoredTexts:
        """Scores a prepared request on the engine (which runs it inline when that is cheaper
        than a hop); the words only `Scorer.finish` reads stay here."""
        scores = self._scored_here(prepared)
        if scores is None:
            scores = await self.engine.score(prepared.for_engine(), deadline)
        scored = self.scorer.finish(prepared, scores)
        if self._metrics is not None:
            self._metrics.record_scored(self.name, len(scored), scored.total_tokens)
        return scored

    def _scored_here(self, prepared: PreparedScoring) -> BatchScores | None:
        """The scores of a request small enough to run inline (`ScoringLimits.runs_inline`) on
        a model this front maps, else None (its engine scores it)."""
        if self._mapped is None or not self.limits.scoring.runs_inline(
            False, prepared.scored_tokens
        ):
            return None
        return prepared.run(self._mapped)

    async def lm_scores(
        self, texts: TextInput, options: ScoreOptions, deadline: float | None = None
    ) -> LmScores:
        """Totals equal to Score's for the same texts and options, for many hypotheses that
        share prefixes: a neural model feeds each distinct prefix once (`EngineCore.
        prefix_totals`); an n-gram model scores every position (lookups cost less than
        sharing), and so does a transformer (one pass; a prefix every hypothesis shares is
        read once through the cache, `backends.transformer`): the family says which."""
        prepared = await self.prepare(texts, options)
        if not self.rerank_feeds_prefixes:
            scored = await self.score_prepared(prepared, deadline)
            tokens = prepared.scored_tokens
            return LmScores(scored.log_probs, prepared.lengths, scored.oov_counts, tokens, tokens)
        if not options.bos:
            raise Unimplemented(
                "recurrent models always read <s> first: options.bos=false is not available"
            )
        batch = prepared.batch
        shared = await self.engine.prefix_totals(
            batch.ids, batch.offsets, eos=options.eos, deadline=deadline
        )
        if self._metrics is not None:
            self._metrics.record_scored(self.name, batch.batch_size, prepared.scored_tokens)
            self._metrics.rerank_computed_tokens.labels(model=self.name).inc(shared.computed)
            self._metrics.rerank_request_tokens.labels(model=self.name).inc(prepared.scored_tokens)
        return LmScores(
            shared.totals,
            prepared.lengths,
            prepared.oov_counts,
            prepared.scored_tokens,
            shared.computed,
        )

    # -- generation ----------------------------------------------------------------------------
    @functools.cached_property
    def token_texts(self) -> list[str]:
        """Each token as text on its own (BPE pieces decoded, no `</w>`), for the alternatives
        of Generate and the tokens of BeamSearch hypotheses."""
        return token_texts(self.codec, self.vocab)

    def detokenizer(self) -> Callable[[], Detokenizer]:
        """Fresh detokenizers for the model's codec (words spaced, pieces merged)."""
        return detokenizer_factory(self.codec, self.vocab)

    def encode_prompt(self, text: str, field: str = "prompt") -> list[int]:
        """A prompt's ids by the model's tokenizer, within the per-text token limit."""
        if not text:
            return []
        batch = self.codec.encode_texts([text])
        check_token_count(field, len(batch.ids), self.limits.requests.max_tokens_per_text)
        return [int(i) for i in batch.ids]

    def encode_tokens(self, tokens: Sequence[str], field: str = "tokens") -> list[int]:
        """Model tokens, taken as they are, as ids (`<unk>` for unknown ones)."""
        check_token_count(field, len(tokens), self.limits.requests.max_tokens_per_text)
        index, unk = self.vocab.index, self.vocab.unk_id
        return [index.get(t, unk) for t in tokens]

    def token_names_of_text(self, text: str, ids: Sequence[int]) -> list[str]:
        """The model tokens of `text` as the client keeps them: words as the tokenizer writes
        them (an unknown word stays itself), pieces as the vocabulary writes them."""
        return self.codec.token_names(text, ids)

    def generate(
        self, prompt_ids: list[int], params: GenerateParams, deadline: float | None
    ) -> GenerationStream:
        """Queues a Generate request on the engine; Overloaded when the model's queue is
        full (raised here, or by the stream when the engine is another process)."""
        return self.engine.generate(GenerationRequest(prompt_ids, params, deadline))

    async def beam_search(
        self, prompt_ids: list[int], params: BeamParams, deadline: float | None
    ) -> list[Hypothesis]:
        """The n best continuations: stopped within a step when the caller leaves or the
        deadline passes."""
        return await self.engine.beam_search(prompt_ids, params, deadline)

    async def rescore_lattices(
        self,
        lattices: Sequence[TokenLattice],
        params: LatticeParams,
        deadline: float | None = None,
    ) -> list[RescoredPaths]:
        """Lattices expanded by model history on the engine, their best paths found
        (`front.models.lattices` tokenizes them and reads the result)."""
        return await self.engine.rescore_lattices(lattices, params, deadline)

    # -- autocomplete --------------------------------------------------------------------------

    async def complete(self, edit: CompleteEdit) -> CompleteAnswer:
        """One Complete message's edits applied to the engine's session, and the answer."""
        return await self.engine.complete(edit)

    # -- shallow fusion ------------------------------------------------------------------------

    async def fuse(self, session: int, step: FuseStep) -> FuseAnswer:
        """One Fuse message applied to the engine's table of stream `session`."""
        return await self.engine.fuse(session, step)

    def fuse_close(self, session: int) -> None:
        """Fuse stream `session` ended: the engine releases its hypotheses (never raises)."""
        self.engine.fuse_close(session)

    # -- lifecycle -----------------------------------------------------------------------------

    def close(self) -> None:
        """Stops the engine (its threads, or its worker process); never waits behind work."""
        self.engine.close()

    def join(self, timeout: float) -> None:
        """After `close`: waits (at most `timeout` s) for the engine's work in flight."""
        self.engine.join(timeout)
