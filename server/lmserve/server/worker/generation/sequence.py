"""What the generation scheduler hands out and tracks: requests, events, and one sample's state.

    request = GenerationRequest(prompt_ids=[5, 9], params=generate_params, deadline=None)
    stream = scheduler.submit(request)          # engine.scheduler.GenerationScheduler
    async for event in stream:                  # TokenEvent ... FinishEvent per sample
        ...

Nothing here knows about gRPC: the API layer converts these events into messages.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from lmserve.server.decoding.params import GenerateParams
from lmserve.server.decoding.stopping import FinishReason
from lmserve.server.worker.generation.context_window import ContextWindow


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """One generated token. `log_prob` is a natural log under the unfiltered distribution;
    `top` holds the best alternatives as (token id, natural log-prob), best first."""

    sample_index: int
    index: int
    token_id: int
    text: str
    log_prob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    generated_tokens: int
    time_to_first_token_seconds: float
    total_seconds: float


@dataclass(frozen=True, slots=True)
class FinishEvent:
    """The end of one sample: its reason, whole text (stop strings trimmed), log-prob sum."""

    sample_index: int
    reason: FinishReason
    text: str
    log_prob: float
    usage: Usage


Event = TokenEvent | FinishEvent
# A hand-over of events -> its GenerateResponse messages as wire bytes (may raise, e.g. at the
# deadline): how an in-process stream's messages are built (`worker.replies.generate`).
MessageRenderer = Callable[[list[Event]], list[bytes]]


@dataclass
class GenerationRequest:
    """A validated Generate request. `params` is the decoding layer's `GenerateParams`;
    `deadline` is a `time.monotonic()` instant after which the request is cancelled."""

    prompt_ids: list[int]
    params: GenerateParams
    deadline: float | None = None
    arrived: float = field(default_factory=time.perf_counter)

    def cache_bytes(self, window: ContextWindow, samples: int) -> int:
        """The cache `samples` of its samples may reach (`context_window`; 0 without a
        budget)."""
        stopping = self.params.stopping
        return window.request_bytes(len(self.prompt_ids), stopping.max_new_tokens, samples)


class GenerationStream:
    """The async side of one request: events arrive in batches from the scheduler's thread.

    Iterate it for events; `cancel()` (or leaving the iteration early) tells the scheduler to
    drop the request's sequences before its next step.
    """

    def __init__(
        self, request: GenerationRequest, samples: int, render: MessageRenderer | None = None
    ) -> None:
        self.request = request
        self.samples = samples
        # How its hand-overs become wire messages, in-process (`replies.generate.rendered`).
        self._render = render
        # Hand-overs from the scheduler thread, appended on the event loop (`_put`).
        self._handed: deque[list[Event] | BaseException] = deque()
        self._arrived = asyncio.Event()
        self._unfinished = samples
        # Read by the scheduler thread between steps: a plain bool is enough (GIL-atomic).
        self.cancelled = False
        # Scheduler thread only: events held back until `stream_interval` steps gathered.
        self._interval: int = request.params.stream_interval
        self._held: list[Event] = []
        self._held_steps = 0
        # Backpressure: events handed over (scheduler thread) and taken by the handler (event
        # loop); each side writes its own count, the scheduler parks the stream on the gap.
        self.handed = 0
        self.taken = 0
        # Set while parked: called on the event loop once the handler took enough to resume.
        self.waker: Callable[[], None] | None = None
        self.resume_below = 0

    def cancel(self) -> None:
        self.cancelled = True

    def on_taken(self) -> None:
        """Called after the handler took events (`taken` grew): a stream whose scheduler is
        in another process reports it there (`workers.connection.WorkerStream`)."""

    @property
    def unread(self) -> int:
        """Events handed over but not yet taken by the handler (a slow reader's backlog)."""
        return self.handed - self.taken

    def hold(self, events: list[Event]) -> list[Event] | None:
        """Scheduler thread: adds one step's events; returns everything held once
        `stream_interval` steps have gathered or a sample ended (else None: keep holding)."""
        self._held.extend(events)
        self._held_steps += 1
        if self._held_steps < self._interval and not any(
            isinstance(e, FinishEvent) for e in events
        ):
            return None
        out, self._held, self._held_steps = self._held, [], 0
        self.handed += len(out)
        return out

    def _put(self, item: list[Event] | BaseException) -> None:
        """Called on the event loop (the scheduler thread posts with call_soon_threadsafe)."""
        self._handed.append(item)
        self._arrived.set()

    async def batches(self) -> AsyncIterator[list[Event]]:
        """The events as the scheduler hands them over: a step's (or `stream_interval`
        steps') worth at a time, in order. Raises what failed the request.

        Hand-overs that piled up while the consumer was busy (its previous message still
        being written) come out as one batch, so a server that falls behind sends fewer,
        larger messages instead of a growing backlog, and no token waits for a later one.
        """
        handed = self._handed
        try:
            while self._unfinished > 0:
                if not handed:
                    self._arrived.clear()
                    await self._arrived.wait()
                    continue
                item = handed.popleft()
                if isinstance(item, BaseException):
                    raise item
                while handed and not isinstance(handed[0], BaseException):
                    item.extend(handed.popleft())  # type: ignore[arg-type]
                self._unfinished -= sum(isinstance(e, FinishEvent) for e in item)
                self.taken += len(item)
                waker = self.waker
                if waker is not None and self.unread < self.resume_below:
                    self.waker = None
                    waker()  # the scheduler resumes it now, not at its next poll
                self.on_taken()
                yield item
        finally:
            if self._unfinished > 0:  # the consumer left early (client gone, error)
                self.cancel()

    async def messages(self) -> AsyncIterator[list[bytes]]:
        """The stream's messages as wire bytes, a hand-over at a time, rendered by the engine
        that made the stream (`EngineCore.generate`); a worker's stream gets them built
        (`front.workers.connection.WorkerStream`)."""
        render = self._render
        assert render is not None, "made without a renderer: iterate its events instead"
        async for events in self.batches():
            yield render(events)

    async def __aiter__(self) -> AsyncIterator[Event]:
        async for batch in self.batches():
            for event in batch:
                yield event
