"""Which Generate requests enter the scheduler, which wait, and which are refused.

    admission = Admission(model, limits, retry_after)   # retry_after(waiting): RetryInfo seconds
    admission.offer(stream, occupied)      # event loop; Overloaded when it would wait too long
    taken = admission.take(occupied)       # scheduler thread: the streams that fit now

One rule serves both sides (`_admissible`): streams from the front of the queue while their
samples fit the free slots and their key/value cache fits the model's free cache bytes
(`context_window.ContextWindow`; one stream at least when nothing runs). A stream the rule
would take is not "queued", so a burst that fits the free slots is never refused, and
`max_queued_requests=0` means "no waiting room" rather than "no requests". The caller holds
its lock around both calls.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable

from lmserve.server.errors import DEFAULT_RETRY_AFTER, Overloaded
from lmserve.server.settings import GenerationLimits
from lmserve.server.worker.generation.context_window import ContextWindow
from lmserve.server.worker.generation.sequence import GenerationStream


class Admission:
    """The waiting queue of one model's scheduler. Not thread-safe: callers lock."""

    def __init__(
        self,
        model: str,
        limits: GenerationLimits,
        retry_after: Callable[[int], float] | None = None,
        window: ContextWindow | None = None,
    ) -> None:
        self.model = model
        self.limits = limits
        self.window = window or ContextWindow()
        # Seconds until this many waiting streams could get slots (the scheduler knows; see
        # `retry_estimate.slot_delay`), sent to refused callers as RetryInfo.
        self._retry_after = retry_after or (lambda waiting: DEFAULT_RETRY_AFTER)
        self.waiting: deque[GenerationStream] = deque()

    def offer(self, stream: GenerationStream, occupied: int, cache_bytes: int = 0) -> None:
        """Queues `stream`, or raises Overloaded when it would make more than
        `max_queued_requests` wait (RequestTooLarge when its cache could never fit).
        `occupied`: slots held by running or prefilling samples; `cache_bytes`: their cache."""
        self.window.check(self._reserved(stream))
        self.waiting.append(stream)
        queued = len(self.waiting) - self._admissible(occupied, cache_bytes)
        if queued > self.limits.max_queued_requests:
            self.waiting.pop()
            raise Overloaded(
                f"{queued - 1} Generate requests already wait for model "
                f"{self.model!r} (max_queued_requests={self.limits.max_queued_requests}); "
                "retry later",
                limit="max_queued_requests",
                model=self.model,
                retry_after=self._retry_after(queued),
            )

    def take(self, occupied: int, cache_bytes: int = 0) -> list[GenerationStream]:
        """Removes the admissible streams from the queue; returns those not cancelled."""
        taken = [self.waiting.popleft() for _ in range(self._admissible(occupied, cache_bytes))]
        return [stream for stream in taken if not stream.cancelled]

    def drain(self) -> list[GenerationStream]:
        waiting, self.waiting = list(self.waiting), deque()
        return waiting

    def _admissible(self, occupied: int, cache_bytes: int = 0) -> int:
        """How many waiting streams, from the front, fit the free slots and cache bytes (one
        at least when nothing runs); cancelled ones take no slot."""
        free = self.limits.max_active_sequences - occupied
        budget = self.window.max_cache_bytes
        free_bytes = budget - cache_bytes if budget else math.inf
        taken = count = 0
        for stream in self.waiting:
            need = self._reserved(stream)
            if (stream.samples > free or need > free_bytes) and (taken or occupied):
                break
            count += 1
            if not stream.cancelled:
                taken += 1
                free -= stream.samples
                free_bytes -= need
        return count

    def _reserved(self, stream: GenerationStream) -> int:
        """The cache a waiting stream reserves, all its samples (0 without a budget)."""
        if not self.window.max_cache_bytes:
            return 0
        return stream.request.cache_bytes(self.window, stream.samples)
