"""The generation scheduler's admission, gauge, chunked prefill and NaN/inf handling, on real
n-gram and recurrent steppers (a wrapper injects bad rows; nothing of ours is mocked)."""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import numpy as np
import pytest
from test_stepping import EagerBackend

from lmserve.server.backends.ngram.model import NgramModel
from lmserve.server.backends.stepping import ContextStepper, Stepper
from lmserve.server.decoding.params import GenerateParams, SamplingParams, StoppingParams
from lmserve.server.decoding.sampling import SequenceSampler, request_generators, sample_next
from lmserve.server.errors import ModelOutputError, Overloaded
from lmserve.server.families.catalog import make_stepper
from lmserve.server.settings import GenerationLimits
from lmserve.server.shared.stats import EngineStats
from lmserve.server.worker.generation.prefill import Prefill
from lmserve.server.worker.generation.scheduler import GenerationScheduler
from lmserve.server.worker.generation.sequence import (
    FinishEvent,
    GenerationRequest,
    GenerationStream,
    TokenEvent,
)

BIGRAM = """\\data\\
ngram 1=7
ngram 2=8

\\1-grams:
-1.3\t<unk>\t0
-99\t<s>\t-0.3
-0.9\t</s>
-0.6\ta\t-0.2
-0.8\tb\t-0.25
-0.7\tc\t-0.1
-0.8\td\t-0.4

\\2-grams:
-0.2\t<s> a
-0.5\t<s> c
-0.3\ta b
-0.6\ta d
-0.25\tb c
-0.4\tc a
-0.7\tc d
-0.35\td b

\\end\\
"""


@pytest.fixture(scope="module")
def bigram(tmp_path_factory: pytest.TempPathFactory) -> NgramModel:
    path = tmp_path_factory.mktemp("arpa") / "bigram.arpa"
    path.write_text(BIGRAM)
    return NgramModel.from_arpa(path)


def _params(tokens: int, seed: int | None = 1, n: int = 1) -> GenerateParams:
    return GenerateParams(
        stopping=StoppingParams(max_new_tokens=tokens, ignore_eos=True),
        sampling=SamplingParams(seed=seed),
        n=n,
    )


async def _tokens(stream: Any) -> list[int]:
    return [e.token_id async for e in stream if isinstance(e, TokenEvent)]


def _run(scheduler: GenerationScheduler, main: Any) -> Any:
    try:
        return asyncio.run(main())
    finally:
        scheduler.close()


async def _wait(predicate: Any, timeout: float = 5.0) -> None:
    for _ in range(int(timeout / 0.01)):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


# -- the active-sequences gauge --------------------------------------------------------------


def test_active_sequences_gauge_counts_every_running_sequence(bigram: NgramModel) -> None:
    stats = EngineStats("bi")
    scheduler = GenerationScheduler(
        "bi",
        make_stepper(bigram),
        bigram.vocab,
        GenerationLimits(max_unread_events=10**9),  # unread streams stay running (no parking)
        stats,
    )

    def gauge() -> int:
        return stats.active_sequences

    async def main() -> None:
        streams = [scheduler.submit(GenerationRequest([], _params(10**6, n=2))) for _ in range(5)]
        readers = [s.__aiter__() for s in streams]
        for r in readers:
            await r.__anext__()  # every request runs
        await _wait(lambda: len(scheduler.active) == 10)
        assert gauge() == 10
        streams[0].cancel()
        await _wait(lambda: len(scheduler.active) == 8)
        await _wait(lambda: gauge() == 8)
        for s in streams:
            s.cancel()
        await _wait(lambda: not scheduler.active)
        assert gauge() == 0
        for r in readers:
            await r.aclose()

    _run(scheduler, main)


# -- admission -------------------------------------------------------------------------------


