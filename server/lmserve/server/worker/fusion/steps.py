"""Stepping every Fuse stream of one model together: one stepper call per round.

    steps = FusionSteps("kjv-lstm", stepper)
    done = await steps.run(job)        # job.children / job.root filled, job.answer built

An external beam search (an ASR decoder) sends a message per frame and waits for its answer,
so what a message costs is its round's latency. One worker thread per model takes every
waiting message of every stream (up to `max_rows` extensions a call) and steps them in one
batch: the opening messages' roots in one `Stepper.prefill` (per `bos`), then every extension
in one `Stepper.step` over the parents' states, merged once per distinct parent and fanned out
with `select` (a parent with several children is one row of the merge, not several copies:
the stepper's own gather, which shares what its state allows). Each answer's arrays are built
on the same thread, so the event loop only moves ids.

A stepper with exact word lookups (`backends.stepping.WordLookup`: an n-gram model) is not
stepped: a hypothesis keeps its lookup state only, a round looks every child's token up from
its parent's state in one call, and an answer looks its candidates and `</s>` up the same way;
a whole distribution is computed only for the hypotheses an answer's `top_k` asks about, and
not kept. The values are the stepper's own, bit for bit.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from lmserve.server.backends.stepping import State, Stepper, WordLookup, word_lookup
from lmserve.server.logging_setup import log_failure
from lmserve.server.shared.fusion import FuseAnswer
from lmserve.server.worker.foreground import Foreground
from lmserve.server.worker.fusion.answers import top_k
from lmserve.server.worker.handoff import settle
from lmserve.server.worker.model_thread import ModelThread

log = logging.getLogger(__name__)

# A reference to the root this very message creates (in `FusionJob.parents` / `answered`).
ROOT = -1


@dataclass(eq=False, slots=True)
class Hypothesis:
    """A live hypothesis: its model state (a batch of one; with word lookups, its lookup
    state), its next-token distribution (float32 natural logs, the stepper's row; None with
    word lookups), log P(its token | parent) and its tokens after the start (positions it reads
    = depth + 1 with `<s>`)."""

    state: State
    log_probs: npt.NDArray[np.floating] | None
    token_log_prob: float
    depth: int


@dataclass(eq=False)
class FusionJob:
    """One message's model work. `parents[i]` is a live `Hypothesis` or `ROOT`; `answered`
    lists what the answer gives, in order: an int >= 0 is the i-th child, `ROOT` the new root,
    a `Hypothesis` an existing one."""

    bos: bool
    opens: bool
    parents: list[Hypothesis | int]
    tokens: list[int]
    answered: list[Hypothesis | int]
    candidates: list[int]
    top_k: int
    end: bool
    eos_id: int
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[FusionJob]
    root: Hypothesis | None = None
    children: list[Hypothesis] = field(default_factory=list)
    answer: FuseAnswer | None = None


class FusionSteps(ModelThread[FusionJob]):
    """One model's fusion work, batched on a worker thread (see the module doc)."""

    def __init__(
        self,
        model: str,
        stepper: Stepper,
        *,
        max_rows: int = 256,
        foreground: Foreground | None = None,
    ) -> None:
        super().__init__(model, f"lmserve-fusion-{model}")
        self.stepper = stepper
        # Exact lookups instead of distributions, where the stepper has them (n-gram).
        self.lookup = word_lookup(stepper)
        self.max_rows = max_rows
        # Generation steps of the same model wait while a decoder's frame is stepped.
        self._foreground = foreground or Foreground()
        self.calls = 0  # stepper calls made (tests, benchmarks)
        self.rows = 0  # extensions stepped

    async def run(self, job: FusionJob) -> FusionJob:
        """Steps `job` with whatever else waits; returns it filled in."""
        self._enqueue(job)
        return await job.future

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._waiting:
                    self._cond.wait()
                if self._closed:
                    return
                jobs = [self._waiting.popleft()]
                rows = len(jobs[0].tokens)
                # Whole messages only: a message's answer is one round's.
                while self._waiting and rows + len(self._waiting[0].tokens) <= self.max_rows:
                    rows += len(self._waiting[0].tokens)
                    jobs.append(self._waiting.popleft())
            try:
                with self._foreground.busy():
                    self._round(jobs)
            except Exception as exc:  # a model failure fails this round's messages only
                log_failure(log, f"fusion step of {self.model}", exc)
                for job in jobs:
                    settle(job.loop, job.future, exc)
                continue
            for job in jobs:
                settle(job.loop, job.future, job)

    def _round(self, jobs: list[FusionJob]) -> None:
        opening = [j for j in jobs if j.opens]
        if opening:
            self._open_roots(opening)
        extending = [j for j in jobs if j.tokens]
        if extending:  # (a stepper may not take an empty batch)
            self._extend(extending)
        for job in jobs:
            job.answer = _answer(job, self.lookup)

    def _open_roots(self, jobs: list[FusionJob]) -> None:
        """The roots: `<s>` read (or nothing, without bos), one prefill per `bos` value (with
        word lookups, the start state: no model work)."""
        if self.lookup is not None:
            for job in jobs:
                job.root = Hypothesis(self.lookup.lookup_start(bos=job.bos), None, 0.0, 0)
            return
        for bos in (True, False):
            group = [j for j in jobs if j.bos is bos]
            if not group:
                continue
            log_probs, state = self.stepper.prefill([[] for _ in group], bos=bos)
            self.calls += 1
            states = self.stepper.split(state)
            for k, job in enumerate(group):
                job.root = Hypothesis(states[k], np.array(log_probs[k]), 0.0, 0)

    def _extend(self, jobs: list[FusionJob]) -> None:
        """Every extension of the round in one step: each distinct parent merged once, then
        fanned out to its children's rows by `select`."""
        parents: list[Hypothesis] = []
        tokens: list[int] = []
        for job in jobs:
            for parent in job.parents:
                if isinstance(parent, int):
                    assert job.root is not None
                    parent = job.root
                parents.append(parent)
            tokens.extend(job.tokens)
        if self.lookup is not None:
            self._extend_by_lookup(self.lookup, jobs, parents, tokens)
            return
        stepper = self.stepper
        distinct: dict[int, int] = {}
        unique: list[Hypothesis] = []
        rows = []
        for parent in parents:
            slot = distinct.get(id(parent))
            if slot is None:
                slot = distinct[id(parent)] = len(unique)
                unique.append(parent)
            rows.append(slot)
        merged = unique[0].state if len(unique) == 1 else stepper.merge([h.state for h in unique])
        if len(unique) != len(parents):  # some parent has several children
            merged = stepper.select(merged, np.asarray(rows, dtype=np.int64))
        log_probs, state = stepper.step(np.asarray(tokens, dtype=np.int64), merged)
        self.calls += 1
        self.rows += len(tokens)
        states = [state] if len(tokens) == 1 else stepper.split(state)
        k = 0
        for job in jobs:
            for _ in job.tokens:
                parent, token = parents[k], tokens[k]
                assert parent.log_probs is not None
                child = Hypothesis(
                    states[k],
                    np.array(log_probs[k]),  # a copy: the batch's array is not kept
                    float(parent.log_probs[token]),
                    parent.depth + 1,
                )
                job.children.append(child)
                k += 1

    def _extend_by_lookup(
        self,
        lookup: WordLookup,
        jobs: list[FusionJob],
        parents: list[Hypothesis],
        tokens: list[int],
    ) -> None:
        """Every extension of the round in one lookup call: each child's token log-prob and
        state from its parent's state, no distribution."""
        log_probs, states = lookup.score_next([p.state for p in parents], tokens)
        self.calls += 1
        self.rows += len(tokens)
        k = 0
        for job in jobs:
            for _ in job.tokens:
                job.children.append(Hypothesis(states[k], None, log_probs[k], parents[k].depth + 1))
                k += 1


