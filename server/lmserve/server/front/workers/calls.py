"""The engine calls over a worker's connection: what `WorkerEngine` (the worker this front
started) and `RemoteWorkerEngine` (a worker another front started, `fronts: N`) share.

Each call is one typed message of `shared.protocol` and one typed reply; Score's whole response
and Generate's messages come back as wire bytes, built by the worker.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from lmserve.server.backends.base import BatchScores
from lmserve.server.decoding.beam import Hypothesis
from lmserve.server.decoding.bias import BiasMatch
from lmserve.server.decoding.lattice.expand import LatticeParams, RescoredPaths, TokenLattice
from lmserve.server.decoding.params import BeamParams
from lmserve.server.decoding.scoring import PreparedScoring
from lmserve.server.errors import ModelUnavailable
from lmserve.server.front.workers.connection import WorkerConnection
from lmserve.server.shared import protocol as p
from lmserve.server.shared.edits import CompleteAnswer, CompleteEdit
from lmserve.server.shared.fusion import FuseAnswer, FuseStep
from lmserve.server.worker.core import PrefixTotals
from lmserve.server.worker.generation.sequence import GenerationRequest, GenerationStream

G = TypeVar("G", bound=np.generic)


class EngineCalls:
    """`ModelEngine`'s calls, carried over `_live()`'s connection (a subclass supplies it)."""

    def _live(self) -> WorkerConnection:
        raise NotImplementedError

    async def score(self, prepared: PreparedScoring, deadline: float | None = None) -> BatchScores:
        work = p.scoring_work(prepared)
        reply = await self._live().call(
            lambda rid: p.ScoreCall(rid, work, deadline), p.BatchScoresReply
        )
        return BatchScores(
            totals=reply.totals.of_type(np.float64),
            token_log_probs=_of_type(reply.token_log_probs, np.float64),
            token_offsets=_of_type(reply.token_offsets, np.int64),
            ngram_lengths=_of_type(reply.ngram_lengths, np.int32),
        )

    async def score_response(
        self,
        prepared: PreparedScoring,
        model: str,
        bias: Sequence[BiasMatch] | None = None,
        deadline: float | None = None,
    ) -> bytes:
        work = p.scoring_work(prepared)
        found = None if bias is None else [p.BiasFound(b.boost, list(b.phrases)) for b in bias]
        reply = await self._live().call(
            lambda rid: p.ScoreResponseCall(rid, work, model, found, deadline), p.ScoreReply
        )
        return reply.response

    async def prefix_totals(
        self,
        ids: npt.NDArray[np.integer],
        offsets: npt.NDArray[np.integer],
        *,
        eos: bool,
        deadline: float | None = None,
    ) -> PrefixTotals:
        call = p.PrefixTotalsCall
        reply = await self._live().call(
            lambda rid: call(rid, p.Array.of(ids), p.Array.of(offsets), eos, deadline),
            p.PrefixTotalsReply,
        )
        return PrefixTotals(reply.totals.of_type(np.float64), reply.computed)

    def generate(self, request: GenerationRequest) -> GenerationStream:
        return self._live().open_stream(request)

    async def beam_search(
        self, prompt_ids: Sequence[int], params: BeamParams, deadline: float | None
    ) -> list[Hypothesis]:
        ids = [int(i) for i in prompt_ids]
        reply = await self._live().call(
            lambda rid: p.BeamSearchCall(rid, ids, params, deadline), p.BeamSearchReply
        )
        return list(reply.hypotheses)

    async def rescore_lattices(
        self,
        lattices: Sequence[TokenLattice],
        params: LatticeParams,
        deadline: float | None = None,
    ) -> list[RescoredPaths]:
        batch = list(lattices)
        reply = await self._live().call(
            lambda rid: p.RescoreLatticesCall(rid, batch, params, deadline),
            p.RescoreLatticesReply,
        )
        return list(reply.results)

    async def complete(self, edit: CompleteEdit) -> CompleteAnswer:
        reply = await self._live().call(lambda rid: p.CompleteCall(rid, edit), p.CompleteReply)
        return reply.answer

    async def fuse(self, session: int, step: FuseStep) -> FuseAnswer:
        reply = await self._live().call(lambda rid: p.FuseCall(rid, session, step), p.FuseReply)
        return reply.answer()

    def fuse_close(self, session: int) -> None:
        # Moot when the worker is gone (its states went with it): never raises.
        with contextlib.suppress(ModelUnavailable):
            self._live().notify(p.FuseClose(session))


def _of_type(array: p.Array | None, dtype: type[G]) -> npt.NDArray[G] | None:
    return None if array is None else array.of_type(dtype)