def test_no_waiting_room_admits_what_fits_and_refuses_the_rest(bigram: NgramModel) -> None:
    limits = GenerationLimits(
        max_active_sequences=3, max_queued_requests=0, max_unread_events=10**9
    )
    scheduler = GenerationScheduler("bi", make_stepper(bigram), bigram.vocab, limits)

    async def main() -> None:
        running = [scheduler.submit(GenerationRequest([], _params(10**6))) for _ in range(3)]
        with pytest.raises(Overloaded, match="0 Generate requests already wait"):
            scheduler.submit(GenerationRequest([], _params(3)))
        readers = [s.__aiter__() for s in running]  # kept: a dropped reader cancels its stream
        first = [await r.__anext__() for r in readers]
        assert all(isinstance(e, TokenEvent) for e in first)
        running[0].cancel()
        await _wait(lambda: len(scheduler.active) == 2)
        late = scheduler.submit(GenerationRequest([], _params(3)))  # a slot is free again
        assert len(await _tokens(late)) == 3
        for s in running:
            s.cancel()
        for r in readers:
            await r.aclose()

    _run(scheduler, main)


# -- chunked prefill -------------------------------------------------------------------------


def _long_prompt(length: int) -> list[int]:
    rng = np.random.default_rng(7)
    return rng.integers(3, 7, length).tolist()  # real words of both models' vocabularies


@pytest.mark.parametrize("which", ["ngram", "recurrent"])
def test_chunked_prefill_gives_the_one_shot_tokens(bigram: NgramModel, which: str) -> None:
    """Same seed, same tokens whether the prompt is read 7 tokens an iteration or at once;
    with another stream running beside it and samples n = 2."""
    stepper: Stepper = make_stepper(bigram if which == "ngram" else EagerBackend("lstm", chunk=4))
    prompt = _long_prompt(300)

    def generate(chunk: int) -> tuple[list[list[int]], int]:
        limits = GenerationLimits(prefill_chunk_tokens=chunk)
        scheduler = GenerationScheduler("m", stepper, stepper.vocab, limits)

        async def main() -> list[list[int]]:
            other = scheduler.submit(GenerationRequest([4], _params(10**6, seed=3)))
            reader = other.__aiter__()
            await reader.__anext__()
            stream = scheduler.submit(GenerationRequest(prompt, _params(12, seed=5, n=2)))
            events = [e async for e in stream]
            other.cancel()
            await reader.aclose()
            return [
                [e.token_id for e in events if isinstance(e, TokenEvent) and e.sample_index == k]
                for k in range(2)
            ]

        out = _run(scheduler, main)
        return out, scheduler.prefilled_tokens

    chunked, fed = generate(7)
    one_shot, _ = generate(100_000)
    assert chunked == one_shot
    assert all(len(t) == 12 for t in chunked)
    assert fed >= len(prompt) + 1


def test_running_streams_get_tokens_between_prompt_chunks(bigram: NgramModel) -> None:
    """While a 700-token prompt is read 10 tokens an iteration, a running stream keeps getting a
    token every iteration: at least 60 before the long request's first token."""
    limits = GenerationLimits(prefill_chunk_tokens=10)
    scheduler = GenerationScheduler("bi", make_stepper(bigram), bigram.vocab, limits)
    order: list[str] = []

    async def main() -> None:
        running = scheduler.submit(GenerationRequest([], _params(10**6)))
        reader = running.__aiter__()
        await reader.__anext__()
        long = scheduler.submit(GenerationRequest(_long_prompt(700), _params(1)))

        async def read_running() -> None:
            async for _ in reader:
                order.append("running")
                if "long" in order:
                    return

        async def read_long() -> None:
            async for e in long:
                if isinstance(e, TokenEvent):
                    order.append("long")

        await asyncio.gather(read_running(), read_long())
        running.cancel()

    _run(scheduler, main)
    assert order.index("long") >= 60


class SlowFeed(ContextStepper):
    """The real n-gram stepper, with an LSTM-like cost per prompt token (0.5 ms)."""

    costly_prompts = True

    def feed(self, chunks: Any, state: Any) -> Any:
        time.sleep(0.0005 * sum(map(len, chunks)))
        return super().feed(chunks, state)


