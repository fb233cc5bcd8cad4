"""The work items of the scoring queue: a scoring request cut into units, or a generator job.

Both are resolved from the worker thread onto the caller's event loop (`resolve`).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from lmserve.server.backends.base import BatchScores
from lmserve.server.decoding.scoring import PreparedScoring
from lmserve.server.worker.handoff import settle


@dataclass(eq=False)  # identity: two jobs with equal texts are still two jobs
class Job:
    """One request's scoring: its units still to run and the results gathered so far."""

    prepared: PreparedScoring
    deadline: float | None
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[BatchScores]
    units: deque[np.ndarray]
    totals: np.ndarray
    token_log_probs: np.ndarray | None
    ngram_lengths: np.ndarray | None
    token_offsets: np.ndarray | None
    tokens: int
    enqueued: float = field(default_factory=time.perf_counter)
    cancelled: bool = False
    # Passes run since this request was last served (shortest-first with a bound).
    skipped: int = 0
    # Positions not yet handed to a pass.
    remaining: int = 0
    # The thread whose passes serve it once one did (the main one, 0, or the interactive
    # lane, 1): two threads never run units of one request.
    lane: int | None = None

    def __post_init__(self) -> None:
        self.remaining = self.tokens

    def width(self, unit: np.ndarray) -> int:
        """The unit's longest text (scored positions)."""
        lengths = self.prepared.lengths
        return int(lengths[unit].max()) if len(unit) else 0

    def take(self) -> np.ndarray:
        """The next unit; the work left shrinks by its positions."""
        unit = self.units.popleft()
        self.remaining -= len(unit) * max(self.width(unit), 1)
        return unit

    @property
    def key(self) -> tuple[bool, bool]:
        options = self.prepared.options
        return options.bos, options.eos

    def expired(self, now: float) -> bool:
        return self.deadline is not None and now >= self.deadline


@dataclass(eq=False)
class StepJob:
    """Work that runs as a generator: each `next()` is one unit (e.g. one batched step of
    prefix-shared scoring); it takes its turns like a scoring request."""

    steps: Iterator[None]
    deadline: float | None
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[None]
    tokens: int
    enqueued: float = field(default_factory=time.perf_counter)
    cancelled: bool = False
    skipped: int = 0
    # Busy time of its steps so far (its throughput is measured when it ends).
    seconds: float = 0.0
    lane: int | None = 0  # the main thread's always

    @property
    def remaining(self) -> int:
        return self.tokens

    def expired(self, now: float) -> bool:
        return self.deadline is not None and now >= self.deadline


def resolve(job: Job | StepJob, outcome: BatchScores | BaseException | None) -> None:
    """Hands the outcome to the waiting coroutine on its loop (from the worker thread): a
    `Job`'s scores, a `StepJob`'s end (None), or the exception either raises."""
    if isinstance(job, Job):
        assert outcome is not None, "a scoring job ends with its scores"
        settle(job.loop, job.future, outcome)
    else:
        assert not isinstance(outcome, BatchScores), "a step job ends with None"
        settle(job.loop, job.future, outcome)
