"""Continuous batching: one scheduler per model steps every active sequence in one batched call.

    pool = SchedulerPool(GenerationLimits(max_active_sequences=256, max_queued_requests=1024),
                         metrics)
    scheduler = pool.get(entry)                  # created on the model's first Generate
    stream = scheduler.submit(GenerationRequest(prompt_ids, params, deadline))
    async for event in stream: ...               # TokenEvent per token, FinishEvent per sample

The loop (after Orca, Yu et al., 2022, and vLLM's scheduler) runs in one thread per model so the
event loop keeps streaming while the model computes. Every iteration:
1. admits waiting requests while slots are free and prefills their prompts in one batched call
   (each of a request's `n` samples then starts from a copy of the prompt's state);
2. drops sequences whose stream was cancelled or whose deadline passed: they leave before the
   step, so a client that went away costs nothing more;
3. draws the next token of every active sequence from its row of the batch's distributions
   (vectorised, with each sequence's own seeded generator, so a seeded request gives the same
   tokens alone or batched with any others);
4. detokenizes, checks stop conditions, removes finished sequences;
5. posts the new events to the streams (one hand-over to the event loop per iteration) and
   advances the remaining sequences with ONE `Stepper.step` over the whole batch; for a model
   that steps without the GIL a courier thread wakes the event loop during the step, so the
   streaming overlaps the model's work (`_Courier`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from lmserve.server.backends.stepping import Stepper, make_stepper
from lmserve.server.decoding.detokenize import Detokenizer, WordDetokenizer
from lmserve.server.decoding.stopping import FinishReason
from lmserve.server.engine import decoding_bridge as bridge
from lmserve.server.engine.sequence import (
    Event,
    FinishEvent,
    GenerationRequest,
    GenerationStream,
    TokenEvent,
    Usage,
)
from lmserve.server.errors import Overloaded
from lmserve.server.metrics import Metrics

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GenerationLimits:
    """How many sequences one model steps together, how many requests may wait, and the
    per-request limits Generate and BeamSearch are validated against (from the settings)."""

    max_active_sequences: int = 256
    max_queued_requests: int = 1024
    max_new_tokens: int = 4096
    max_n: int = 16
    max_beam_width: int = 64
    max_top_logprobs: int = 20


class _Sequence:
    """One sample of one request, as the scheduler thread tracks it."""

    __slots__ = (
        "stream",
        "request",
        "sample_index",
        "decoder",
        "generated",
        "log_prob",
        "last_time",
        "first_time",
    )

    def __init__(self, stream: GenerationStream, sample_index: int, decoder: Any) -> None:
        self.stream = stream
        self.request = stream.request
        self.sample_index = sample_index
        self.decoder = decoder  # per-sample: generator, history, detokenizer, stop matcher
        self.generated = 0
        self.log_prob = 0.0
        self.last_time = 0.0
        self.first_time = 0.0

    def finish_event(self, reason: FinishReason, text: str, now: float) -> FinishEvent:
        started = self.request.arrived
        return FinishEvent(
            sample_index=self.sample_index,
            reason=reason,
            text=text,
            log_prob=self.log_prob,
            usage=Usage(
                prompt_tokens=len(self.request.prompt_ids),
                generated_tokens=self.generated,
                time_to_first_token_seconds=(self.first_time - started) if self.generated else 0.0,
                total_seconds=now - started,
            ),
        )


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
        vocab: Any,
        limits: GenerationLimits,
        metrics: Metrics | None = None,
        detokenizer: Callable[[], Detokenizer] | None = None,
    ) -> None:
        self.model = model
        self.stepper = stepper
        self.vocab = vocab
        # Each sample gets a fresh detokenizer of the model's codec (words by default).
        self._detokenizer = detokenizer or (lambda: WordDetokenizer(vocab))
        self.limits = limits
        self._metrics = metrics
        self._waiting: deque[GenerationStream] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self.active: list[_Sequence] = []
        self.steps = 0
        # For a model that steps without the GIL (ONNX Runtime, torch), events go to the event
        # loop through a courier thread, which wakes the loop while the model computes; for one
        # that keeps the GIL (the n-gram kernel) the hand-over would only add time (12% at one
        # stream, measured), so this thread posts them itself.
        self._courier = _Courier(f"lmserve-post-{model}") if stepper.releases_gil else None
        self._thread = threading.Thread(
            target=self._run, name=f"lmserve-generate-{model}", daemon=True
        )
        self._thread.start()

    # -- the event loop's side -------------------------------------------------------------

    def submit(self, request: GenerationRequest) -> GenerationStream:
        """Queues a request; Overloaded when the queue is full. Call on the event loop."""
        self._loop = asyncio.get_running_loop()
        samples = request.params.n
        stream = GenerationStream(request, samples)
        with self._cond:
            if self._closed:
                raise Overloaded(f"the generation scheduler of {self.model!r} is shutting down")
            queued = self._queued()
            if queued >= self.limits.max_queued_requests:
                raise Overloaded(
                    f"{queued} Generate requests already wait for model "
                    f"{self.model!r} (max_queued_requests); retry later"
                )
            self._waiting.append(stream)
            self._set_pending(len(self._waiting))
            self._cond.notify()
        return stream

    @property
    def pending(self) -> int:
        return len(self._waiting)

    def close(self, timeout: float | None = 5.0) -> None:
        """Stops the thread; requests still waiting or active end with CANCELLED."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout)
        if self._courier is not None:
            self._courier.close()

    # -- the scheduler thread --------------------------------------------------------------

    def _run(self) -> None:
        log_probs: npt.NDArray[Any] | None = None
        state: Any = None
        while True:
            with self._cond:
                while not self._closed and not self._waiting and not self.active:
                    self._cond.wait()
                if self._closed:
                    break
                admitted = self._admit()
            try:
                if admitted:
                    log_probs, state = self._prefill(admitted, log_probs, state)
                log_probs, state = self._drop_gone(log_probs, state)
                if self.active:
                    assert log_probs is not None
                    log_probs, state = self._iterate(log_probs, state)
            except Exception as exc:  # a model or decoding bug: fail these streams, keep serving
                log.exception("generation step of %s failed", self.model)
                self._fail_all(exc)
                log_probs, state = None, None
        self._shutdown()

    def _queued(self) -> int:
        """Waiting requests that the next admission would leave waiting (no free slot for
        them): those the scheduler thread has not picked up yet but will admit are not queued,
        so a burst that fits the free slots is never refused. Call with `_cond` held."""
        return len(self._waiting) - self._admissible()

    def _admissible(self) -> int:
        """How many waiting streams, from the front, the next admission takes: those that fit
        in the free slots (one at least when nothing runs); cancelled ones take no slot."""
        free = self.limits.max_active_sequences - len(self.active)
        taken = count = 0
        for stream in self._waiting:
            if stream.samples > free and (taken or self.active):
                break
            count += 1
            if not stream.cancelled:
                taken += 1
                free -= stream.samples
        return count

    def _admit(self) -> list[GenerationStream]:
        """Takes the admissible waiting streams (`_admissible`), less the cancelled ones."""
        taken = [self._waiting.popleft() for _ in range(self._admissible())]
        if taken:
            self._set_pending(len(self._waiting))
        return [stream for stream in taken if not stream.cancelled]

    def _prefill(
        self,
        streams: list[GenerationStream],
        log_probs: npt.NDArray[Any] | None,
        state: Any,
    ) -> tuple[npt.NDArray[Any], Any]:
        """Reads the new prompts in one batched call and appends their samples' rows."""
        prompt_lp, prompt_state = self.stepper.prefill([s.request.prompt_ids for s in streams])
        rows: list[int] = []
        for i, stream in enumerate(streams):
            for k, decoder in enumerate(
                bridge.new_decoders(stream.request, self.vocab, self._detokenizer)
            ):
                self.active.append(_Sequence(stream, k, decoder))
                rows.append(i)
        new_lp = prompt_lp[rows]
        new_state = self.stepper.select(prompt_state, np.asarray(rows, dtype=np.int64))
        if log_probs is None or state is None or len(self.active) == len(rows):
            return new_lp, new_state
        return (
            np.concatenate([log_probs, new_lp]),
            self.stepper.merge([state, new_state]),
        )

    def _drop_gone(
        self, log_probs: npt.NDArray[Any] | None, state: Any
    ) -> tuple[npt.NDArray[Any] | None, Any]:
        """Cancelled streams and passed deadlines leave before the step (their slot frees)."""
        if not self.active:
            return log_probs, state
        now_mono = time.monotonic()
        gone = [
            i
            for i, seq in enumerate(self.active)
            if seq.stream.cancelled
            or (seq.request.deadline is not None and now_mono >= seq.request.deadline)
        ]
        if not gone:
            return log_probs, state
        now = time.perf_counter()
        events: dict[GenerationStream, list[Event]] = {}
        for i in gone:
            seq = self.active[i]
            if not seq.stream.cancelled:  # deadline: tell the stream, which still listens
                text = bridge.final_text(seq.decoder)
                events.setdefault(seq.stream, []).append(
                    seq.finish_event(FinishReason.CANCELLED, text, now)
                )
        keep = sorted(set(range(len(self.active))) - set(gone))
        self._post_events(events)
        return self._keep(keep, log_probs, state)

    def _iterate(self, log_probs: npt.NDArray[Any], state: Any) -> tuple[npt.NDArray[Any], Any]:
        """Draws one token per active sequence, emits it, then steps the survivors once."""
        active = self.active
        drawn = bridge.sample(active, log_probs, self.vocab)
        now = time.perf_counter()
        events: dict[GenerationStream, list[Event]] = {}
        keep: list[int] = []
        next_tokens: list[int] = []
        metrics = self._metrics
        itl = metrics.inter_token_latency.labels(model=self.model) if metrics else None
        for i, seq in enumerate(active):
            token_id, token_lp, top = drawn.ids[i], drawn.log_probs[i], drawn.top[i]
            piece, finish = bridge.accept(seq.decoder, token_id, seq.generated + 1)
            seq.log_prob += token_lp
            if seq.generated == 0:
                seq.first_time = now
                if metrics is not None and seq.sample_index == 0:
                    metrics.time_to_first_token.labels(model=self.model).observe(
                        now - seq.request.arrived
                    )
            elif itl is not None:
                itl.observe(now - seq.last_time)
            seq.last_time = now
            out = events.setdefault(seq.stream, [])
            if piece is not None:  # None: a token that ends the sample and is not emitted
                out.append(
                    TokenEvent(seq.sample_index, seq.generated, token_id, piece, token_lp, top)
                )
                seq.generated += 1
            if finish is not None:
                out.append(seq.finish_event(finish, bridge.final_text(seq.decoder), now))
            else:
                keep.append(i)
                next_tokens.append(token_id)
        if metrics is not None:
            metrics.generated_tokens.labels(model=self.model).inc(len(active))
        log_probs_kept, state = self._keep(keep, log_probs, state)
        if not self.active:
            self._post_events(events)
            return log_probs_kept if log_probs_kept is not None else log_probs[:0], state
        # Posted before the step; with a courier the event loop streams them during it.
        self._post_events(events)
        new_lp, state = self.stepper.step(np.asarray(next_tokens, dtype=np.int64), state)
        self.steps += 1
        return new_lp, state

    def _keep(
        self, keep: Sequence[int], log_probs: npt.NDArray[Any] | None, state: Any
    ) -> tuple[npt.NDArray[Any] | None, Any]:
        """Keeps rows `keep` of the batch and updates the gauge."""
        if len(keep) == len(self.active):
            return log_probs, state
        self.active = [self.active[i] for i in keep]
        self._set_active(len(self.active))
        if not keep:
            return None, None
        rows = list(keep)
        kept_lp = None if log_probs is None else log_probs[rows]
        return kept_lp, self.stepper.select(state, np.asarray(rows, dtype=np.int64))

    # -- hand-over to the event loop -------------------------------------------------------

    def _post_events(self, events: dict[GenerationStream, list[Event]]) -> None:
        """Posts each stream's events once its `stream_interval` steps have gathered (at once
        when a sample ended); fewer messages for streams that asked for them."""
        ready: list[tuple[GenerationStream, list[Event] | BaseException]] = []
        for stream, new in events.items():
            held = stream.hold(new)
            if held:
                ready.append((stream, held))
        if ready:
            self._post(ready)

    def _post(self, items: list[tuple[GenerationStream, list[Event] | BaseException]]) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        if self._courier is not None:
            self._courier.send(loop, items)
        else:
            _wake(loop, items)

    def _fail_all(self, exc: BaseException) -> None:
        streams = {seq.stream: None for seq in self.active}
        self.active = []
        self._set_active(0)
        self._post([(s, exc) for s in streams])

    def _shutdown(self) -> None:
        now = time.perf_counter()
        items: list[tuple[GenerationStream, list[Event] | BaseException]] = []
        by_stream: dict[GenerationStream, list[Event]] = {}
        for seq in self.active:
            by_stream.setdefault(seq.stream, []).append(
                seq.finish_event(FinishReason.CANCELLED, bridge.final_text(seq.decoder), now)
            )
        for stream, new in by_stream.items():
            held = stream.hold(new)  # always handed over: it ends samples
            if held:
                items.append((stream, held))
        with self._cond:
            waiting, self._waiting = list(self._waiting), deque()
        items.extend((s, Overloaded("the server is shutting down")) for s in waiting)
        self.active = []
        self._post(items)

    def _set_active(self, count: int) -> None:
        if self._metrics is not None:
            self._metrics.active_sequences.labels(model=self.model).set(count)

    def _set_pending(self, count: int) -> None:
        if self._metrics is not None:
            self._metrics.pending_requests.labels(model=self.model).set(count)


