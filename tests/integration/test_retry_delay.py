"""The RetryInfo delay of a full scoring queue is estimated from the queued work, over a real
server and the client's RetryInfo parsing: a bigger flood asks callers to wait longer.

The n-gram model's passes are paced (a fixed sleep each, like a neural pass) so that the
measured throughput is stable, and held at a gate while the floods wait, so the queued work is
exactly what the test queued when the probes are refused."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from serve_process import wait_until
from served import ServerFactory

from lmserve.client import LmServeClient
from lmserve.client.errors import ResourceExhaustedError
from lmserve.server.front.process.app import BackgroundServer
from lmserve.server.worker.retry_estimate import MAX_DELAY, MIN_DELAY
from lmserve.server.worker.scoring.queue import ScoringQueue

TEXT = " ".join(["looking on a little"] * 250)[: -len(" little")]  # 999 words + </s>
TOKENS_PER_TEXT = 1000
MAX_QUEUED = 100_000
PASS_SECONDS = 0.02


class PacedBackend:
    """The model's backend with a fixed time per pass, held while `gate` is clear."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.gate = threading.Event()
        self.gate.set()

    def score(self, batch: Any, **options: Any) -> Any:
        self.gate.wait(60)
        time.sleep(PASS_SECONDS)
        return self.inner.score(batch, **options)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.fixture
def paced(
    serve: ServerFactory, model_repository: Path
) -> Iterator[tuple[BackgroundServer, ScoringQueue, PacedBackend]]:
    with serve.private(
        model_repository,
        scoring_max_queued_tokens=MAX_QUEUED,
        # In-process engine: the test paces the model's backend inside its scoring queue.
        engine_workers=False,
    ) as server:  # its own: the test replaces a model's backend
        queue = server.running.models.ready("test").engine.scoring  # type: ignore[attr-defined]
        backend = PacedBackend(queue.backend)
        queue.backend = backend  # type: ignore[assignment]
        try:
            yield server, queue, backend
        finally:
            backend.gate.set()


def _refused_delay(client: LmServeClient) -> float:
    """The RetryInfo delay (seconds, as the client parsed it) of a probe that cannot fit."""
    with pytest.raises(ResourceExhaustedError) as refused:
        client.score("test", [TEXT] * 90, timeout=30)  # 90,000 tokens: over the limit
    assert refused.value.retry_after is not None
    return refused.value.retry_after


def test_a_bigger_flood_asks_for_a_longer_retry_delay(
    paced: tuple[BackgroundServer, ScoringQueue, PacedBackend],
) -> None:
    server, queue, backend = paced
    with LmServeClient(server.address, timeout=60) as client, ThreadPoolExecutor(2) as pool:
        # Warm-up: ten paced passes measure the throughput (the texts are over the inline size).
        assert len(client.score("test", [TEXT] * 10)) == 10
        assert queue.throughput.rate is not None
        backend.gate.clear()
        floods: list[Future[list[Any]]] = []

        floods.append(pool.submit(client.score, "test", [TEXT] * 20))
        assert wait_until(lambda: queue.queued_tokens == 20 * TOKENS_PER_TEXT, timeout=20)
        small = _refused_delay(client)

        floods.append(pool.submit(client.score, "test", [TEXT] * 50))
        assert wait_until(lambda: queue.queued_tokens == 70 * TOKENS_PER_TEXT, timeout=20)
        large = _refused_delay(client)

        backend.gate.set()
        assert [len(f.result(timeout=60)) for f in floods] == [20, 50]  # the floods were served
    assert MIN_DELAY < small < large < MAX_DELAY
    # No pass ended while the gate held the worker: the same rate divides 20k and 70k tokens.
    assert large / small == pytest.approx(70 / 20, rel=0.01)
