"""The scoring queue: bounded units, exact results, fairness, cancellation, deadlines, limits.

The backend is the KenLM-exact n-gram engine over the toy ARPA file (a real backend); a gate
around it holds the worker inside a pass so the tests decide what is queued when.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from lmserve.server.backends.base import BatchScores, EncodedBatch, LanguageModelBackend
from lmserve.server.backends.ngram.model import NgramModel
from lmserve.server.decoding.scoring import PreparedScoring, ScoreOptions, Scorer
from lmserve.server.errors import DeadlineExceeded, InvalidArgument, Overloaded
from lmserve.server.text.codec import WordCodec
from lmserve.server.text.word import WordTokenizer
from lmserve.server.worker.scoring.queue import ScoringLimits, ScoringQueue
from lmserve.server.worker.scoring.units import cut_units, gather

TOY = Path(__file__).resolve().parents[1] / "fixtures" / "ngram" / "toy.arpa"


class GatedBackend:
    """A real backend whose passes wait for the test's go-ahead and are recorded."""

    def __init__(self, inner: LanguageModelBackend) -> None:
        self.inner = inner
        self.vocab = inner.vocab
        self.passes: list[int] = []  # rows per pass
        self.entered = threading.Semaphore(0)
        self.gate = threading.Event()
        self.gate.set()
        self.fail_rows_with: int | None = None

    def score(
        self, batch: EncodedBatch, *, bos: bool = True, eos: bool = True, per_token: bool = False
    ) -> BatchScores:
        self.entered.release()
        self.gate.wait(10)
        self.passes.append(batch.batch_size)
        if self.fail_rows_with is not None and self.fail_rows_with in batch.ids.tolist():
            raise ValueError("poisoned text")
        return self.inner.score(batch, bos=bos, eos=eos, per_token=per_token)


@pytest.fixture(scope="module")
def ngram() -> NgramModel:
    return NgramModel.from_arpa(TOY)


def _scorer(backend: LanguageModelBackend) -> Scorer:
    return Scorer(backend, WordCodec(WordTokenizer(), backend.vocab))


def _texts(rng: np.random.Generator, count: int, words: list[str]) -> list[str]:
    return [
        " ".join(rng.choice(words, size=int(rng.integers(0, 12))).tolist()) for _ in range(count)
    ]


def test_units_cover_every_text_once_within_bounds() -> None:
    rng = np.random.default_rng(1)
    for _ in range(50):
        lengths = rng.integers(0, 40, size=int(rng.integers(1, 60)))
        units = cut_units(lengths, unit_tokens=64, unit_rows=8)
        seen = np.concatenate(list(units))
        assert sorted(seen.tolist()) == list(range(len(lengths)))
        for unit in units:
            widest = max(int(lengths[unit].max()), 1)
            assert len(unit) <= 8
            assert len(unit) == 1 or len(unit) * widest <= 64
        firsts = [int(lengths[u[0]]) for u in units]
        assert firsts == sorted(firsts, reverse=True)  # longest first


def test_gather_takes_the_rows_in_order() -> None:
    batch = EncodedBatch(
        ids=np.array([1, 2, 3, 4, 5, 6], dtype=np.int32),
        offsets=np.array([0, 2, 2, 6], dtype=np.int64),
        oov=np.array([0, 1, 0, 0, 0, 1], dtype=bool),
    )
    part = gather(batch, np.array([2, 1, 0]))
    assert part.ids.tolist() == [3, 4, 5, 6, 1, 2]
    assert part.offsets.tolist() == [0, 4, 4, 6]
    assert part.oov.tolist() == [False, False, False, True, False, True]


@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("eos", [True, False])
def test_results_equal_one_backend_call(ngram: NgramModel, per_token: bool, eos: bool) -> None:
    scorer = _scorer(ngram)
    words = [w for w in ngram.vocab.words if not w.startswith("<")] + ["zzz-oov"]
    texts = _texts(np.random.default_rng(7), 120, words)
    options = ScoreOptions(eos=eos)

    async def main() -> tuple[BatchScores, BatchScores]:
        queue = ScoringQueue(
            "toy", ngram, ScoringLimits(scoring_unit_tokens=16, scoring_unit_rows=4)
        )
        try:
            prepared = scorer.prepare_texts(texts, options, details=per_token)
            return await queue.score(prepared), prepared.run(ngram)
        finally:
            queue.close()

    got, expected = asyncio.run(main())
    np.testing.assert_allclose(got.totals, expected.totals, atol=1e-9)
    if per_token:
        assert got.token_offsets is not None and expected.token_offsets is not None
        assert got.token_offsets.tolist() == expected.token_offsets.tolist()
        np.testing.assert_allclose(got.token_log_probs, expected.token_log_probs, atol=1e-9)
        assert got.ngram_lengths is not None and expected.ngram_lengths is not None
        assert got.ngram_lengths.tolist() == expected.ngram_lengths.tolist()