Items = list[tuple[GenerationStream, list[Event] | BaseException]]


def _deliver(items: Items) -> None:
    for stream, item in items:
        stream._put(item)


def _wake(loop: asyncio.AbstractEventLoop, items: Items) -> None:
    with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
        loop.call_soon_threadsafe(_deliver, items)


class _Courier:
    """Carries event batches to the event loop from a thread of its own.

    Waking the loop (`call_soon_threadsafe` writes to its self-pipe) lets it take the GIL at
    once and write its messages, so the thread that woke it waits for the GIL meanwhile. The
    scheduler therefore only queues the batch here and goes on into the model step, which
    releases the GIL: this thread wakes the loop during the step. Batches keep their order.
    """

    def __init__(self, name: str) -> None:
        self._items: Items = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._closed = False
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def send(self, loop: asyncio.AbstractEventLoop, items: Items) -> None:
        with self._lock:
            self._loop = loop
            self._items.extend(items)
        self._ready.set()

    def close(self) -> None:
        """Delivers what was sent, then ends the thread."""
        self._closed = True
        self._ready.set()

    def _run(self) -> None:
        while True:
            self._ready.wait()
            self._ready.clear()
            closed = self._closed  # read before taking the items: nothing sent after close
            with self._lock:
                items, self._items = self._items, []
                loop = self._loop
            if items and loop is not None and not loop.is_closed():
                _wake(loop, items)
            if closed:
                return


