"""BeamSearch through the engine: searches on a bounded pool of the model's own threads,
stopped within one step when nobody waits for them any more.

    runner = BeamRunner(model, stepper, limits)        # one per model (the ServedModel's)
    hypotheses = await runner.run(prompt_ids, params, deadline)   # deadline: time.monotonic()
    runner.close()                                     # never waits for running searches

`asyncio.to_thread(beam_search, ...)` could not be stopped: timed-out searches kept both cores
busy for 30 s, and shutdown waited behind them in the default executor. Here each search polls
a stop flag before every step (`beam_search(should_stop=...)`): cancelling the awaiting
coroutine, passing the deadline, or closing the runner ends it after the step in progress.
At most `max_running_searches` run at once; up to `max_queued_searches` more wait in arrival
order; beyond that `run` raises Overloaded, with a retry delay of the time the searches ahead
need at the recently measured search time (`retry_estimate`). The threads are daemons, started
on first use.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from collections.abc import Sequence

from lmserve.server.backends.stepping import Stepper
from lmserve.server.decoding.beam import Hypothesis, beam_search
from lmserve.server.decoding.params import BeamParams
from lmserve.server.errors import Cancelled, DeadlineExceeded, Overloaded
from lmserve.server.settings import GenerationLimits
from lmserve.server.worker.generation.context_window import ContextWindow
from lmserve.server.worker.handoff import settle
from lmserve.server.worker.retry_estimate import Throughput, drain_delay

BeamHypothesis = Hypothesis


class _Job:
    """One search: what to run, where to answer, and the flag that stops it."""

    __slots__ = ("prompt_ids", "params", "deadline", "loop", "future", "stopped")

    def __init__(
        self,
        prompt_ids: Sequence[int],
        params: BeamParams,
        deadline: float | None,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.prompt_ids = list(prompt_ids)
        self.params = params
        self.deadline = deadline
        self.loop = loop
        self.future: asyncio.Future[list[Hypothesis]] = loop.create_future()
        self.stopped = False  # set by the event loop (cancel) or close(); read between steps

    def should_stop(self) -> bool:
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise DeadlineExceeded("BeamSearch did not finish before the deadline")
        return self.stopped

    def answer(self, result: list[Hypothesis] | BaseException) -> None:
        """Hands the outcome to the awaiting coroutine (from any thread)."""
        settle(self.loop, self.future, result)


class BeamRunner:
    """Runs one model's beam searches; see the module docstring."""

    def __init__(
        self,
        model: str,
        stepper: Stepper,
        limits: GenerationLimits,
        window: ContextWindow | None = None,
    ) -> None:
        self.model = model
        self.stepper = stepper
        self.limits = limits
        # Searches stop at the model's last position (`context_window`, from its family).
        self.window = window or ContextWindow()
        self._waiting: deque[_Job] = deque()
        self._running: set[_Job] = set()
        self._cond = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._closed = False
        # Searches finished per busy second of one thread.
        self.throughput = Throughput()

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    async def run(
        self, prompt_ids: Sequence[int], params: BeamParams, deadline: float | None = None
    ) -> list[Hypothesis]:
        """The search's hypotheses, best first. Overloaded when too many searches wait;
        DeadlineExceeded when `deadline` (a `time.monotonic()` instant) passes first;
        cancelling this coroutine stops the search after its current step."""
        params = self.window.fit_beam(params, len(prompt_ids))
        job = _Job(prompt_ids, params, deadline, asyncio.get_running_loop())
        with self._cond:
            if self._closed:
                raise Overloaded(f"the beam searches of {self.model!r} are shutting down")
            busy = len(self._running) + len(self._waiting)
            if busy >= self.limits.max_running_searches + self.limits.max_queued_searches:
                raise Overloaded(
                    f"{len(self._waiting)} BeamSearch requests already wait for model "
                    f"{self.model!r} (max_queued_searches); retry later",
                    limit="max_queued_searches",
                    model=self.model,
                    retry_after=self.retry_after(),
                )
            self._waiting.append(job)
            self._start_threads()
            self._cond.notify()
        try:
            return await job.future
        finally:
            job.stopped = True  # no-op when finished; stops a search nobody awaits
            # A cancelled one still waiting frees its place in the queue (the await cancelled
            # the future too, so `done()` cannot tell it from a finished one).
            if job.future.cancelled():
                with self._cond, contextlib.suppress(ValueError):
                    self._waiting.remove(job)

    def retry_after(self) -> float:
        """Seconds until the searches waiting now and one more could start: they finish at
        `max_running_searches` times one thread's recent rate."""
        rate = self.throughput.rate
        finishing = None if rate is None else rate * self.limits.max_running_searches
        return drain_delay(len(self._waiting) + 1, finishing)

    def close(self) -> None:
        """Stops every search after its current step and fails those waiting; returns at once
        (the threads are daemons and end on their own)."""
        with self._cond:
            self._closed = True
            waiting, self._waiting = list(self._waiting), deque()
            for job in self._running:
                job.stopped = True
            self._cond.notify_all()
        for job in waiting:
            job.answer(Overloaded("the server is shutting down"))

    def join(self, timeout: float) -> None:
        """Waits (at most `timeout` s in all) for running searches to stop after `close`
        (within a step each)."""
        deadline = time.monotonic() + timeout
        for thread in list(self._threads):
            thread.join(max(0.0, deadline - time.monotonic()))

    def _start_threads(self) -> None:
        """Call with `_cond` held: one more worker while fewer than the limit exist and jobs
        outnumber idle workers."""
        idle = len(self._threads) - len(self._running)
        if len(self._threads) < self.limits.max_running_searches and idle < len(self._waiting):
            thread = threading.Thread(
                target=self._work,
                name=f"lmserve-beam-{self.model}-{len(self._threads)}",
                daemon=True,
            )
            self._threads.append(thread)
            thread.start()

    def _take(self) -> _Job | None:
        with self._cond:
            while True:
                if self._closed:
                    return None
                while self._waiting:
                    job = self._waiting.popleft()
                    if not job.stopped:
                        self._running.add(job)
                        return job
                self._cond.wait()

    def _work(self) -> None:
        while True:
            job = self._take()
            if job is None:
                return
            started = time.perf_counter()
            try:
                result: list[Hypothesis] | BaseException = beam_search(
                    self.stepper, job.prompt_ids, job.params, should_stop=job.should_stop
                )
                self.throughput.record(1, time.perf_counter() - started)
            except Cancelled as exc:
                # Nobody awaits a cancelled search; a closing runner tells its caller why.
                result = Overloaded("the server is shutting down") if self._closed else exc
            except Exception as exc:  # a model bug fails this search only
                result = exc
            finally:
                with self._cond:
                    self._running.discard(job)
            job.answer(result)
