"""Bounded, fair scoring work: every request is cut into units, units run one pass at a time.

    queue = ScoringQueue("kjv-lstm", backend, ScoringLimits(scoring_unit_tokens=256), stats)
    scores = await queue.score(prepared, deadline)   # BatchScores of the whole request

Why units: a recurrent model scores a pass of `rows x padded length` positions at once and
materialises `rows x min(length, max_chunk_tokens) x vocabulary` log-probabilities, so one big
request in one pass holds the model for seconds and can take gigabytes. Here a request's texts
are sorted by length and cut into units of at most `unit_tokens` positions (rows times the
unit's longest text), so a pass costs at most that, whatever the request; a text longer than a
unit is a unit of its own and the backend walks it in time chunks (memory bounded by the chunk).

Fairness: one worker thread per model runs the passes, shortest first: each pass starts with
the request that has the least work left, so a one-sentence Score that arrives behind a
400-line Score waits for the pass in flight only, never for the whole long request; a request
passed over `MAX_SKIPS` times in a row goes next whatever its size, so a long request keeps
at least one pass in `MAX_SKIPS + 1` under any load. Small requests (whose remaining work fits
one unit) with the same options and similar lengths ride in the same pass while it stays within
`unit_tokens`, so concurrent small requests share forward passes, batched by length; a long
request's units never ride in another's pass (they would only make it slower).

The interactive lane (neural models): a pass of a long request holds the model for tens of
milliseconds, and a one-sentence Score that arrives during it would wait for all of it. A second
thread takes only interactive requests (a few units at most), and only while the main thread
runs a long request's pass: the short pass runs beside the long one (ONNX Runtime and torch run
concurrent calls on one session), so a small request waits for no long pass, only for the
cores. A request's units all run on the thread that took its first one.

Cancellation and deadlines: a request whose caller went away or whose deadline passed is
dropped before its next unit. n-gram work that is cheaper than a hop (a few thousand lookups,
tens of microseconds) never comes here: `ServedModel` runs it in the front
(`ScoringLimits.runs_inline`); n-gram and neural models have their own queues, so n-gram work
never queues behind neural work.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Iterator

import numpy as np

from lmserve.server.backends.base import BatchScores, LanguageModelBackend
from lmserve.server.decoding.scoring import PreparedScoring
from lmserve.server.errors import DeadlineExceeded, ModelUnavailable, Overloaded
from lmserve.server.logging_setup import log_failure
from lmserve.server.settings import ScoringSettings
from lmserve.server.shared.stats import EngineStats
from lmserve.server.worker.foreground import Foreground
from lmserve.server.worker.retry_estimate import Throughput, drain_delay
from lmserve.server.worker.scoring.jobs import Job, StepJob, resolve
from lmserve.server.worker.scoring.units import concat, cut_units, gather

log = logging.getLogger(__name__)

# A request passed over this many passes in a row is served next, whatever its size: small
# requests go first, and a long one still gets at least one pass in MAX_SKIPS + 1.
MAX_SKIPS = 3
# Requests of at most this many units are interactive: generation steps wait for their passes.
INTERACTIVE_UNITS = 4


class ScoringLimits(ScoringSettings):
    """How big one pass may be and how much work may wait: the settings' `ScoringSettings`
    (which own the defaults), and the engine's own inline bound."""

    # Requests up to this many positions on a model that runs inline (n-gram) skip the queue
    # (not a setting: where a hop costs more than the lookups).
    inline_tokens: int = 8192

    def interactive(self, tokens: int) -> bool:
        """Whether a request is small enough that its passes go before generation steps (a
        few units: a caller waits for it as a whole); a long one runs beside them."""
        return tokens <= INTERACTIVE_UNITS * self.scoring_unit_tokens

    def runs_inline(self, neural: bool, tokens: int) -> bool:
        """Whether scoring `tokens` positions costs less than handing them to a thread or a
        worker process: n-gram lookups in the C kernel, a few thousand of them (tens of
        microseconds, against 50-100 us for a hop). Never a neural model's passes."""
        return not neural and tokens <= self.inline_tokens


