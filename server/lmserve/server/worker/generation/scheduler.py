"""Continuous batching: one scheduler per model steps every active sequence in one batched call.

    scheduler = GenerationScheduler(name, stepper, vocab, GenerationLimits.of(settings), stats)
    stream = scheduler.submit(GenerationRequest(prompt_ids, params, deadline))
    async for event in stream: ...               # TokenEvent per token, FinishEvent per sample

The loop (after Orca, Yu et al., 2022, and vLLM's scheduler) runs in one thread per model so the
event loop keeps streaming while the model computes. Every iteration:
1. admits waiting requests while slots are free (`admission.Admission`);
2. reads at most `prefill_chunk_tokens` tokens of the admitted prompts (`prefill.Prefill`, one
   batched call); prompts read to the end join the batch, each of a request's `n` samples from
   a copy of the prompt's state; a long prompt is read over several iterations, so running
   streams get a token between its chunks;
3. drops sequences whose stream was cancelled or whose deadline passed: they leave before the
   step, so a client that went away costs nothing more; parks the sequences of streams whose
   reader fell more than `max_unread_events` behind, and lets drained ones rejoin
   (`backpressure.Parking`: a slow reader pauses its sequences, they keep their slots);
4. draws the next token of every active sequence from its row of the batch's distributions
   (vectorised, with each sequence's own seeded generator, so a seeded request gives the same
   tokens alone or batched with any others), detokenizes, checks stop conditions, removes
   finished sequences (`batch.RunningBatch`); a request whose row holds NaN/inf fails alone;
5. posts the new events to the streams (one hand-over to the event loop per iteration,
   `delivery.Poster`) and advances the remaining sequences with ONE `Stepper.step`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable

from lmserve.server.backends.base import Vocabulary
from lmserve.server.backends.stepping import Stepper
from lmserve.server.decoding.detokenize import Detokenizer, WordDetokenizer
from lmserve.server.decoding.stopping import FinishReason
from lmserve.server.errors import Overloaded
from lmserve.server.logging_setup import log_failure
from lmserve.server.settings import GenerationLimits
from lmserve.server.shared.stats import EngineStats
from lmserve.server.worker.foreground import Foreground, lower_this_thread
from lmserve.server.worker.generation.admission import Admission
from lmserve.server.worker.generation.backpressure import Parking
from lmserve.server.worker.generation.batch import (
    ActiveSequence,
    RunningBatch,
    expired,
    finish_event,
    output_error,
)
from lmserve.server.worker.generation.context_window import ContextWindow
from lmserve.server.worker.generation.delivery import Items, Poster
from lmserve.server.worker.generation.prefill import Prefill
from lmserve.server.worker.generation.sequence import Event, GenerationRequest, GenerationStream
from lmserve.server.worker.retry_estimate import slot_delay

__all__ = ["GenerationScheduler"]

# Longest a step waits for the model's scoring passes and session steps (interactive first,
# `foreground`): generation slows while they run, it never stops.
FOREGROUND_WAIT_SECONDS = 0.05
# How often an otherwise idle scheduler looks at its parked streams (drained, deadline passed).
PARKED_POLL_SECONDS = 0.05

log = logging.getLogger(__name__)


class GenerationScheduler:
    """Steps every active sequence of one model together; requests join and leave between steps.

    `submit` is called on the event loop; everything else of the loop runs in this scheduler's
    own thread. `steps` counts batched `Stepper.step` calls and `active` the sequences being
    stepped (both for tests and metrics).
    """

    def __init__(
        self,
        model: str,
        stepper: Stepper,
        vocab: Vocabulary,
        limits: GenerationLimits,
        stats: EngineStats | None = None,
        detokenizer: Callable[[], Detokenizer] | None = None,
        *,
        poster: Poster | None = None,
        foreground: Foreground | None = None,
        window: ContextWindow | None = None,
    ) -> None:
        self.model = model
        self.stepper = stepper
        self.vocab = vocab
        self.limits = limits
        self.stats = stats = stats if stats is not None else EngineStats(model)
        # Each sample gets a fresh detokenizer of the model's codec (words by default).
        make_detokenizer = detokenizer or (lambda: WordDetokenizer(vocab))
        self._batch = RunningBatch(model, stepper, vocab, make_detokenizer, stats)
        self._prefill = Prefill(stepper, vocab.bos_id, limits.prefill_chunk_tokens)
        # The model's positions and cache budget (`context_window`, from its family).
        self.window = window or ContextWindow()
        self._admission = Admission(model, limits, self._retry_after, self.window)
        self._parking = Parking(limits.max_unread_events, self._wake, stats)
        self._cond = threading.Condition()
        self._closed = False
        # Prefilling samples hold their slots; read by `submit` on the event loop.
        self._prefilling = 0
        self._poster = poster or Poster(courier=stepper.releases_gil, name=f"lmserve-post-{model}")
        # The model's scoring passes and session steps go first (`foreground`).
        self._foreground = foreground or Foreground()
        self._set_pending(0)
        self._thread = threading.Thread(
            target=self._run, name=f"lmserve-generate-{model}", daemon=True
        )
        self._thread.start()

    @property
    def active(self) -> list[ActiveSequence]:
        return self._batch.sequences

    @property
    def steps(self) -> int:
        return self._batch.steps

    @property
    def parked(self) -> list[GenerationStream]:
        """Streams whose sequences wait for their reader (backpressure)."""
        return self._parking.streams

    @property
    def parks(self) -> int:
        """Times a stream was parked so far."""
        return self._parking.parks

    @property
    def prefilled_tokens(self) -> int:
        """Prompt tokens read so far (`<s>` included)."""
        return self._prefill.fed_tokens

    # -- the event loop's side -------------------------------------------------------------

    def submit(
        self,
        request: GenerationRequest,
        make_stream: Callable[[GenerationRequest, int], GenerationStream] | None = None,
    ) -> GenerationStream:
        """Queues a request; Overloaded when it would have to wait and the queue is full (or
        the scheduler is closing). Call on the event loop. `make_stream` makes its stream
        (an engine worker's carries the front's id)."""
        self._poster.loop = asyncio.get_running_loop()
        request.params = self.window.fit(request.params, len(request.prompt_ids))
        stream = (make_stream or GenerationStream)(request, request.params.n)
        with self._cond:
            if self._closed:
                raise Overloaded(f"the generation scheduler of {self.model!r} is shutting down")
            self._admission.offer(stream, self._occupied(), self._cache_bytes())
            self._set_pending(len(self._admission.waiting))
            self._cond.notify()
        return stream

    def _retry_after(self, waiting: int) -> float:
        """Seconds until `waiting` slots free at the recent step time (a refused Generate's
        RetryInfo). Parked samples count: they hold slots too. Runs on the event loop with
        `_cond` held (`submit`) while the scheduler thread steps: reads a copy of the batch."""
        running = list(self._batch.sequences) + self._parking.sequences
        remaining = [seq.request.params.stopping.max_new_tokens - seq.generated for seq in running]
        return slot_delay(remaining, waiting, self._batch.step_seconds)

    def _wake(self) -> None:
        """A parked stream drained (called on the event loop): look at it now."""
        with self._cond:
            self._cond.notify()

    @property
    def pending(self) -> int:
        return len(self._admission.waiting)

    def close(self, timeout: float | None = 5.0) -> None:
        """Stops the thread; requests still waiting or active end with CANCELLED."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout)
        self._poster.close()

    # -- the scheduler thread --------------------------------------------------------------

    def _occupied(self) -> int:
        """Slots held: running, parked, and prompts being read. Call with `_cond`."""
        return len(self._batch) + self._prefilling + self._parking.samples

    def _cache_bytes(self) -> int:
        """Key/value cache reserved by running, parked and prefilling samples (0 without a
        budget). Call with `_cond`; reads copies (the scheduler thread changes the lists)."""
        window = self.window
        if not window.max_cache_bytes:
            return 0
        running = list(self._batch.sequences) + self._parking.sequences
        held = sum(s.request.cache_bytes(window, 1) for s in running)
        reading = list(self._prefill.pending)
        held += sum(r.stream.request.cache_bytes(window, r.stream.samples) for r in reading)
        self.stats.cache_bytes_reserved = held
        return held

    def _run(self) -> None:
        lower_this_thread()  # every other thread of the model (and the front) first
        batch, prefill, parking = self._batch, self._prefill, self._parking
        while True:
            with self._cond:
                self._cache_bytes()  # the gauge follows samples that finished
                while not (
                    self._closed
                    or self._admission.waiting
                    or batch
                    or prefill.pending
                    or (parking and parking.due(time.monotonic()))
                ):
                    self._cond.wait(PARKED_POLL_SECONDS if parking else None)
                if self._closed:
                    break
                admitted = self._admission.take(self._occupied(), self._cache_bytes())
                if admitted:
                    self._set_pending(len(self._admission.waiting))
                    prefill.add(admitted)
                    self._prefilling = prefill.samples
            self._foreground.wait_idle(FOREGROUND_WAIT_SECONDS)
            try:
                self._iterate()
            except Exception as exc:  # a model or decoding bug: fail these streams, keep serving
                log_failure(log, f"generation step of {self.model}", exc)
                self._fail_all(exc)
        self._shutdown()

    def _iterate(self) -> None:
        batch, prefill = self._batch, self._prefill
        now_mono = time.monotonic()
        if prefill.pending:
            self._drop_prefilling(now_mono)
            # While sequences run, a chunk takes about a share of their step's time (where a
            # chunk's time grows with its tokens: not for an n-gram model's ids).
            timed = batch.steps and batch and getattr(self.stepper, "costly_prompts", True)
            share = self.limits.prefill_step_share
            ready = prefill.advance(share * batch.step_seconds if timed else None)
            with self._cond:  # the slots move from prefilling to running at once (`submit`)
                if ready is not None:
                    batch.join(ready.streams, ready.log_probs, ready.state)
                self._prefilling = prefill.samples
        if self._parking:
            with self._cond:
                ended = self._parking.release(batch, now_mono)
            self._poster.post_events(ended)
        if not batch:
            return
        self._poster.post_events(batch.drop_gone(now_mono))
        with self._cond:
            self._parking.park(batch)
        if not batch:
            return
        events, failed = batch.draw()
        if failed:
            for stream in failed:
                stream.cancel()  # its other samples (if any) leave too
            self._poster.post([(s, output_error(s)) for s in failed])
        # Posted before the step; with a courier the event loop streams them during it.
        self._poster.post_events(events)
        batch.step()

    def _drop_prefilling(self, now_mono: float) -> None:
        """Prompts of cancelled streams stop being read; a passed deadline ends the samples."""
        gone = {
            r.stream
            for r in self._prefill.pending
            if r.stream.cancelled or expired(r.stream, now_mono)
        }
        if not gone:
            return
        self._prefill.remove(gone)
        self._poster.post_events(
            {
                s: [finish_event(s, k, FinishReason.CANCELLED) for k in range(s.samples)]
                for s in gone
                if not s.cancelled
            }
        )

    def _fail_all(self, exc: BaseException) -> None:
        streams = {seq.stream: None for seq in self._batch.clear()}
        with self._cond:
            streams.update({seq.stream: None for seq in self._parking.clear()})
        streams.update({r.stream: None for r in self._prefill.pending})
        self._prefill.pending = []
        with self._cond:
            self._prefilling = 0
        self._poster.post([(s, exc) for s in streams])

    def _shutdown(self) -> None:
        now = time.perf_counter()
        items: Items = []
        by_stream: dict[GenerationStream, list[Event]] = {}
        with self._cond:
            parked = self._parking.clear()
        for seq in self._batch.clear() + parked:
            by_stream.setdefault(seq.stream, []).append(
                seq.finish_event(FinishReason.CANCELLED, now)
            )
        for reading in self._prefill.pending:
            stream = reading.stream
            by_stream[stream] = [
                finish_event(stream, k, FinishReason.CANCELLED) for k in range(stream.samples)
            ]
        self._prefill.pending = []
        for stream, new in by_stream.items():
            held = stream.hold(new)  # always handed over: it ends samples
            if held:
                items.append((stream, held))
        with self._cond:
            waiting = self._admission.drain()
        items.extend((s, Overloaded("the server is shutting down")) for s in waiting)
        self._poster.post(items)

    def _set_pending(self, count: int) -> None:
        self.stats.pending_requests = count