def test_prompt_chunks_adapt_to_the_time_limit(bigram: NgramModel) -> None:
    prefill = Prefill(SlowFeed(bigram, max_context=1), bigram.vocab.bos_id, chunk_tokens=512)
    prefill.add([GenerationStream(GenerationRequest(_long_prompt(2000), _params(1)), 1)])
    sizes: list[int] = []
    while prefill.pending:
        before = prefill.fed_tokens
        prefill.advance(0.01)  # 10 ms: about 20 tokens
        sizes.append(prefill.fed_tokens - before)
    later = sizes[10:]
    assert max(later) <= 40 and statistics.median(later) >= 4
    assert sum(sizes) == 2001  # <s> and the whole prompt, each token once
    unbounded = Prefill(SlowFeed(bigram, max_context=1), bigram.vocab.bos_id, chunk_tokens=512)
    unbounded.add([GenerationStream(GenerationRequest(_long_prompt(2000), _params(1)), 1)])
    unbounded.advance(None)  # nothing runs beside it: a whole chunk
    assert unbounded.fed_tokens == 512


def test_cancelled_while_prefilling_frees_its_slots(bigram: NgramModel) -> None:
    limits = GenerationLimits(prefill_chunk_tokens=1, max_active_sequences=2)
    scheduler = GenerationScheduler("bi", make_stepper(bigram), bigram.vocab, limits)

    async def main() -> None:
        long = scheduler.submit(GenerationRequest(_long_prompt(5000), _params(5, n=2)))
        await asyncio.sleep(0.05)
        long.cancel()
        short = scheduler.submit(GenerationRequest([], _params(3)))
        assert len(await _tokens(short)) == 3

    _run(scheduler, main)


# -- NaN / inf log-probabilities ------------------------------------------------------------


class FaultyStepper(ContextStepper):
    """A real n-gram stepper whose rows for contexts holding token `poison` are overwritten
    with `row(V)`: the model fault under test. Contexts keep the whole history."""

    def __init__(self, model: NgramModel, poison: int, row: Any) -> None:
        super().__init__(model)
        self.poison, self.row = poison, row

    def _distributions(self, state: Any) -> Any:
        out = np.array(super()._distributions(state), dtype=np.float32)
        for i, context in enumerate(state):
            if self.poison in context:
                out[i] = self.row(out[i])
        return out


def _with(index: int, value: float) -> Any:
    def row(r: np.ndarray) -> np.ndarray:
        r = r.copy()
        r[index] = value
        return r

    return row


BAD_ROWS = {
    "nan": _with(4, np.nan),
    "nan_at_bos": _with(1, np.nan),  # hidden by the <s> ban: still a bad row
    "plus_inf": _with(5, np.inf),
    "all_minus_inf": lambda r: np.full_like(r, -np.inf),
}


@pytest.mark.parametrize("fault", sorted(BAD_ROWS))
def test_sample_next_fails_only_the_bad_rows(fault: str) -> None:
    rng = np.random.default_rng(0)
    good = np.log(rng.dirichlet(np.ones(8), 3)).astype(np.float32)
    batch = np.concatenate([good[:1], BAD_ROWS[fault](good[1])[None], good[2:]])

    def samplers(seeds: list[int]) -> list[SequenceSampler]:
        return [SequenceSampler(SamplingParams(seed=s), request_generators(s, 1)[0]) for s in seeds]

    rows = samplers([1, 2, 3])
    out = sample_next(batch, rows, eos_id=2, bos_id=1, top_logprobs=2)
    alone = sample_next(good[[0, 2]], samplers([1, 3]), eos_id=2, bos_id=1)
    assert out.failed == (1,)
    assert out.token_ids[1] == -1 and np.isnan(out.log_probs[1])
    assert out.token_ids[[0, 2]].tolist() == alone.token_ids.tolist()
    assert rows[1].tokens == [] and len(rows[0].tokens) == 1


def test_minus_inf_for_some_tokens_is_a_zero_probability_token() -> None:
    row = np.log(np.full(8, 1 / 6)).astype(np.float32)
    row[[0, 4, 5]] = -np.inf  # <unk> and two words impossible; <s> is banned anyway
    rows = [SequenceSampler(SamplingParams(seed=s), request_generators(s, 1)[0]) for s in range(64)]
    out = sample_next(np.repeat(row[None], 64, axis=0), rows, eos_id=2, bos_id=1)
    assert out.failed == ()
    assert set(out.token_ids.tolist()) <= {2, 3, 6, 7}