def _prepared(scorer: Scorer, count: int, words: str = "a b c") -> PreparedScoring:
    return scorer.prepare_texts([words] * count, ScoreOptions())


def test_a_short_request_waits_for_one_unit_not_the_whole_long_one(ngram: NgramModel) -> None:
    gated = GatedBackend(ngram)
    scorer = _scorer(gated)  # type: ignore[arg-type]

    async def main() -> list[str]:
        queue = ScoringQueue(
            "toy", gated, ScoringLimits(scoring_unit_tokens=8, scoring_unit_rows=2)
        )  # type: ignore[arg-type]
        order: list[str] = []
        try:
            gated.gate.clear()
            long = asyncio.create_task(queue.score(_prepared(scorer, 40)))
            await asyncio.to_thread(gated.entered.acquire)  # the first long unit is in flight
            short = asyncio.create_task(queue.score(_prepared(scorer, 1, "b")))
            await asyncio.sleep(0.05)
            gated.gate.set()
            for task, name in ((short, "short"), (long, "long")):
                await task
                order.append(name)
            return order
        finally:
            queue.close()

    assert asyncio.run(main()) == ["short", "long"]
    # 40 texts of 4 positions in units of 2 rows: 20 long passes; the short one came second.
    assert len(gated.passes) == 21


class LongPassBackend:
    """A real backend whose passes of more than one row are held until the test lets them
    go: a long request's pass in flight, for as long as the test needs."""

    def __init__(self, inner: LanguageModelBackend) -> None:
        self.inner = inner
        self.vocab = inner.vocab
        self.long_entered = threading.Event()
        self.release = threading.Event()
        self.rows: list[int] = []

    def score(
        self, batch: EncodedBatch, *, bos: bool = True, eos: bool = True, per_token: bool = False
    ) -> BatchScores:
        if batch.batch_size > 1:
            self.long_entered.set()
            self.release.wait(10)
        self.rows.append(batch.batch_size)
        return self.inner.score(batch, bos=bos, eos=eos, per_token=per_token)


@pytest.mark.parametrize("lane", [True, False])
def test_the_interactive_lane_serves_a_short_request_during_a_long_pass(
    ngram: NgramModel, lane: bool
) -> None:
    backend = LongPassBackend(ngram)
    scorer = _scorer(backend)  # type: ignore[arg-type]
    limits = ScoringLimits(scoring_unit_tokens=64, scoring_unit_rows=32)

    async def main() -> tuple[bool, BatchScores, BatchScores]:
        queue = ScoringQueue("toy", backend, limits, interactive_lane=lane)  # type: ignore[arg-type]
        try:
            long = asyncio.create_task(queue.score(_prepared(scorer, 400)))
            await asyncio.to_thread(backend.long_entered.wait, 10)
            short = asyncio.create_task(queue.score(_prepared(scorer, 1, "b c")))
            # With the lane, the short request is answered while the long pass is held.
            done, _ = await asyncio.wait({short}, timeout=2.0)
            answered_during = short in done
            backend.release.set()
            return answered_during, await short, await long
        finally:
            backend.release.set()
            queue.close()

    answered_during, short, long = asyncio.run(main())
    assert answered_during is lane
    direct_short = ngram.score(_prepared(scorer, 1, "b c").batch)
    np.testing.assert_allclose(short.totals, direct_short.totals)
    direct_long = ngram.score(_prepared(scorer, 400).batch)
    np.testing.assert_allclose(long.totals, direct_long.totals)


def test_concurrent_requests_share_a_pass(ngram: NgramModel) -> None:
    gated = GatedBackend(ngram)
    scorer = _scorer(gated)  # type: ignore[arg-type]

    async def main() -> None:
        queue = ScoringQueue(
            "toy", gated, ScoringLimits(scoring_unit_tokens=64, scoring_unit_rows=16)
        )  # type: ignore[arg-type]
        try:
            gated.gate.clear()
            first = asyncio.create_task(queue.score(_prepared(scorer, 1)))
            await asyncio.to_thread(gated.entered.acquire)
            rest = [asyncio.create_task(queue.score(_prepared(scorer, 2))) for _ in range(4)]
            await asyncio.sleep(0.05)
            gated.gate.set()
            await asyncio.gather(first, *rest)
        finally:
            queue.close()

    asyncio.run(main())
    assert gated.passes == [1, 8]  # the four waiting requests in one pass


