"""Backpressure: a stream whose reader fell behind stops generating until it has caught up.

    parking = Parking(max_unread=256, wake=scheduler_wakes_up)
    parking.park(batch)                     # streams over the limit leave the batch, state kept
    events = parking.release(batch, now)    # drained ones rejoin; cancelled/expired ones end

Without it a client that stops reading keeps its sequences in the batch, and their events wait
in memory, up to max_new_tokens per sample. A stream is parked when more than `max_unread`
events were handed over but not yet taken by its handler (`GenerationStream.unread`: the gRPC
write blocks once the client's flow-control window is full, so the handler stops taking). It
rejoins when fewer than half remain, so it does not flap at the limit; the handler wakes the
scheduler then (`GenerationStream.waker`); a poll catches deadlines and cancellations. Parked
rows keep their log-probs and model state (`RunningBatch.detach` / `attach`), and every sample
draws with its own generator: a seeded output is the same with or without a pause. Parked
samples keep their slots, and their deadline still ends them. Scheduler thread only, except
`samples` (read under the scheduler's lock).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from lmserve.server.decoding.stopping import FinishReason
from lmserve.server.shared.stats import EngineStats
from lmserve.server.worker.generation.batch import ActiveSequence, Rows, RunningBatch, expired
from lmserve.server.worker.generation.sequence import Event, GenerationStream


class Parking:
    """The parked streams of one scheduler and their rows."""

    def __init__(
        self, max_unread: int, wake: Callable[[], None], stats: EngineStats | None = None
    ) -> None:
        self.max_unread = max_unread
        self._wake = wake  # wakes the scheduler (called on the event loop)
        self._stats = stats  # its `parked_sequences`
        self.resume_below = max(1, max_unread // 2)
        self._rows: dict[GenerationStream, Rows] = {}
        self.samples = 0  # slots the parked samples hold
        self.parks = 0  # times a stream was parked (tests)

    def __bool__(self) -> bool:
        return bool(self._rows)

    @property
    def streams(self) -> list[GenerationStream]:
        return list(self._rows)

    @property
    def sequences(self) -> list[ActiveSequence]:
        """The parked samples (they keep their slots). Call with the scheduler's lock."""
        return [seq for rows in self._rows.values() for seq in rows.sequences]

    def park(self, batch: RunningBatch) -> None:
        """Moves the rows of every stream with too many unread events out of `batch`."""
        limit = self.max_unread
        over = {seq.stream for seq in batch.sequences if seq.stream.unread > limit}
        for stream in over:
            rows = [i for i, seq in enumerate(batch.sequences) if seq.stream is stream]
            self._rows[stream] = batch.detach(rows)
            stream.resume_below = self.resume_below
            stream.waker = self._wake
            self.samples += len(rows)
            self.parks += 1
        if over:
            self._count()

    def due(self, now_mono: float) -> bool:
        """Whether `release` has work: a stream drained, cancelled, or past its deadline."""
        return any(self._leaves(stream, now_mono) for stream in self._rows)

    def release(self, batch: RunningBatch, now_mono: float) -> dict[GenerationStream, list[Event]]:
        """Drained streams rejoin `batch`; cancelled ones are dropped; those past their
        deadline end (their samples' CANCELLED ends are returned, to be posted)."""
        events: dict[GenerationStream, list[Event]] = {}
        now = time.perf_counter()
        for stream in [s for s in self._rows if self._leaves(s, now_mono)]:
            rows = self._rows.pop(stream)
            stream.waker = None
            self.samples -= len(rows.sequences)
            if stream.cancelled:
                continue
            if expired(stream, now_mono):
                events[stream] = [
                    seq.finish_event(FinishReason.CANCELLED, now) for seq in rows.sequences
                ]
                continue
            for seq in rows.sequences:
                if seq.generated:
                    seq.last_time = now  # the pause is the reader's, not an inter-token latency
            batch.attach(rows)
        self._count()
        return events

    def clear(self) -> list[ActiveSequence]:
        """Removes every parked sequence (shutdown, failure) and returns them."""
        gone = self.sequences
        self._rows.clear()
        self.samples = 0
        self._count()
        return gone

    def _count(self) -> None:
        if self._stats is not None:
            self._stats.parked_sequences = self.samples

    def _leaves(self, stream: GenerationStream, now_mono: float) -> bool:
        return stream.cancelled or expired(stream, now_mono) or stream.unread < self.resume_below