@pytest.mark.parametrize("fault", sorted(BAD_ROWS))
def test_a_bad_row_fails_its_request_and_the_others_keep_generating(
    bigram: NgramModel, fault: str
) -> None:
    poison = 6  # "d": only the faulty request's prompt has it; the others cannot draw it

    class Banning(FaultyStepper):
        def _distributions(self, state: Any) -> Any:  # "d" impossible for the good rows
            out = super()._distributions(state)
            for i, context in enumerate(state):
                if poison not in context:
                    out[i, poison] = -np.inf
            return out

    faulty = Banning(bigram, poison=poison, row=BAD_ROWS[fault])
    clean = Banning(bigram, poison=poison, row=lambda r: r)

    def run(stepper: Stepper, with_bad: bool) -> list[list[int]]:
        scheduler = GenerationScheduler("bi", stepper, bigram.vocab, GenerationLimits())

        async def main() -> list[list[int]]:
            good = [scheduler.submit(GenerationRequest([3], _params(30, seed=s))) for s in (1, 2)]
            if with_bad:
                bad = scheduler.submit(GenerationRequest([3, poison], _params(30, seed=9)))
                with pytest.raises(ModelOutputError, match="NaN/inf"):
                    await _tokens(bad)
            return list(await asyncio.gather(*(_tokens(s) for s in good)))

        return _run(scheduler, main)  # type: ignore[no-any-return]

    got = run(faulty, True)
    assert got == run(clean, False)
    assert all(len(t) == 30 and poison not in t for t in got)


def test_finish_events_still_end_every_sample(bigram: NgramModel) -> None:
    scheduler = GenerationScheduler("bi", make_stepper(bigram), bigram.vocab, GenerationLimits())

    async def main() -> list[Any]:
        return [e async for e in scheduler.submit(GenerationRequest([3], _params(4, n=3)))]

    events = _run(scheduler, main)
    assert sum(isinstance(e, FinishEvent) for e in events) == 3


# -- metrics ---------------------------------------------------------------------------------


def test_grouped_observations_export_as_prometheus_repeated_observes() -> None:
    """A stats histogram's `observe(value, count)` exports what `count` prometheus-client
    observations give (values on bucket edges and past the last bound included)."""
    from collections.abc import Iterable

    from prometheus_client import CollectorRegistry, Histogram, Metric

    from lmserve.server.front.process.stats_export import metric_families
    from lmserve.server.metrics import DURATION_BUCKETS

    name = "lmserve_inter_token_latency_seconds"
    registry = CollectorRegistry()
    single = Histogram(name, "", ["model"], buckets=DURATION_BUCKETS, registry=registry)
    stats = EngineStats("m")
    for value, count in [(0.0005, 3), (0.001, 2), (0.05, 7), (1.0, 1), (30.0, 4), (99.0, 2)]:
        stats.inter_token_latency.observe(value, count)
        for _ in range(count):
            single.labels(model="m").observe(value)

    def samples(families: Iterable[Metric]) -> list[tuple[str, dict[str, str], float]]:
        return [
            (s.name, s.labels, round(s.value, 9))
            for m in families
            if m.name == name
            for s in m.samples
            if not s.name.endswith("_created")
        ]

    assert samples(metric_families([stats])) == samples(registry.collect())


def test_inter_token_latency_counts_every_gap(bigram: NgramModel) -> None:
    stats = EngineStats("bi")
    scheduler = GenerationScheduler(
        "bi",
        make_stepper(bigram),
        bigram.vocab,
        GenerationLimits(max_unread_events=10**9),  # unread streams stay running (no parking)
        stats,
    )

    async def main() -> None:
        streams = [scheduler.submit(GenerationRequest([], _params(10, n=2))) for _ in range(3)]
        await asyncio.gather(*(_tokens(s) for s in streams))

    _run(scheduler, main)
    assert stats.inter_token_latency.count == 54
    assert stats.generated_tokens == 60
    assert stats.time_to_first_token.count == 3  # one per request (its first sample's)
