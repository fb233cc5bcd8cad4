"""The generation scheduler on a real n-gram backend: joins, one step per iteration, limits."""

from __future__ import annotations

import asyncio

import pytest

from lmserve.server.backends.ngram.model import NgramModel
from lmserve.server.decoding.params import GenerateParams, SamplingParams, StoppingParams
from lmserve.server.decoding.stopping import FinishReason
from lmserve.server.errors import Overloaded
from lmserve.server.families.catalog import make_stepper
from lmserve.server.settings import GenerationLimits
from lmserve.server.worker.generation.scheduler import GenerationScheduler
from lmserve.server.worker.generation.sequence import (
    FinishEvent,
    GenerationRequest,
    GenerationStream,
    TokenEvent,
    Usage,
)

ARPA = """\\data\\
ngram 1=6

\\1-grams:
-1.0\t<unk>
-99\t<s>
-0.9\t</s>
-0.5\tthe
-0.7\tcat
-0.8\tsat

\\end\\
"""


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> NgramModel:
    path = tmp_path_factory.mktemp("arpa") / "uni.arpa"
    path.write_text(ARPA)
    return NgramModel.from_arpa(path)


def _params(tokens: int, n: int = 1, seed: int | None = 1) -> GenerateParams:
    return GenerateParams(
        stopping=StoppingParams(max_new_tokens=tokens, ignore_eos=True),
        sampling=SamplingParams(seed=seed),
        n=n,
    )


def _scheduler(model: NgramModel, **limits: int) -> GenerationScheduler:
    return GenerationScheduler("uni", make_stepper(model), model.vocab, GenerationLimits(**limits))


async def _collect(stream) -> list[object]:  # type: ignore[no-untyped-def]
    return [e async for e in stream]


def test_concurrent_requests_share_steps(model: NgramModel) -> None:
    scheduler = _scheduler(model)

    async def main() -> list[list[object]]:
        streams = [scheduler.submit(GenerationRequest([], _params(10, n=2))) for _ in range(3)]
        return await asyncio.gather(*(_collect(s) for s in streams))

    try:
        results = asyncio.run(main())
    finally:
        scheduler.close()
    for events in results:
        assert sum(isinstance(e, TokenEvent) for e in events) == 20
        assert sum(isinstance(e, FinishEvent) for e in events) == 2
    # 6 sequences of 10 tokens: 9 batched steps after the prefill when all joined together,
    # never one step per sequence (54).
    assert scheduler.steps <= 12
    assert not scheduler.active


def test_full_queue_is_overloaded_and_cancel_frees(model: NgramModel) -> None:
    scheduler = _scheduler(model, max_active_sequences=1, max_queued_requests=1)

    async def main() -> None:
        first = scheduler.submit(GenerationRequest([], _params(100_000)))
        events = first.__aiter__()
        await events.__anext__()  # running: it holds the only slot
        scheduler.submit(GenerationRequest([], _params(3)))  # waits
        with pytest.raises(Overloaded):
            scheduler.submit(GenerationRequest([], _params(3)))
        first.cancel()
        await events.aclose()
        for _ in range(200):
            if not scheduler.pending and not scheduler.active:
                break
            await asyncio.sleep(0.01)
        assert scheduler.pending == 0 and not scheduler.active

    try:
        asyncio.run(main())
    finally:
        scheduler.close()


def test_a_burst_that_fits_the_free_slots_is_not_refused(model: NgramModel) -> None:
    """Requests the scheduler thread has not picked up yet, but has slots for, are not
    "queued": only those beyond the free slots count against max_queued_requests."""
    scheduler = _scheduler(model, max_active_sequences=4, max_queued_requests=1)

    async def main() -> None:
        # Submitted back to back, without yielding: the scheduler thread may not have run yet.
        streams = [scheduler.submit(GenerationRequest([], _params(100_000))) for _ in range(5)]
        with pytest.raises(Overloaded) as refused:
            scheduler.submit(GenerationRequest([], _params(3)))
        assert "1 Generate requests already wait" in str(refused.value)
        for stream in streams:
            stream.cancel()

    try:
        asyncio.run(main())
    finally:
        scheduler.close()


def _token(index: int) -> TokenEvent:
    return TokenEvent(0, index, 3 + index, f" w{index}", -1.0)


def _finish(tokens: int) -> FinishEvent:
    return FinishEvent(0, FinishReason.LENGTH, "", -1.0 * tokens, Usage(0, tokens, 0.0, 0.0))


def test_stream_merges_hand_overs_that_piled_up() -> None:
    """A consumer that fell behind gets everything queued in one batch, in order; an error
    queued behind events comes after them."""

    async def main() -> tuple[list[list[object]], list[list[object]], str]:
        stream = GenerationStream(GenerationRequest([], _params(3)), samples=1)
        for item in ([_token(0)], [_token(1)], [_token(2), _finish(3)]):
            stream._put(item)  # type: ignore[arg-type]
        merged: list[list[object]] = [list(b) async for b in stream.batches()]

        failing = GenerationStream(GenerationRequest([], _params(3)), samples=1)
        failing._put([_token(0)])
        failing._put([_token(1)])
        failing._put(RuntimeError("model failed"))
        before: list[list[object]] = []
        with pytest.raises(RuntimeError) as caught:
            async for batch in failing.batches():
                before.append(list(batch))
        return merged, before, str(caught.value)

    merged, before, error = asyncio.run(main())
    assert merged == [[_token(0), _token(1), _token(2), _finish(3)]]
    assert before == [[_token(0), _token(1)]]
    assert error == "model failed"


def test_stream_hands_over_at_once_when_keeping_up() -> None:
    """A consumer that keeps up gets each hand-over as it arrives: no token waits for the next."""

    async def main() -> list[list[object]]:
        stream = GenerationStream(GenerationRequest([], _params(2)), samples=1)
        got: list[list[object]] = []
        stream._put([_token(0)])
        async for batch in stream.batches():
            got.append(list(batch))
            if len(got) == 1:
                stream._put([_token(1), _finish(2)])  # arrives only after the first was taken
        return got

    assert asyncio.run(main()) == [[_token(0)], [_token(1), _finish(2)]]
