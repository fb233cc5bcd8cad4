"""The RetryInfo delay rule (`worker.retry_estimate`) fed hand-made timings, and the three
queues that use it: scoring, Generate admission and BeamSearch."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from lmserve.server.backends.ngram.model import NgramModel
from lmserve.server.decoding.scoring import ScoreOptions, Scorer
from lmserve.server.errors import DEFAULT_RETRY_AFTER, Overloaded
from lmserve.server.settings import GenerationLimits
from lmserve.server.text.codec import WordCodec
from lmserve.server.text.word import WordTokenizer
from lmserve.server.worker.generation.admission import Admission
from lmserve.server.worker.generation.beam_runner import BeamRunner
from lmserve.server.worker.retry_estimate import (
    MAX_DELAY,
    MIN_DELAY,
    Throughput,
    clip_delay,
    drain_delay,
    slot_delay,
)
from lmserve.server.worker.scoring.queue import ScoringLimits, ScoringQueue

TOY = Path(__file__).resolve().parents[1] / "fixtures" / "ngram" / "toy.arpa"


def test_delays_are_clipped_to_the_bounds() -> None:
    assert (MIN_DELAY, MAX_DELAY) == (0.05, 30.0)
    assert clip_delay(0.0) == MIN_DELAY
    assert clip_delay(0.3) == 0.3
    assert clip_delay(1e9) == MAX_DELAY
    assert clip_delay(float("nan")) == MAX_DELAY


def test_throughput_weights_recent_work_over_time() -> None:
    meter = Throughput(weight=0.5)
    assert meter.rate is None
    meter.record(1000, 0.5)  # the first measurement is taken whole
    assert meter.rate == pytest.approx(2000.0)
    meter.record(1000, 1.5)  # work 1000, time (0.5 + 1.5) / 2 = 1.0
    assert meter.rate == pytest.approx(1000.0)
    meter.record(0, 1.0)  # nothing measured: ignored
    meter.record(10, 0.0)
    assert meter.rate == pytest.approx(1000.0)


def test_drain_delay_is_work_over_rate_or_the_default_when_unmeasured() -> None:
    assert drain_delay(5000, None) == DEFAULT_RETRY_AFTER
    assert drain_delay(5000, 0.0) == DEFAULT_RETRY_AFTER
    assert drain_delay(5000, 1000.0) == pytest.approx(5.0)
    assert drain_delay(20_000, 1000.0) == pytest.approx(20.0)  # grows with the queued work
    assert drain_delay(1, 1000.0) == MIN_DELAY
    assert drain_delay(10**9, 1000.0) == MAX_DELAY


def test_slot_delay_grows_with_remaining_tokens_and_waiting_requests() -> None:
    assert slot_delay([], 3, 0.01) == DEFAULT_RETRY_AFTER  # nothing runs: nothing to measure
    assert slot_delay([100], 1, 0.0) == DEFAULT_RETRY_AFTER  # no step timed yet
    # One sequence, 100 tokens left at 10 ms a step: its slot frees in 1 s.
    assert slot_delay([100], 1, 0.01) == pytest.approx(1.0)
    # Two sequences free slots twice as fast; two waiting need two slots.
    assert slot_delay([100, 100], 1, 0.01) == pytest.approx(0.5)
    assert slot_delay([100, 100], 2, 0.01) == pytest.approx(1.0)
    assert slot_delay([300, 100], 2, 0.01) == pytest.approx(2.0)  # mean 200 tokens left
    assert slot_delay([10**6], 1, 0.01) == MAX_DELAY


class _Stream:
    def __init__(self, samples: int = 1) -> None:
        self.samples = samples
        self.cancelled = False


def test_admission_asks_its_estimate_for_the_waiting_count() -> None:
    asked: list[int] = []

    def estimate(waiting: int) -> float:
        asked.append(waiting)
        return 2.5

    limits = GenerationLimits(max_active_sequences=1, max_queued_requests=2)
    admission = Admission("m", limits, estimate)
    for _ in range(3):  # one fits the free slot, two wait
        admission.offer(_Stream(), occupied=0)  # type: ignore[arg-type]
    with pytest.raises(Overloaded) as refused:
        admission.offer(_Stream(), occupied=0)  # type: ignore[arg-type]
    assert refused.value.retry_after == 2.5
    assert asked == [3]  # the two waiting and the refused one
    assert len(admission.waiting) == 3


def test_beam_runner_estimates_from_measured_search_times() -> None:
    limits = GenerationLimits(max_running_searches=2, max_queued_searches=4)
    runner = BeamRunner("m", stepper=None, limits=limits)  # type: ignore[arg-type]
    assert runner.retry_after() == DEFAULT_RETRY_AFTER
    runner.throughput.record(1, 2.0)  # a search takes 2 s on one thread
    # Nothing waits: one search of the two running must end: 1 / (2 x 0.5 per s) = 1 s.
    assert runner.retry_after() == pytest.approx(1.0)
    runner._waiting.extend([object(), object(), object()])  # type: ignore[list-item]
    assert runner.retry_after() == pytest.approx(4.0)


def test_the_scoring_queue_measures_its_throughput_and_divides_the_queued_work() -> None:
    ngram = NgramModel.from_arpa(TOY)
    scorer = Scorer(ngram, WordCodec(WordTokenizer(), ngram.vocab))

    async def main() -> tuple[float | None, float]:
        queue = ScoringQueue(
            "toy", ngram, ScoringLimits(scoring_unit_tokens=16, scoring_unit_rows=4)
        )
        try:
            before = queue.throughput.rate
            await queue.score(scorer.prepare_texts(["a b c"] * 50, ScoreOptions()))
            return before, queue.retry_after()
        finally:
            queue.close()

    before, idle = asyncio.run(main())
    assert before is None
    assert idle == MIN_DELAY  # measured, and nothing waits


def test_the_scoring_queue_refuses_with_its_estimate() -> None:
    ngram = NgramModel.from_arpa(TOY)
    scorer = Scorer(ngram, WordCodec(WordTokenizer(), ngram.vocab))

    async def main() -> Any:
        queue = ScoringQueue("toy", ngram, ScoringLimits(scoring_max_queued_tokens=100))
        queue.throughput.record(10, 1.0)  # 10 positions a second
        queue._queued_tokens = 80  # as if 80 positions waited
        try:
            with pytest.raises(Overloaded) as refused:
                await queue.score(scorer.prepare_texts(["a b c"] * 10, ScoreOptions()))
            return refused.value.retry_after
        finally:
            queue.close()

    assert asyncio.run(main()) == pytest.approx(8.0)
