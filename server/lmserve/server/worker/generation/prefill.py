"""Chunked prefill: admitted prompts are read a bounded number of tokens per scheduler iteration.

    prefill = Prefill(stepper, bos_id, chunk_tokens=512)
    prefill.add(streams)                       # admitted, not yet read
    ready = prefill.advance(limit_seconds)     # reads <= 512 prompt tokens in one `feed`
    if ready: batch.join(ready.streams, ready.log_probs, ready.state)

Reading a 20,000-token prompt in one go stalls every running stream for the whole prompt; read
a chunk per iteration (between the steps of the running sequences), it delays each of their
tokens by one chunk's time at most. Each prompt's state is carried across iterations, and a
prompt fed in pieces gives the same distribution as one read at once (`Stepper.feed`), so seeded
outputs do not depend on the chunk size. Prompts are read in arrival order; short prompts that
fit one budget together are read in one batched call, as before.

While other sequences run, the scheduler also bounds a chunk's time (`limit_seconds`, a share of
its step time): the token budget adapts to the measured feed times (x0.7 when a chunk took too
long, x1.25 when it took well under), since a feed's cost is a fixed part (about one step) plus
a part per token, which a per-token average would misjudge for short chunks.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from lmserve.server.backends.base import FloatArray
from lmserve.server.backends.stepping import State, Stepper
from lmserve.server.worker.generation.sequence import GenerationStream


class _Reading:
    """One admitted prompt part-way read: `[<s>] prompt`, how much was fed, the state so far."""

    __slots__ = ("stream", "tokens", "done", "state")

    def __init__(self, stream: GenerationStream, bos_id: int) -> None:
        self.stream = stream
        self.tokens = [bos_id, *stream.request.prompt_ids]
        self.done = 0
        self.state: State = None


@dataclass(frozen=True)
class Ready:
    """Prompts read to the end: row i of `log_probs` [R, V] and of `state` is `streams[i]`'s."""

    streams: list[GenerationStream]
    log_probs: FloatArray
    state: State


class Prefill:
    """The admitted prompts not yet read to the end (scheduler thread only)."""

    def __init__(self, stepper: Stepper, bos_id: int, chunk_tokens: int) -> None:
        if chunk_tokens < 1:
            raise ValueError("chunk_tokens must be at least 1")
        self.stepper = stepper
        self.bos_id = bos_id
        self.chunk_tokens = chunk_tokens
        self.pending: list[_Reading] = []
        self.fed_tokens = 0  # prompt tokens read so far (tests and metrics)
        # Tokens per chunk while sequences run, adapted to `limit_seconds` (see the module).
        self.budget = min(chunk_tokens, 16)

    @property
    def samples(self) -> int:
        """Slots the pending prompts hold: their requests' samples."""
        return sum(r.stream.samples for r in self.pending)

    def add(self, streams: list[GenerationStream]) -> None:
        self.pending.extend(_Reading(s, self.bos_id) for s in streams)

    def remove(self, gone: set[GenerationStream]) -> None:
        """Forgets the prompts of streams that left (cancelled, deadline passed)."""
        self.pending = [r for r in self.pending if r.stream not in gone]

    def advance(self, limit_seconds: float | None = None) -> Ready | None:
        """Feeds at most `chunk_tokens` prompt tokens (with `limit_seconds`, the adapted budget
        that reads in about that time), oldest prompt first, in one call; returns the prompts
        that are now read to the end (None when none is)."""
        wanted = self.chunk_tokens if limit_seconds is None else self.budget
        budget = wanted
        chosen: list[_Reading] = []
        chunks: list[list[int]] = []
        for reading in self.pending:
            if budget == 0:
                break
            n = min(len(reading.tokens) - reading.done, budget)
            chunks.append(reading.tokens[reading.done : reading.done + n])
            chosen.append(reading)
            budget -= n
        if not chosen:
            return None
        stepper = self.stepper
        fresh = all(r.state is None for r in chosen)
        start = (
            stepper.initial_state(len(chosen))
            if fresh
            else stepper.merge(
                [r.state if r.state is not None else stepper.initial_state(1) for r in chosen]
            )
        )
        started = time.perf_counter()
        log_probs, state = stepper.feed(chunks, start)
        if limit_seconds is not None:
            self._adapt(time.perf_counter() - started, limit_seconds, wanted - budget)
        self.fed_tokens += wanted - budget
        finished: list[int] = []
        for i, (reading, chunk) in enumerate(zip(chosen, chunks, strict=True)):
            reading.done += len(chunk)
            if reading.done == len(reading.tokens):
                finished.append(i)
            else:  # carried to the next iteration (only the last chosen can be unfinished)
                reading.state = stepper.select(state, np.asarray([i], dtype=np.int64))
        if not finished:
            return None
        done = {id(chosen[i]) for i in finished}
        self.pending = [r for r in self.pending if id(r) not in done]
        streams = [chosen[i].stream for i in finished]
        if len(finished) == len(chosen):
            return Ready(streams, log_probs, state)
        rows = np.asarray(finished, dtype=np.int64)
        return Ready(streams, log_probs[rows], stepper.select(state, rows))

    def _adapt(self, seconds: float, limit: float, fed: int) -> None:
        if fed < self.budget:  # the prompts ran out: says nothing about a full chunk
            return
        if seconds > limit:
            self.budget = max(1, int(self.budget * 0.7))
        elif seconds < 0.8 * limit:
            self.budget = min(self.chunk_tokens, int(self.budget * 1.25) + 1)