class SchedulerPool:
    """The schedulers of a server, one per model, each created on the model's first Generate."""

    def __init__(
        self,
        limits: GenerationLimits,
        metrics: Metrics | None = None,
    ) -> None:
        self.limits = limits
        self._metrics = metrics
        self._schedulers: dict[str, GenerationScheduler] = {}
        self._steppers: dict[str, Any] = {}
        self._lock = threading.Lock()

    def stepper(self, name: str, backend: Any) -> Any:
        """The model's Stepper (stateless, shared by its scheduler and beam searches)."""
        with self._lock:
            stepper = self._steppers.get(name)
            if stepper is None:
                stepper = self._steppers[name] = make_stepper(backend)
            return stepper

    def get(
        self, name: str, backend: Any, detokenizer: Callable[[], Detokenizer] | None = None
    ) -> GenerationScheduler:
        stepper = self.stepper(name, backend)
        with self._lock:
            scheduler = self._schedulers.get(name)
            if scheduler is None:
                scheduler = GenerationScheduler(
                    name, stepper, backend.vocab, self.limits, self._metrics, detokenizer
                )
                self._schedulers[name] = scheduler
            return scheduler

    def __getitem__(self, name: str) -> GenerationScheduler:
        return self._schedulers[name]

    def close(self) -> None:
        with self._lock:
            schedulers, self._schedulers = list(self._schedulers.values()), {}
        for scheduler in schedulers:
            scheduler.close()
