"""Interactive work first: generation steps wait for a model's small scoring passes and session
steps, for a bounded time, and never for its long requests."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import numpy as np

from lmserve.server.backends.base import BatchScores, EncodedBatch
from lmserve.server.backends.ngram.model import NgramModel
from lmserve.server.decoding.scoring import ScoreOptions, Scorer
from lmserve.server.text.codec import WordCodec
from lmserve.server.text.word import WordTokenizer
from lmserve.server.worker.foreground import Foreground
from lmserve.server.worker.scoring.queue import ScoringLimits, ScoringQueue

TOY = Path(__file__).resolve().parents[1] / "fixtures" / "ngram" / "toy.arpa"


def test_an_idle_foreground_does_not_hold_generation() -> None:
    foreground = Foreground()
    foreground.wait_idle(10.0)  # returns at once: nothing runs
    assert foreground.waits == 0 and foreground.running == 0


def test_generation_waits_until_interactive_work_ends() -> None:
    foreground = Foreground()
    order: list[str] = []
    inside = threading.Event()
    release = threading.Event()

    def interactive() -> None:
        with foreground.busy():
            inside.set()
            release.wait(10)
            order.append("interactive done")

    worker = threading.Thread(target=interactive)
    worker.start()
    assert inside.wait(10)

    def step() -> None:
        foreground.wait_idle(10.0)
        order.append("step")

    stepper = threading.Thread(target=step)
    stepper.start()
    time.sleep(0.05)
    assert order == []  # the step still waits
    release.set()
    worker.join(10)
    stepper.join(10)
    assert order == ["interactive done", "step"]
    assert foreground.waits == 1 and foreground.running == 0


def test_generation_is_delayed_never_starved() -> None:
    foreground = Foreground()
    with foreground.busy():
        started = time.monotonic()
        foreground.wait_idle(0.05)
        assert 0.04 <= time.monotonic() - started < 5.0
    assert foreground.running == 0


class _Recording:
    """A real n-gram backend that records whether interactive work was marked busy."""

    def __init__(self, inner: NgramModel, foreground: Foreground) -> None:
        self.inner, self.vocab, self.foreground = inner, inner.vocab, foreground
        self.busy_during: list[bool] = []

    def score(
        self, batch: EncodedBatch, *, bos: bool = True, eos: bool = True, per_token: bool = False
    ) -> BatchScores:
        self.busy_during.append(self.foreground.running > 0)
        return self.inner.score(batch, bos=bos, eos=eos, per_token=per_token)


def test_small_requests_are_interactive_long_ones_are_not() -> None:
    foreground = Foreground()
    backend = _Recording(NgramModel.from_arpa(TOY), foreground)
    scorer = Scorer(backend, WordCodec(WordTokenizer(), backend.vocab))  # type: ignore[arg-type]
    limits = ScoringLimits(scoring_unit_tokens=16, scoring_unit_rows=4, inline_tokens=0)
    queue = ScoringQueue("toy", backend, limits, foreground=foreground)  # type: ignore[arg-type]
    try:
        small = scorer.prepare_texts(["the cat sat"], ScoreOptions())
        long = scorer.prepare_texts(["the cat sat on the mat"] * 40, ScoreOptions())
        assert limits.interactive(small.scored_tokens)
        assert not limits.interactive(long.scored_tokens)

        async def run() -> None:
            await queue.score(small)
            before = len(backend.busy_during)
            assert backend.busy_during == [True] * before
            scores = await queue.score(long)
            assert not any(backend.busy_during[before:])
            expected = scorer.backend.score(long.batch).totals  # type: ignore[attr-defined]
            np.testing.assert_allclose(scores.totals, expected)

        asyncio.run(run())
    finally:
        queue.close()