def test_a_cancelled_request_stops_within_a_unit(ngram: NgramModel) -> None:
    gated = GatedBackend(ngram)
    scorer = _scorer(gated)  # type: ignore[arg-type]

    async def main() -> None:
        queue = ScoringQueue(
            "toy", gated, ScoringLimits(scoring_unit_tokens=4, scoring_unit_rows=1)
        )  # type: ignore[arg-type]
        try:
            gated.gate.clear()
            task = asyncio.create_task(queue.score(_prepared(scorer, 50)))
            await asyncio.to_thread(gated.entered.acquire)
            task.cancel()
            await asyncio.sleep(0.01)
            gated.gate.set()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.sleep(0.1)
            assert queue.queued_tokens == 0
        finally:
            queue.close()

    asyncio.run(main())
    assert len(gated.passes) <= 2  # the pass in flight (and at most the one being picked)


def test_an_expired_request_fails_with_deadline_exceeded(ngram: NgramModel) -> None:
    gated = GatedBackend(ngram)
    scorer = _scorer(gated)  # type: ignore[arg-type]

    async def main() -> None:
        queue = ScoringQueue(
            "toy", gated, ScoringLimits(scoring_unit_tokens=4, scoring_unit_rows=1)
        )  # type: ignore[arg-type]
        try:
            gated.gate.clear()
            task = asyncio.create_task(
                queue.score(_prepared(scorer, 50), deadline=time.monotonic() + 0.05)
            )
            await asyncio.to_thread(gated.entered.acquire)
            await asyncio.sleep(0.1)
            gated.gate.set()
            with pytest.raises(DeadlineExceeded):
                await task
        finally:
            queue.close()

    asyncio.run(main())
    assert len(gated.passes) == 1


def test_queued_work_over_the_limit_is_refused_before_it_starts(ngram: NgramModel) -> None:
    gated = GatedBackend(ngram)
    scorer = _scorer(gated)  # type: ignore[arg-type]

    async def main() -> None:
        limits = ScoringLimits(
            scoring_unit_tokens=8, scoring_unit_rows=2, scoring_max_queued_tokens=100
        )
        queue = ScoringQueue("toy", gated, limits)  # type: ignore[arg-type]
        try:
            gated.gate.clear()
            first = asyncio.create_task(queue.score(_prepared(scorer, 20)))  # 80 positions
            await asyncio.to_thread(gated.entered.acquire)
            with pytest.raises(Overloaded, match="max_queued_tokens 100"):
                await queue.score(_prepared(scorer, 10))  # 40 more: over 100
            gated.gate.set()
            await first
        finally:
            queue.close()

    asyncio.run(main())


def test_a_failing_request_does_not_fail_the_requests_sharing_its_pass(
    ngram: NgramModel,
) -> None:
    gated = GatedBackend(ngram)
    scorer = _scorer(gated)  # type: ignore[arg-type]
    poison = ngram.vocab.index["c"]

    async def main() -> list[object]:
        queue = ScoringQueue(
            "toy", gated, ScoringLimits(scoring_unit_tokens=64, scoring_unit_rows=16)
        )  # type: ignore[arg-type]
        try:
            gated.gate.clear()
            first = asyncio.create_task(queue.score(_prepared(scorer, 1, "a")))
            await asyncio.to_thread(gated.entered.acquire)
            gated.fail_rows_with = poison
            tasks = [
                asyncio.create_task(queue.score(_prepared(scorer, 1, words)))
                for words in ("a b", "a c", "b b")
            ]
            await asyncio.sleep(0.05)
            gated.gate.set()
            await first
            return await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            queue.close()

    good, bad, also_good = asyncio.run(main())
    assert isinstance(good, BatchScores) and isinstance(also_good, BatchScores)
    assert isinstance(bad, ValueError)


def test_the_per_text_limit_is_checked_before_any_work(ngram: NgramModel) -> None:
    scorer = _scorer(ngram)
    with pytest.raises(InvalidArgument, match=r"texts\[1\]: has 5 tokens"):
        scorer.prepare_texts(["a", "a b c a b"], ScoreOptions(), max_tokens_per_text=4)
