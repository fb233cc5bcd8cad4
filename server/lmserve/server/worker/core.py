"""`EngineCore`: one model's compute, the same object in an engine worker and in-process.

    core = EngineCore(entry, EngineLimits(), EngineStats(entry.name))
    scores = await core.score(prepared, deadline)            # BatchScores (scoring queue)
    totals = await core.prefix_totals(ids, offsets, eos=True, deadline=None)
    stream = core.generate(GenerationRequest(prompt_ids, params, deadline))
    hypotheses = await core.beam_search(prompt_ids, params, deadline)
    answer = await core.complete(CompleteEdit(session_id, append=[17], partial="th", k=3))
    answer = await core.fuse(stream_key, FuseStep(opens=True, query=[0], top_k=5))

It owns what computes: the scoring queue (bounded, fair units on a thread), the generation
scheduler and the beam searches (both started on first use) and the autocomplete sessions;
they record into one `EngineStats` (`stats`), which whoever serves /metrics exports.
What it takes and returns is plain data (ids, arrays, dataclasses), carried across the process
boundary by `shared.protocol`; what a client reads (Score's response, Generate's messages) is
built here as protobuf bytes (`worker.replies`). Tokenizing stays with `ServedModel` in the
front, which needs only the model's codec.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from lmserve.server.backends.base import BatchScores, LanguageModelBackend
from lmserve.server.backends.stepping import Stepper
from lmserve.server.decoding.beam import Hypothesis
from lmserve.server.decoding.bias import BiasMatch
from lmserve.server.decoding.detokenize import detokenizer_factory, token_texts
from lmserve.server.decoding.lattice.expand import (
    LatticeExpansion,
    LatticeParams,
    RescoredPaths,
    TokenLattice,
)
from lmserve.server.decoding.params import BeamParams
from lmserve.server.decoding.prefix_scoring import PrefixScoring, PrefixTrie
from lmserve.server.decoding.scoring import PreparedScoring
from lmserve.server.families.catalog import history_key, make_stepper
from lmserve.server.registry.repository import ModelEntry
from lmserve.server.shared.edits import CompleteAnswer, CompleteEdit
from lmserve.server.shared.fusion import FuseAnswer, FuseStep
from lmserve.server.shared.stats import EngineStats
from lmserve.server.worker.autocomplete.completer import Completer
from lmserve.server.worker.foreground import Foreground
from lmserve.server.worker.fusion.sessions import Fuser
from lmserve.server.worker.generation.beam_runner import BeamRunner
from lmserve.server.worker.generation.context_window import ContextWindow
from lmserve.server.worker.generation.delivery import Poster
from lmserve.server.worker.generation.scheduler import GenerationScheduler
from lmserve.server.worker.generation.sequence import GenerationRequest, GenerationStream
from lmserve.server.worker.limits import EngineLimits
from lmserve.server.worker.replies.generate import message_renderer
from lmserve.server.worker.replies.score import response_bytes
from lmserve.server.worker.scoring.queue import ScoringQueue


@dataclass(frozen=True)
class PrefixTotals:
    """Per-text totals (nats) of a prefix-shared pass, and the positions it computed."""

    totals: npt.NDArray[np.float64]
    computed: int


class EngineCore:
    """Computes for one READY model (see the module doc)."""

    failure: str | None = None  # threads in this process: nothing stops it for good
    load_error: str | None = None  # it exists only for a loaded model

    def __init__(
        self,
        entry: ModelEntry,
        limits: EngineLimits,
        stats: EngineStats | None = None,
        *,
        poster: Poster | None = None,
    ) -> None:
        assert entry.scorer is not None, "only READY models are served"
        self.name = entry.name
        # Where the scheduler's events go: None posts them to the streams on this process's
        # event loop; an engine worker sends them to the front instead.
        self._poster = poster
        self.limits = limits
        self.stats = stats = stats if stats is not None else EngineStats(self.name)
        self.scorer = entry.scorer
        self.backend: LanguageModelBackend = entry.scorer.backend
        self._neural = entry.neural
        codec = entry.scorer.codec
        self._detokenizer = detokenizer_factory(codec, self.backend.vocab)
        self.stepper: Stepper = make_stepper(self.backend)
        # What its distributions depend on, for merging lattice histories exactly (n-gram).
        self.history_key = history_key(self.backend)
        rules = entry.rules
        # Its family's positions and cache, within the model's budget (`context_window`).
        self.window = ContextWindow(
            rules.positions, rules.cache_bytes_per_position, limits.generation.max_cache_bytes
        )
        # Scoring passes and session steps go before generation steps (`foreground`).
        self.foreground = Foreground()
        self.scoring = ScoringQueue(
            self.name,
            self.backend,
            limits.scoring,
            stats,
            foreground=self.foreground,
            # Neural passes release the GIL: a short request's may run beside a long one's.
            interactive_lane=self.stepper.releases_gil,
        )
        self._scheduler: GenerationScheduler | None = None
        self._lock = threading.Lock()
        self.beams = BeamRunner(self.name, self.stepper, limits.generation, self.window)
        manifest = entry.manifest
        self.completer = Completer(
            self.name,
            self.backend,
            self.stepper,
            codec,
            limits.sessions,
            stats,
            lowercase=bool(manifest and manifest.tokenizer.lowercase),
            max_context_tokens=rules.positions.text_tokens(limits.requests.max_tokens_per_text),
            foreground=self.foreground,
        )
        self.fuser = Fuser(
            self.name, self.stepper, limits.fusion, rules.positions, foreground=self.foreground
        )

    # -- scoring -------------------------------------------------------------------------------

    async def score(self, prepared: PreparedScoring, deadline: float | None = None) -> BatchScores:
        """The backend's scores of a prepared request: inline when that costs less than a hop
        to the queue's thread (`ScoringLimits.runs_inline`), else through the scoring queue."""
        if self.limits.scoring.runs_inline(self._neural, prepared.scored_tokens):
            return prepared.run(self.backend)
        return await self.scoring.score(prepared, deadline)

    async def score_response(
        self,
        prepared: PreparedScoring,
        model: str,
        bias: Sequence[BiasMatch] | None = None,
        deadline: float | None = None,
    ) -> bytes:
        """Score's whole answer as ScoreResponse wire bytes: scored here, its results and
        message built here (`replies.score`), so the front only hands the bytes on."""
        scored = self.scorer.finish(prepared, await self.score(prepared, deadline))
        return response_bytes(model, scored, bias)

    @functools.cached_property
    def token_texts(self) -> list[str]:
        """Each token as text on its own, for Generate's alternatives and BeamSearch."""
        return token_texts(self.scorer.codec, self.backend.vocab)

    async def prefix_totals(
        self,
        ids: npt.NDArray[np.integer],
        offsets: npt.NDArray[np.integer],
        *,
        eos: bool,
        deadline: float | None = None,
    ) -> PrefixTotals:
        """Totals equal to Score's for texts that share prefixes (Rerank's hypotheses): each
        distinct prefix is fed once (a trie, `decoding.prefix_scoring`), one batched step per
        work unit on the scoring queue's thread."""
        bounds = offsets.tolist()
        flat = ids.tolist()
        trie = PrefixTrie.build([flat[a:b] for a, b in zip(bounds, bounds[1:], strict=False)])
        scoring = PrefixScoring(
            self.stepper,
            trie,
            eos=eos,
            rows_per_step=self.limits.scoring.scoring_unit_tokens,  # a row is one position
        )
        await self.scoring.run_steps(scoring.steps(), trie.nodes, deadline)
        return PrefixTotals(scoring.totals, scoring.computed)

    async def rescore_lattices(
        self,
        lattices: Sequence[TokenLattice],
        params: LatticeParams,
        deadline: float | None = None,
    ) -> list[RescoredPaths]:
        """Each lattice expanded by model history and its best paths found
        (`decoding.lattice.expand`): one batched step per work unit on the scoring queue's
        thread, a work unit at most `scoring_unit_tokens` rows."""
        params = dataclasses.replace(params, rows_per_step=self.limits.scoring.scoring_unit_tokens)
        results: list[RescoredPaths] = []
        for lattice in lattices:
            expansion = LatticeExpansion(self.stepper, lattice, params, self.history_key)
            await self.scoring.run_steps(expansion.steps(), len(lattice.src) + 1, deadline)
            results.append(expansion.result)
        return results

    # -- generation ----------------------------------------------------------------------------

    @property
    def scheduler(self) -> GenerationScheduler:
        """The model's continuous-batching scheduler, started on first use."""
        with self._lock:
            if self._scheduler is None:
                self._scheduler = GenerationScheduler(
                    self.name,
                    self.stepper,
                    self.backend.vocab,
                    self.limits.generation,
                    self.stats,
                    self._detokenizer,
                    poster=self._poster,
                    foreground=self.foreground,
                    window=self.window,
                )
            return self._scheduler

    def generate(
        self,
        request: GenerationRequest,
        stream: Callable[[GenerationRequest, int], GenerationStream] | None = None,
    ) -> GenerationStream:
        """Queues a Generate request; Overloaded when the model's queue is full. `stream`
        makes the request's stream (a worker's carries the front's stream id); by default an
        in-process stream whose messages are rendered as a worker's are."""
        return self.scheduler.submit(request, stream or self._rendering_stream)

    def _rendering_stream(self, request: GenerationRequest, samples: int) -> GenerationStream:
        render = message_renderer(self.token_texts, request.params, request.deadline)
        return GenerationStream(request, samples, render)

    async def beam_search(
        self, prompt_ids: Sequence[int], params: BeamParams, deadline: float | None
    ) -> list[Hypothesis]:
        """The n best continuations, on the model's beam threads (`BeamRunner`): stopped
        within a step when the caller leaves or the deadline passes."""
        return await self.beams.run(prompt_ids, params, deadline)

    # -- autocomplete --------------------------------------------------------------------------

    async def complete(self, edit: CompleteEdit) -> CompleteAnswer:
        """One Complete message's edits applied to its session, and the next words."""
        return await self.completer.apply(edit)

    # -- shallow fusion ------------------------------------------------------------------------

    async def fuse(self, session: Hashable, step: FuseStep) -> FuseAnswer:
        """One Fuse message applied to its stream's hypotheses (`worker.fusion`), its model
        work batched with every other stream's."""
        return await self.fuser.apply(session, step)

    def fuse_close(self, session: Hashable) -> None:
        """A Fuse stream ended: its hypotheses' states are released."""
        self.fuser.close_session(session)

    # -- lifecycle -----------------------------------------------------------------------------

    def close(self) -> None:
        """Stops the model's threads; never waits behind model work."""
        self.scoring.close()
        self.completer.close()
        self.fuser.close()
        self.beams.close()
        with self._lock:
            scheduler, self._scheduler = self._scheduler, None
        if scheduler is not None:
            scheduler.close(timeout=0.5)

    def join(self, timeout: float) -> None:
        """After `close`: waits (at most `timeout` s) for the work in flight (one pass, one
        step) to end, so no model code runs while the process exits."""
        deadline = time.monotonic() + timeout
        for part in (self.scoring, self.completer, self.beams, self.fuser):
            part.join(max(0.0, deadline - time.monotonic()))
