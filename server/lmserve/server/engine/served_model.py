"""One `ServedModel` per loaded model: everything that serves it, behind one set of methods.

    served = ServedModel(entry, EngineLimits(), metrics)
    scored = await served.score(TextInput(texts=["the cat"]), ScoreOptions(), deadline=None)
    stream = served.generate(prompt_ids, params, deadline)     # continuous batching
    hypotheses = await served.beam_search(prompt_ids, params, deadline)

It owns the model's backend and codec (from the registry's `ModelEntry`), its scoring queue
(bounded, fair units on a worker thread), its generation scheduler and its beam searches (both
created on first use), and the limits they are held to. The API layer converts messages and
calls these methods; it never reaches into a backend. Compute never runs on the event loop,
except n-gram scoring small enough to cost less than a thread hop (`ScoringQueue`).
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from lmserve.server.backends.base import LanguageModelBackend, Vocabulary
from lmserve.server.backends.stepping import Stepper, make_stepper
from lmserve.server.decoding.detokenize import Detokenizer, detokenizer_factory, token_texts
from lmserve.server.decoding.prefix_scoring import PrefixScoring, PrefixTrie
from lmserve.server.decoding.scoring import PreparedScoring, ScoredTexts, ScoreOptions, Scorer
from lmserve.server.engine.beam_runner import BeamRunner
from lmserve.server.engine.completion import Completer
from lmserve.server.engine.limits import EngineLimits
from lmserve.server.engine.scheduler import GenerationScheduler
from lmserve.server.engine.scoring_queue import ScoringQueue
from lmserve.server.engine.sequence import GenerationRequest, GenerationStream
from lmserve.server.errors import InvalidArgument, Unimplemented
from lmserve.server.metrics import Metrics
from lmserve.server.registry.repository import ModelEntry
from lmserve.server.text.codec import TextCodec, WordCodec

# Requests with more characters than this are tokenized off the event loop.
_INLINE_ENCODE_CHARS = 65_536


@dataclass(frozen=True)
class TextInput:
    """The texts of a request: raw `texts` or pre-tokenized `token_lists`, never both."""

    texts: Sequence[str] | None = None
    token_lists: Sequence[Sequence[str]] | None = None

    def __len__(self) -> int:
        return len(self.texts if self.texts is not None else self.token_lists or [])

    def characters(self) -> int:
        if self.texts is not None:
            return sum(len(t) for t in self.texts)
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
    """Serves one READY model: scoring, generation and beam search (see the module doc)."""

    def __init__(
        self, entry: ModelEntry, limits: EngineLimits, metrics: Metrics | None = None
    ) -> None:
        assert entry.scorer is not None, "only READY models are served"
        self.entry = entry
        self.name = entry.name
        self.limits = limits
        self.scorer: Scorer = entry.scorer
        self._metrics = metrics
        self.stepper: Stepper = make_stepper(self.backend)
        # A model that computes without the GIL (ONNX Runtime, torch) is neural: all its
        # scoring goes to the worker; the n-gram kernel's small requests run inline.
        self._scoring = ScoringQueue(
            self.name, self.backend, limits.scoring, metrics, inline=not self.stepper.releases_gil
        )
        self._scheduler: GenerationScheduler | None = None
        self._lock = threading.Lock()
        self.beams = BeamRunner(self.name, self.stepper, limits.generation)
        manifest = entry.manifest
        # Autocomplete: the word prefix index is built here, at load.
        self.completer = Completer(
            self.name,
            self.backend,
            self.stepper,
            self.codec,
            limits.sessions,
            metrics,
            lowercase=bool(manifest and manifest.tokenizer.lowercase),
        )

    @property
    def backend(self) -> LanguageModelBackend:
        return self.scorer.backend

    @property
    def codec(self) -> TextCodec:
        return self.scorer.codec

    @property
    def vocab(self) -> Vocabulary:
        return self.backend.vocab

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
        """Scores texts in bounded units on the model's worker; natural logs."""
        prepared = await self.prepare(texts, options, details=details, oov_log_probs=oov_log_probs)
        return await self.score_prepared(prepared, deadline)

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

    async def score_prepared(
        self, prepared: PreparedScoring, deadline: float | None = None
    ) -> ScoredTexts:
        """Scores a prepared request through the model's scoring queue."""
        scores = await self._scoring.score(prepared, deadline)
        scored = self.scorer.finish(prepared, scores)
        if self._metrics is not None:
            self._metrics.record_scored(self.name, len(scored), scored.total_tokens)
        return scored

    async def lm_scores(
        self, texts: TextInput, options: ScoreOptions, deadline: float | None = None
    ) -> LmScores:
        """Totals equal to Score's for the same texts and options, for many hypotheses that
        share prefixes: a neural model feeds each distinct prefix once (a trie over all the
        texts, `decoding.prefix_scoring`), one batched step per work unit on the model's
        worker; an n-gram model scores every position (lookups cost less than sharing)."""
        prepared = await self.prepare(texts, options)
        if not self.stepper.releases_gil:
            scored = await self.score_prepared(prepared, deadline)
            tokens = prepared.scored_tokens
            return LmScores(scored.log_probs, prepared.lengths, scored.oov_counts, tokens, tokens)
        if not options.bos:
            raise Unimplemented(
                "recurrent models always read <s> first: options.bos=false is not available"
            )
        batch = prepared.batch
        bounds = batch.offsets.tolist()
        ids = batch.ids.tolist()
        trie = PrefixTrie.build([ids[a:b] for a, b in zip(bounds, bounds[1:], strict=False)])
        scoring = PrefixScoring(
            self.stepper,
            trie,
            eos=options.eos,
            rows_per_step=self.limits.scoring.unit_tokens,  # a row is one position
        )
        await self._scoring.run_steps(scoring.steps(), trie.nodes, deadline)
        if self._metrics is not None:
            self._metrics.record_scored(self.name, batch.batch_size, prepared.scored_tokens)
            self._metrics.rerank_computed_tokens.labels(model=self.name).inc(scoring.computed)
            self._metrics.rerank_request_tokens.labels(model=self.name).inc(prepared.scored_tokens)
        return LmScores(
            scoring.totals,
            prepared.lengths,
            prepared.oov_counts,
            prepared.scored_tokens,
            scoring.computed,
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
        limit = self.limits.requests.max_tokens_per_text
        if len(batch.ids) > limit:
            raise InvalidArgument(
                field, f"has {len(batch.ids)} tokens, more than the limit of {limit}"
            )
        return [int(i) for i in batch.ids]

    def encode_tokens(self, tokens: Sequence[str], field: str = "tokens") -> list[int]:
        """Model tokens, taken as they are, as ids (`<unk>` for unknown ones)."""
        limit = self.limits.requests.max_tokens_per_text
        if len(tokens) > limit:
            raise InvalidArgument(
                field, f"has {len(tokens)} tokens, more than the limit of {limit}"
            )
        index, unk = self.vocab.index, self.vocab.unk_id
        return [index.get(t, unk) for t in tokens]

    def token_names_of_text(self, text: str, ids: Sequence[int]) -> list[str]:
        """The model tokens of `text` as the client keeps them: words as the tokenizer writes
        them (an unknown word stays itself), pieces as the vocabulary writes them."""
        codec = self.codec
        if isinstance(codec, WordCodec):
            words = codec.split_batch([text])[0]
            if len(words) == len(ids):
                return words
        words_of = self.vocab.words
        return [words_of[i] for i in ids]

    @property
    def scheduler(self) -> GenerationScheduler:
        """The model's continuous-batching scheduler, started on first use."""
        with self._lock:
            if self._scheduler is None:
                self._scheduler = GenerationScheduler(
                    self.name,
                    self.stepper,
                    self.vocab,
                    self.limits.generation,
                    self._metrics,
                    self.detokenizer(),
                )
            return self._scheduler

    def generate(
        self, prompt_ids: list[int], params: Any, deadline: float | None
    ) -> GenerationStream:
        """Queues a Generate request; Overloaded when the model's queue is full."""
        return self.scheduler.submit(GenerationRequest(prompt_ids, params, deadline))

    async def beam_search(
        self, prompt_ids: list[int], params: Any, deadline: float | None
    ) -> list[Any]:
        """The n best continuations, on the model's beam threads (`BeamRunner`): stopped
        within a step when the caller leaves or the deadline passes."""
        return await self.beams.run(prompt_ids, params, deadline)

    # -- lifecycle -----------------------------------------------------------------------------

    def close(self) -> None:
        """Stops the model's threads; never waits behind model work."""
        self._scoring.close()
        self.completer.close()
        self.beams.close()
        with self._lock:
            scheduler, self._scheduler = self._scheduler, None
        if scheduler is not None:
            scheduler.close(timeout=0.5)

    def join(self, timeout: float) -> None:
        """After `close`: waits (at most `timeout` s) for the work in flight (one pass, one
        step) to end, so no model code runs while the process exits."""
        deadline = time.monotonic() + timeout
        for part in (self._scoring, self.completer, self.beams):
            part.join(max(0.0, deadline - time.monotonic()))
