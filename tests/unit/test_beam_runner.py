"""BeamRunner: searches on the model's own threads, stopped within a step when nobody waits."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from test_beam import BIGRAM

from lmserve.server.backends.ngram.model import NgramModel
from lmserve.server.decoding.beam import beam_search
from lmserve.server.decoding.params import BeamParams
from lmserve.server.errors import Cancelled, DeadlineExceeded, Overloaded
from lmserve.server.families.catalog import make_stepper
from lmserve.server.settings import GenerationLimits
from lmserve.server.worker.generation.beam_runner import BeamRunner

STEP_SECONDS = 0.01


@pytest.fixture(scope="module")
def bigram(tmp_path_factory: pytest.TempPathFactory) -> NgramModel:
    path = tmp_path_factory.mktemp("arpa") / "bigram.arpa"
    path.write_text(BIGRAM)
    return NgramModel.from_arpa(path)


class CountingStepper:
    """A real stepper whose steps take STEP_SECONDS more and are counted with their times."""

    def __init__(self, inner: Any, delay: float = STEP_SECONDS) -> None:
        self.inner = inner
        self.delay = delay
        self.releases_gil = inner.releases_gil
        self.started: list[float] = []
        self.lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def step(self, tokens: Any, state: Any) -> Any:
        with self.lock:
            self.started.append(time.monotonic())
        time.sleep(self.delay)
        return self.inner.step(tokens, state)

    def steps_after(self, instant: float) -> int:
        with self.lock:
            return sum(t >= instant for t in self.started)


def _long_params() -> BeamParams:
    # min_length keeps every beam alive (no </s>) for the whole search: effectively endless.
    return BeamParams(beam_width=4, max_length=100_000, min_length=100_000, num_return=1)


def test_runner_answers_as_the_direct_search(bigram: NgramModel) -> None:
    stepper = make_stepper(bigram)
    params = BeamParams(beam_width=3, max_length=5, num_return=2)
    runner = BeamRunner("bi", stepper, GenerationLimits())
    try:
        got = asyncio.run(runner.run([3], params))
    finally:
        runner.close()
    assert got == beam_search(stepper, [3], params)


def test_should_stop_ends_the_search_with_cancelled(bigram: NgramModel) -> None:
    stepper = CountingStepper(make_stepper(bigram), delay=0)
    calls = 0

    def stop_at_five() -> bool:
        nonlocal calls
        calls += 1
        return calls > 5

    with pytest.raises(Cancelled, match="stopped after 4 steps"):
        beam_search(stepper, [3], _long_params(), should_stop=stop_at_five)
    assert len(stepper.started) == 4


def test_a_cancelled_search_stops_within_a_step(bigram: NgramModel) -> None:
    stepper = CountingStepper(make_stepper(bigram))
    runner = BeamRunner("bi", stepper, GenerationLimits())

    async def main() -> float:
        task = asyncio.create_task(runner.run([3], _long_params()))
        await asyncio.sleep(0.2)
        assert stepper.started, "the search is running"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return time.monotonic()

    try:
        cancelled_at = asyncio.run(main())
        time.sleep(0.2)  # 20 steps' time
        assert stepper.steps_after(cancelled_at) <= 1
        assert runner.running == 0
    finally:
        runner.close()


def test_a_passed_deadline_stops_the_search(bigram: NgramModel) -> None:
    stepper = CountingStepper(make_stepper(bigram))
    runner = BeamRunner("bi", stepper, GenerationLimits())
    deadline = time.monotonic() + 0.15
    try:
        with pytest.raises(DeadlineExceeded):
            asyncio.run(runner.run([3], _long_params(), deadline))
    finally:
        runner.close()
    assert stepper.started, "the search ran until the deadline"
    assert stepper.steps_after(deadline) <= 1


def test_searches_beyond_the_limits_wait_then_are_refused(bigram: NgramModel) -> None:
    stepper = CountingStepper(make_stepper(bigram))
    limits = GenerationLimits(max_running_searches=1, max_queued_searches=1)
    runner = BeamRunner("bi", stepper, limits)
    short = BeamParams(beam_width=2, max_length=3, num_return=1)

    async def main() -> None:
        first = asyncio.create_task(runner.run([3], _long_params()))
        second = asyncio.create_task(runner.run([3], short))
        await asyncio.sleep(0.1)
        assert (runner.running, runner.waiting) == (1, 1)
        with pytest.raises(Overloaded, match="1 BeamSearch requests already wait"):
            await runner.run([3], short)
        first.cancel()
        assert len(await second) == 1  # ran once the first stopped
        with pytest.raises(asyncio.CancelledError):
            await first

    try:
        asyncio.run(main())
    finally:
        runner.close()


def test_close_returns_at_once_while_a_long_search_runs(bigram: NgramModel) -> None:
    stepper = CountingStepper(make_stepper(bigram), delay=0.05)
    limits = GenerationLimits(max_running_searches=1)
    runner = BeamRunner("bi", stepper, limits)

    async def main() -> float:
        running = asyncio.create_task(runner.run([3], _long_params()))
        waiting = asyncio.create_task(runner.run([3], _long_params()))
        await asyncio.sleep(0.2)
        start = time.perf_counter()
        runner.close()
        took = time.perf_counter() - start
        for task in (running, waiting):
            with pytest.raises(Overloaded, match="shutting down"):
                await task
        with pytest.raises(Overloaded):
            await runner.run([3], _long_params())
        return took

    took = asyncio.run(main())
    assert took < 0.03  # one step is 0.05 s: close waited for none
    closed_at = time.monotonic()
    time.sleep(0.15)
    assert stepper.steps_after(closed_at) <= 1


def test_a_cancelled_waiting_search_frees_its_place(bigram: NgramModel) -> None:
    stepper = CountingStepper(make_stepper(bigram))
    limits = GenerationLimits(max_running_searches=1, max_queued_searches=1)
    runner = BeamRunner("bi", stepper, limits)

    async def main() -> None:
        first = asyncio.create_task(runner.run([3], _long_params()))
        second = asyncio.create_task(runner.run([3], _long_params()))
        await asyncio.sleep(0.1)
        assert runner.waiting == 1
        second.cancel()
        with pytest.raises(asyncio.CancelledError):
            await second
        assert runner.waiting == 0
        third = asyncio.create_task(runner.run([3], _long_params()))  # not refused
        await asyncio.sleep(0.05)
        assert runner.waiting == 1
        for task in (first, third):
            task.cancel()
        await asyncio.gather(first, third, return_exceptions=True)

    try:
        asyncio.run(main())
    finally:
        runner.close()