def _answer(job: FusionJob, lookup: WordLookup | None) -> FuseAnswer:
    """The message's answer, one row per answered hypothesis (see `FusionJob`)."""
    answered: list[Hypothesis] = []
    for ref in job.answered:
        if isinstance(ref, Hypothesis):
            answered.append(ref)
        elif ref == ROOT:
            assert job.root is not None
            answered.append(job.root)
        else:
            answered.append(job.children[ref])
    n = len(answered)
    token_lps = np.array([h.token_log_prob for h in answered], dtype=np.float64)
    if lookup is not None:
        return _answer_by_lookup(job, lookup, answered, token_lps)
    if n:
        rows = np.stack([_row(h) for h in answered])
    else:
        rows = np.empty((0, 0), dtype=np.float32)
    candidates = np.asarray(job.candidates, dtype=np.int64)
    cand = (
        rows[:, candidates].astype(np.float64)
        if n and len(candidates)
        else np.empty((n, len(candidates)))
    )
    if job.top_k and n:
        top_ids, top_lps = top_k(rows, job.top_k)
    else:
        top_ids, top_lps = np.empty((n, 0), dtype=np.int64), np.empty((n, 0))
    ends = (
        rows[:, job.eos_id].astype(np.float64) if job.end and n and job.eos_id >= 0 else np.zeros(n)
    )
    return FuseAnswer([], token_lps, cand, top_ids, top_lps, ends, 0)


def _row(hypothesis: Hypothesis) -> npt.NDArray[np.floating]:
    assert hypothesis.log_probs is not None
    return hypothesis.log_probs


def _answer_by_lookup(
    job: FusionJob,
    lookup: WordLookup,
    answered: list[Hypothesis],
    token_lps: npt.NDArray[np.float64],
) -> FuseAnswer:
    """`_answer` from lookup states: the candidates and `</s>` of every answered hypothesis in
    one lookup call; whole distributions only for a top k (computed here, not kept)."""
    n = len(answered)
    asked = list(job.candidates)
    end = job.end and job.eos_id >= 0
    if end:
        asked.append(job.eos_id)
    table = np.empty((n, len(asked)), dtype=np.float64)
    if n and asked:
        states = [h.state for h in answered for _ in asked]
        log_probs, _ = lookup.score_next(states, asked * n)
        table[:] = np.asarray(log_probs, dtype=np.float64).reshape(n, len(asked))
    cand = table[:, : len(job.candidates)]
    ends = table[:, -1].copy() if end else np.zeros(n)
    if job.top_k and n:
        rows = lookup.state_distributions([h.state for h in answered])
        top_ids, top_lps = top_k(rows, job.top_k)
    else:
        top_ids, top_lps = np.empty((n, 0), dtype=np.int64), np.empty((n, 0))
    return FuseAnswer([], token_lps, np.ascontiguousarray(cand), top_ids, top_lps, ends, 0)