class ScoringQueue:
    """One model's scoring work, run in bounded units by one worker thread (see module doc)."""

    def __init__(
        self,
        model: str,
        backend: LanguageModelBackend,
        limits: ScoringLimits,
        stats: EngineStats | None = None,
        *,
        foreground: Foreground | None = None,
        interactive_lane: bool = False,
    ) -> None:
        self.model = model
        self.backend = backend
        self.limits = limits
        self.stats = stats = stats if stats is not None else EngineStats(model)
        # Bound once: every pass records its rows and its requests' waits.
        self._batch_size = stats.batch_size
        self._queue_duration = stats.queue_duration
        # Generation steps of the same model wait while a pass runs (interactive first).
        self._foreground = foreground or Foreground()
        self._jobs: deque[Job | StepJob] = deque()
        self._queued_tokens = 0
        self._cond = threading.Condition()
        self._closed = False
        self.passes = 0  # forward passes run (tests, metrics)
        # Positions scored per busy second: a refused caller is told how long the queue needs.
        self.throughput = Throughput()
        # Set while the main thread runs a long request's pass: the lane may run beside it.
        self._long_pass = False
        self._thread = threading.Thread(
            target=self._run, name=f"lmserve-score-{model}", daemon=True
        )
        self._thread.start()
        self._lane: threading.Thread | None = None
        if interactive_lane:
            self._lane = threading.Thread(
                target=self._run_lane, name=f"lmserve-score-lane-{model}", daemon=True
            )
            self._lane.start()

    # -- the caller's side -------------------------------------------------------------------

    async def score(self, prepared: PreparedScoring, deadline: float | None = None) -> BatchScores:
        """The backend's scores for a prepared request; raises DeadlineExceeded, Overloaded."""
        job = self._job(prepared, deadline, prepared.scored_tokens)
        self._enqueue(job)
        try:
            return await job.future
        finally:
            job.cancelled = True  # no-op once done; a caller that left frees its units

    async def run_steps(
        self, steps: Iterator[None], tokens: int, deadline: float | None = None
    ) -> None:
        """Runs a generator of units on the worker, one unit per turn (see `StepJob`);
        `tokens` is the work it stands for, counted against `scoring_max_queued_tokens`."""
        loop = asyncio.get_running_loop()
        job = StepJob(steps, deadline, loop, loop.create_future(), tokens)
        self._enqueue(job)
        try:
            await job.future
        finally:
            job.cancelled = True

    def _enqueue(self, job: Job | StepJob) -> None:
        tokens = job.tokens
        with self._cond:
            if self._closed:
                raise ModelUnavailable(f"model {self.model!r} is shutting down")
            if (
                self._queued_tokens
                and self._queued_tokens + tokens > self.limits.scoring_max_queued_tokens
            ):
                raise Overloaded(
                    f"{self._queued_tokens} tokens of scoring already wait for model "
                    f"{self.model!r} and this request adds {tokens} (scoring_max_queued_tokens "
                    f"{self.limits.scoring_max_queued_tokens}); retry later",
                    limit="scoring_max_queued_tokens",
                    model=self.model,
                    retry_after=self.retry_after(),
                )
            self._jobs.append(job)
            self._queued_tokens += tokens
            self._cond.notify_all()  # the main thread, or the lane for a short request

    def _job(self, prepared: PreparedScoring, deadline: float | None, tokens: int) -> Job:
        batch = prepared.batch
        n = batch.batch_size
        lengths = prepared.lengths + (1 if prepared.options.eos else 0)
        token_offsets = None
        if prepared.per_token:
            token_offsets = np.zeros(n + 1, dtype=np.int64)
            np.cumsum(lengths, out=token_offsets[1:])
        loop = asyncio.get_running_loop()
        return Job(
            prepared=prepared,
            deadline=deadline,
            loop=loop,
            future=loop.create_future(),
            units=cut_units(
                lengths, self.limits.scoring_unit_tokens, self.limits.scoring_unit_rows
            ),
            totals=np.zeros(n, dtype=np.float64),
            token_log_probs=None if token_offsets is None else np.zeros(int(token_offsets[-1])),
            ngram_lengths=None,
            token_offsets=token_offsets,
            tokens=tokens,
        )

    @property
    def queued_tokens(self) -> int:
        return self._queued_tokens

    def retry_after(self) -> float:
        """Seconds the work waiting now needs at the recent throughput (`retry_estimate`)."""
        return drain_delay(self._queued_tokens, self.throughput.rate)

    def close(self) -> None:
        """Stops the worker after the pass in flight; waiting requests fail. Never blocks."""
        with self._cond:
            self._closed = True
            jobs, self._jobs = list(self._jobs), deque()
            self._cond.notify_all()
        for job in jobs:
            self._fail(job, ModelUnavailable(f"model {self.model!r} is shutting down"))

    def join(self, timeout: float) -> None:
        """Waits (at most `timeout` s) for the worker to finish its pass in flight after
        `close`: native model code must not run on while the interpreter shuts down."""
        deadline = time.monotonic() + timeout
        self._thread.join(timeout)
        if self._lane is not None:
            self._lane.join(max(0.0, deadline - time.monotonic()))

    # -- the worker thread ---------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._jobs:
                    self._cond.wait()
                if self._closed:
                    return
                picked = self._pick(0)
                if not picked:  # what waits belongs to the lane
                    self._cond.wait()
                    continue
                jobs = [picked] if isinstance(picked, StepJob) else [job for job, _ in picked]
                small = all(self.limits.interactive(job.tokens) for job in jobs)
                self._long_pass = not small
                if not small:
                    self._cond.notify_all()  # the lane may now serve short requests beside it
            try:
                self._serve(picked, jobs, small)
            finally:
                with self._cond:  # the lane may take what this pass's requests left
                    self._long_pass = False
                    self._cond.notify_all()

    def _run_lane(self) -> None:
        """The interactive lane (see the module doc): short requests beside a long pass."""
        while True:
            with self._cond:
                picked: list[tuple[Job, np.ndarray]] | StepJob = []
                while not self._closed:
                    # New requests while a long pass runs; its own ones to the end.
                    picked = self._pick(1, fresh=self._long_pass)
                    if picked:
                        break
                    self._cond.wait()
                if self._closed:
                    return
            jobs = [picked] if isinstance(picked, StepJob) else [job for job, _ in picked]
            self._serve(picked, jobs, True)
            with self._cond:  # the main thread may take what this pass's requests left
                self._cond.notify_all()

    def _serve(
        self,
        picked: list[tuple[Job, np.ndarray]] | StepJob,
        jobs: list[Job] | list[StepJob],
        small: bool,
    ) -> None:
        try:
            with self._foreground.busy() if small else contextlib.nullcontext():
                if isinstance(picked, StepJob):
                    self._run_step(picked)
                elif picked:
                    self._run_pass(picked)
        except Exception as exc:  # a bug here must not stop the worker or strand callers
            log.exception("scoring worker of %s", self.model)
            with self._cond:
                for job in jobs:
                    self._drop(job)
            for job in jobs:
                self._fail(job, exc)

    def _pick(self, lane: int, fresh: bool = True) -> list[tuple[Job, np.ndarray]] | StepJob:
        """The next pass of `lane` (0: the main thread; 1: the interactive lane, which takes
        interactive requests only): the head unit of the request with the least work left (one
        that was passed over `MAX_SKIPS` times in a row goes first instead), plus the units of
        small requests (whose whole remaining work is one unit) with the same options and
        similar lengths while the pass stays in bounds. A request another lane serves is left
        to it; `fresh` False takes only requests this lane already serves. Drops cancelled and
        expired requests. Call with `_cond` held."""
        now = time.monotonic()
        for job in list(self._jobs):
            if job.cancelled or job.future.done():
                self._drop(job)
            elif job.expired(now):
                self._drop(job)
                self._fail(job, DeadlineExceeded("Score did not finish before its deadline"))
        pool = [j for j in self._jobs if j.lane == lane or (fresh and j.lane is None)]
        if lane == 1:
            pool = [j for j in pool if isinstance(j, Job) and self.limits.interactive(j.tokens)]
        if not pool:
            return []
        starved = max(pool, key=lambda j: j.skipped)
        if starved.skipped >= MAX_SKIPS:
            first: Job | StepJob = starved
        else:
            first = min(pool, key=lambda j: j.remaining)
        for job in pool:
            job.skipped += 1
        first.skipped = 0
        if isinstance(first, StepJob):
            return first
        first.lane = lane
        picked = [(first, first.take())]
        width = first.width(picked[0][1])
        rows = len(picked[0][1])
        for job in pool:
            if not isinstance(job, Job) or job is first or job.key != first.key:
                continue
            if len(job.units) != 1:  # a long request's units never ride in others' passes
                continue
            head = job.units[0]
            head_width = job.width(head)
            wide = max(width, head_width, 1)
            if head_width > 2 * width + 8 or width > 2 * head_width + 8:
                continue
            if (rows + len(head)) * wide > self.limits.scoring_unit_tokens:
                continue
            if rows + len(head) > self.limits.scoring_unit_rows:
                continue
            picked.append((job, job.take()))
            job.skipped = 0
            job.lane = lane
            rows, width = rows + len(head), wide
        for job, _ in picked:
            if not job.units:
                self._drop(job)  # its last unit is in this pass
        return picked

    def _run_step(self, job: StepJob) -> None:
        """One unit of a generator job; its end (or failure) resolves the caller."""
        started = time.perf_counter()
        try:
            next(job.steps)
        except StopIteration:
            self.throughput.record(job.tokens, job.seconds + time.perf_counter() - started)
            with self._cond:
                self._drop(job)
            resolve(job, None)
            return
        except Exception as exc:  # noqa: BLE001 - the failure belongs to this request only
            log_failure(log, f"scoring step of {self.model}", exc)
            with self._cond:
                self._drop(job)
            resolve(job, exc)
            return
        self.passes += 1
        job.seconds += time.perf_counter() - started
        if job.enqueued:
            self._queue_duration.observe(started - job.enqueued)
            job.enqueued = 0.0

    def _drop(self, job: Job | StepJob) -> None:
        if job in self._jobs:
            self._jobs.remove(job)
            self._queued_tokens -= job.tokens

    def _run_pass(self, picked: list[tuple[Job, np.ndarray]]) -> None:
        """One forward pass over the picked units; results go to their requests' arrays."""
        started = time.perf_counter()
        jobs = [job for job, _ in picked]
        parts = [gather(job.prepared.batch, unit) for job, unit in picked]
        merged = parts[0] if len(parts) == 1 else concat(parts)
        bos, eos = jobs[0].key
        per_token = any(job.prepared.per_token for job in jobs)
        try:
            scores = self.backend.score(merged, bos=bos, eos=eos, per_token=per_token)
        except Exception as exc:  # noqa: BLE001 - the failure belongs to these requests only
            if len(picked) > 1:
                for item in picked:  # alone, so only the request that fails gets the error
                    self._run_pass([item])
                return
            log_failure(log, f"scoring pass of {self.model}", exc)
            self._fail(jobs[0], exc)
            with self._cond:
                self._drop(jobs[0])
            return
        self.passes += 1
        # Positions as `queued_tokens` counts them (`</s>` included): the merged batch's own.
        positions = len(merged.ids) + (merged.batch_size if eos else 0)
        self.throughput.record(positions, time.perf_counter() - started)
        self._record(jobs, started, merged.batch_size)
        row = 0
        for job, unit in picked:
            self._store(job, unit, scores, row)
            row += len(unit)
            if not job.units and not job.cancelled:
                self._finish(job)

    def _store(self, job: Job, unit: np.ndarray, scores: BatchScores, row: int) -> None:
        """Copies the unit's rows of a pass into the request's results (one gather, no
        per-text loop: a pass of short texts has hundreds)."""
        n = len(unit)
        job.totals[unit] = scores.totals[row : row + n]
        if job.token_offsets is None:
            return
        assert scores.token_offsets is not None and scores.token_log_probs is not None
        assert job.token_log_probs is not None
        src_starts = scores.token_offsets[row : row + n]
        lengths = scores.token_offsets[row + 1 : row + n + 1] - src_starts
        total = int(lengths.sum())
        if not total:
            return
        # Position j of text k: source src_starts[k] + j, destination job offset of text k + j.
        within = np.arange(total) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        source = np.repeat(src_starts, lengths) + within
        target = np.repeat(job.token_offsets[unit], lengths) + within
        job.token_log_probs[target] = scores.token_log_probs[source]
        if scores.ngram_lengths is not None:
            if job.ngram_lengths is None:
                job.ngram_lengths = np.zeros(len(job.token_log_probs), dtype=np.int32)
            job.ngram_lengths[target] = scores.ngram_lengths[source]

    def _finish(self, job: Job) -> None:
        result = BatchScores(
            totals=job.totals,
            token_log_probs=job.token_log_probs,
            token_offsets=job.token_offsets,
            ngram_lengths=job.ngram_lengths,
        )
        resolve(job, result)

    def _fail(self, job: Job | StepJob, exc: BaseException) -> None:
        resolve(job, exc)

    def _record(self, jobs: list[Job], started: float, rows: int) -> None:
        self._batch_size.observe(rows)
        queue = self._queue_duration
        for job in jobs:
            if job.enqueued:
                queue.observe(started - job.enqueued)
                job.enqueued = 0.0  # the wait before its first unit only
