"""The engine calls over a worker's connection: what `WorkerEngine` (the worker this front
started) and `RemoteWorkerEngine` (a worker another front started, `fronts: N`) share.

Each call is one typed message of `shared.protocol` and one typed reply; Score's whole response
and Generate's messages come back as wire bytes, built by the worker.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from lmserve.server.backends.base import BatchScores
from lmserve.server.decoding.beam import Hypothesis
from lmserve.server.decoding.bias import BiasMatch
from lmserve.server.decoding.params import BeamParams
from lmserve.server.decoding.scoring import PreparedScoring
from lmserve.server.front.workers.connection import WorkerConnection
from lmserve.server.shared import protocol as p
from lmserve.server.shared.edits import CompleteAnswer, CompleteEdit
from lmserve.server.worker.core import PrefixTotals
from lmserve.server.worker.generation.sequence import GenerationRequest, GenerationStream


class EngineCalls:
    """`ModelEngine`'s calls, carried over `_live()`'s connection (a subclass supplies it)."""

    def _live(self) -> WorkerConnection:
        raise NotImplementedError

    async def score(self, prepared: PreparedScoring, deadline: float | None = None) -> BatchScores:
        work = p.scoring_work(prepared)
        reply = await self._live().call(lambda rid: p.ScoreCall(rid, work, deadline))
        return BatchScores(
            totals=reply.totals.numpy(),
            token_log_probs=_numpy(reply.token_log_probs),
            token_offsets=_numpy(reply.token_offsets),
            ngram_lengths=_numpy(reply.ngram_lengths),
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
            lambda rid: p.ScoreResponseCall(rid, work, model, found, deadline)
        )
        response: bytes = reply.response
        return response

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
            lambda rid: call(rid, p.Array.of(ids), p.Array.of(offsets), eos, deadline)
        )
        return PrefixTotals(reply.totals.numpy(), reply.computed)

    def generate(self, request: GenerationRequest) -> GenerationStream:
        return self._live().open_stream(request)

    async def beam_search(
        self, prompt_ids: Sequence[int], params: BeamParams, deadline: float | None
    ) -> list[Hypothesis]:
        ids = [int(i) for i in prompt_ids]
        reply = await self._live().call(lambda rid: p.BeamSearchCall(rid, ids, params, deadline))
        hypotheses: list[Hypothesis] = reply.hypotheses
        return list(hypotheses)

    async def complete(self, edit: CompleteEdit) -> CompleteAnswer:
        reply = await self._live().call(lambda rid: p.CompleteCall(rid, edit))
        answer: CompleteAnswer = reply.answer
        return answer


def _numpy(array: p.Array | None) -> Any:
    return None if array is None else array.numpy()
