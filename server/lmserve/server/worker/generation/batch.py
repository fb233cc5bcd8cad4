"""The sequences a scheduler steps together: their rows of log-probs and model state.

    batch = RunningBatch(model, stepper, vocab, detokenizer, stats)
    batch.join(streams, log_probs, state)        # prompts read: one row per sample
    events = batch.drop_gone(now)                 # cancelled, deadline passed: rows leave
    events, failed = batch.draw()                 # one token per row; finished rows leave
    batch.step()                                  # ONE Stepper.step over the survivors

Row i of `log_probs` and of `state` always belongs to `sequences[i]`; every change of the rows
goes through `_set_rows`, which also keeps `stats.active_sequences` (the
`lmserve_active_sequences` gauge) equal to the number of rows (it read 0 while 256 sequences ran
when only some changes set it).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from lmserve.server.backends.base import FloatArray, Vocabulary
from lmserve.server.backends.stepping import State, Stepper
from lmserve.server.decoding.detokenize import Detokenizer
from lmserve.server.decoding.stopping import FinishReason
from lmserve.server.errors import ModelOutputError
from lmserve.server.shared.stats import EngineStats
from lmserve.server.worker.generation import decoding_bridge as bridge
from lmserve.server.worker.generation.sequence import (
    Event,
    FinishEvent,
    GenerationStream,
    TokenEvent,
    Usage,
)


class ActiveSequence:
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

    def __init__(
        self, stream: GenerationStream, sample_index: int, decoder: bridge.SampleDecoder
    ) -> None:
        self.stream = stream
        self.request = stream.request
        self.sample_index = sample_index
        self.decoder = decoder  # per-sample: generator, history, detokenizer, stop matcher
        self.generated = 0
        self.log_prob = 0.0
        self.last_time = 0.0
        self.first_time = 0.0

    def finish_event(self, reason: FinishReason, now: float) -> FinishEvent:
        return finish_event(
            self.stream,
            self.sample_index,
            reason,
            bridge.final_text(self.decoder),
            self.log_prob,
            self.generated,
            self.first_time,
            now,
        )


def finish_event(
    stream: GenerationStream,
    sample_index: int,
    reason: FinishReason,
    text: str = "",
    log_prob: float = 0.0,
    generated: int = 0,
    first_time: float = 0.0,
    now: float = 0.0,
) -> FinishEvent:
    """The end of a sample (one that never started: zero tokens, empty text)."""
    request = stream.request
    return FinishEvent(
        sample_index=sample_index,
        reason=reason,
        text=text,
        log_prob=log_prob,
        usage=Usage(
            prompt_tokens=len(request.prompt_ids),
            generated_tokens=generated,
            time_to_first_token_seconds=(first_time - request.arrived) if generated else 0.0,
            total_seconds=(now or time.perf_counter()) - request.arrived,
        ),
    )


@dataclass
class Rows:
    """Some sequences of a batch with their rows of log-probs and model state."""

    sequences: list[ActiveSequence]
    log_probs: FloatArray | None
    state: State


def expired(stream: GenerationStream, now_mono: float) -> bool:
    deadline = stream.request.deadline
    return deadline is not None and now_mono >= deadline


class RunningBatch:
    """The active sequences of one model and their batch rows (scheduler thread only)."""

    def __init__(
        self,
        model: str,
        stepper: Stepper,
        vocab: Vocabulary,
        detokenizer: Callable[[], Detokenizer],
        stats: EngineStats | None = None,
    ) -> None:
        self.model = model
        self.stepper = stepper
        self.vocab = vocab
        self._detokenizer = detokenizer
        self.stats = stats = stats if stats is not None else EngineStats(model)
        # Bound once: `draw` records per step.
        self._ttft = stats.time_to_first_token
        self._itl = stats.inter_token_latency
        self.sequences: list[ActiveSequence] = []
        self.log_probs: FloatArray | None = None
        self.state: State = None
        self.steps = 0
        self.step_seconds = 0.0  # moving average of a batched step's time (prefill sizing)
        self._next_tokens: list[int] = []
        self._set_rows([], None, None)

    def __len__(self) -> int:
        return len(self.sequences)

    def _set_rows(
        self, sequences: list[ActiveSequence], log_probs: FloatArray | None, state: State
    ) -> None:
        self.sequences, self.log_probs, self.state = sequences, log_probs, state
        self.stats.active_sequences = len(sequences)

    def join(
        self, streams: Sequence[GenerationStream], log_probs: FloatArray, state: State
    ) -> None:
        """Adds the samples of streams whose prompts were read (row i of the arguments is
        `streams[i]`'s); each sample starts from a copy of its prompt's row."""
        new: list[ActiveSequence] = []
        rows: list[int] = []
        for i, stream in enumerate(streams):
            for k, decoder in enumerate(
                bridge.new_decoders(stream.request, self.vocab, self._detokenizer)
            ):
                new.append(ActiveSequence(stream, k, decoder))
                rows.append(i)
        if not new:
            return
        if len(rows) != len(streams):  # n > 1: rows repeat
            index = np.asarray(rows, dtype=np.int64)
            log_probs, state = log_probs[index], self.stepper.select(state, index)
        self.attach(Rows(new, log_probs, state))

    def attach(self, rows: Rows) -> None:
        """Appends rows (their sequences, log-probs and state), e.g. parked ones resuming."""
        if not rows.sequences:
            return
        if not self.sequences or self.log_probs is None:
            self._set_rows(rows.sequences, rows.log_probs, rows.state)
            return
        self._set_rows(
            self.sequences + rows.sequences,
            np.concatenate([self.log_probs, rows.log_probs]),
            self.stepper.merge([self.state, rows.state]),
        )

    def detach(self, rows: Sequence[int]) -> Rows:
        """Removes rows `rows` and returns them with their state kept (to `attach` later)."""
        index = np.asarray(rows, dtype=np.int64)
        taken = Rows(
            [self.sequences[i] for i in rows],
            None if self.log_probs is None else self.log_probs[index],
            self.stepper.select(self.state, index),
        )
        leaving = set(rows)
        self.keep([i for i in range(len(self.sequences)) if i not in leaving])
        return taken

    def keep(self, rows: Sequence[int]) -> None:
        """Keeps rows `rows` (in order) and drops the others."""
        if len(rows) == len(self.sequences):
            return
        if not rows:
            self._set_rows([], None, None)
            return
        index = np.asarray(rows, dtype=np.int64)
        self._set_rows(
            [self.sequences[i] for i in rows],
            None if self.log_probs is None else self.log_probs[index],
            self.stepper.select(self.state, index),
        )

    def clear(self) -> list[ActiveSequence]:
        gone = self.sequences
        self._set_rows([], None, None)
        return gone

    def drop_gone(self, now_mono: float) -> dict[GenerationStream, list[Event]]:
        """Cancelled streams and passed deadlines leave before the step (their slots free);
        a stream whose deadline passed (it still listens) gets its samples' ends."""
        gone = [
            i
            for i, seq in enumerate(self.sequences)
            if seq.stream.cancelled or expired(seq.stream, now_mono)
        ]
        events: dict[GenerationStream, list[Event]] = {}
        if not gone:
            return events
        now = time.perf_counter()
        for i in gone:
            seq = self.sequences[i]
            if not seq.stream.cancelled:
                events.setdefault(seq.stream, []).append(
                    seq.finish_event(FinishReason.CANCELLED, now)
                )
        dropped = set(gone)
        self.keep([i for i in range(len(self.sequences)) if i not in dropped])
        return events

    def draw(self) -> tuple[dict[GenerationStream, list[Event]], list[GenerationStream]]:
        """Draws one token per sequence and emits it; finished sequences leave, and so do the
        requests of rows the model gave NaN/inf for (returned second, to be failed)."""
        active = self.sequences
        assert self.log_probs is not None
        drawn = bridge.sample([seq.decoder for seq in active], self.log_probs, self.vocab)
        now = time.perf_counter()
        events: dict[GenerationStream, list[Event]] = {}
        keep: list[int] = []
        next_tokens: list[int] = []
        gaps: dict[float, int] = {}  # last token's time -> sequences (most share one)
        failed = {active[i].stream for i in drawn.failed}
        for i, seq in enumerate(active):
            if seq.stream in failed:
                continue
            token_id, token_lp, top = drawn.ids[i], drawn.log_probs[i], drawn.top[i]
            piece, finish = bridge.accept(seq.decoder, token_id, seq.generated + 1)
            seq.log_prob += token_lp
            if seq.generated == 0:
                seq.first_time = now
                if seq.sample_index == 0:
                    self._ttft.observe(now - seq.request.arrived)
            else:
                gaps[seq.last_time] = gaps.get(seq.last_time, 0) + 1
            seq.last_time = now
            out = events.setdefault(seq.stream, [])
            if piece is not None:  # None: a token that ends the sample and is not emitted
                out.append(
                    TokenEvent(seq.sample_index, seq.generated, token_id, piece, token_lp, top)
                )
                seq.generated += 1
            if finish is not None:
                out.append(seq.finish_event(finish, now))
            else:
                keep.append(i)
                next_tokens.append(token_id)
        self.stats.generated(len(active) - len(drawn.failed))
        itl = self._itl
        for last, count in gaps.items():
            itl.observe(now - last, count)
        self.keep(keep)
        self._next_tokens = next_tokens
        return events, list(failed)

    def step(self) -> None:
        """Feeds every sequence its drawn token in ONE batched step."""
        if not self.sequences:
            return
        tokens = np.asarray(self._next_tokens, dtype=np.int64)
        started = time.perf_counter()
        self.log_probs, self.state = self.stepper.step(tokens, self.state)
        seconds = time.perf_counter() - started
        self.step_seconds = seconds if not self.steps else 0.8 * self.step_seconds + 0.2 * seconds
        self.steps += 1


def output_error(stream: GenerationStream) -> ModelOutputError:
    return ModelOutputError(
        "the model produced NaN/inf log-probabilities (or no possible token) for a sequence "
        f"of this request after {len(stream.request.prompt_ids)} prompt tokens"
    )
