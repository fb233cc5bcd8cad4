"""The micro-batcher merges concurrent score calls, splits results back, isolates failures."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from neural_folders import VOCAB, tiny_model, write_onnx_folder
from prometheus_client import CollectorRegistry

from lmserve.server.backends.base import BatchScores, EncodedBatch
from lmserve.server.backends.onnx import OnnxBackend, OnnxOptions
from lmserve.server.engine.batcher import BatchLimits, MicroBatcher, merge_batches, split_scores
from lmserve.server.errors import Unimplemented
from lmserve.server.manifest import read_manifest
from lmserve.server.metrics import Metrics


def _batch(texts: list[list[int]]) -> EncodedBatch:
    ids = np.array([i for t in texts for i in t], dtype=np.int32)
    offsets = np.cumsum([0, *map(len, texts)]).astype(np.int64)
    return EncodedBatch(ids=ids, offsets=offsets, oov=ids == 0)


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> OnnxBackend:
    folder = tmp_path_factory.mktemp("batcher") / "m"
    write_onnx_folder(tiny_model("gru"), VOCAB, folder, name="m")
    return OnnxBackend.load(folder, read_manifest(folder), OnnxOptions(intra_op_threads=1))


def test_merge_and_split_round_trip() -> None:
    parts = [_batch([[3, 4], []]), _batch([[5]]), _batch([[6, 7, 8]])]
    merged = merge_batches(parts)
    assert merged.ids.tolist() == [3, 4, 5, 6, 7, 8]
    assert merged.offsets.tolist() == [0, 2, 2, 3, 6]
    scores = BatchScores(
        totals=np.array([1.0, 2.0, 3.0, 4.0]),
        token_log_probs=np.arange(10, dtype=np.float64),
        token_offsets=np.array([0, 3, 4, 6, 10]),
    )
    a, b, c = split_scores(scores, [2, 1, 1], [True, False, True])
    assert a.totals.tolist() == [1.0, 2.0] and a.token_offsets is not None
    assert a.token_offsets.tolist() == [0, 3, 4] and b.token_log_probs is None
    assert c.token_log_probs is not None and c.token_log_probs.tolist() == [6, 7, 8, 9]


def test_concurrent_calls_share_passes_and_keep_results_apart(backend: OnnxBackend) -> None:
    texts = [[3 + i % 10] * (1 + i) for i in range(12)]
    expected = [backend.score(_batch([t]), per_token=True) for t in texts]
    metrics = Metrics(CollectorRegistry())
    batcher = MicroBatcher(backend, BatchLimits(max_texts=64, max_tokens=10_000, max_wait_ms=50))

    async def main() -> list[BatchScores | BaseException]:
        calls = [
            batcher.run(
                lambda t=t: batcher.backend.score(_batch([t]), per_token=True), metrics, "m"
            )
            for t in texts
        ]
        # One request that fails (bos off is refused by recurrent models) in the same window.
        calls.append(
            batcher.run(lambda: batcher.backend.score(_batch([[3]]), bos=False), metrics, "m")
        )
        try:
            return await asyncio.gather(*calls, return_exceptions=True)
        finally:
            await batcher.aclose()

    results = asyncio.run(main())
    assert isinstance(results[-1], Unimplemented)
    for got, want in zip(results[:-1], expected, strict=True):
        assert isinstance(got, BatchScores) and got.token_log_probs is not None
        np.testing.assert_allclose(got.totals, want.totals, atol=1e-5)
        assert want.token_log_probs is not None
        np.testing.assert_allclose(got.token_log_probs, want.token_log_probs, atol=1e-5)
    registry = metrics.registry
    passes = registry.get_sample_value("lmserve_batch_size_count", {"model": "m"})
    merged_texts = registry.get_sample_value("lmserve_batch_size_sum", {"model": "m"})
    assert passes is not None and passes < len(texts) and merged_texts == len(texts) + 1


def test_limits_split_batches(backend: OnnxBackend) -> None:
    metrics = Metrics(CollectorRegistry())
    batcher = MicroBatcher(backend, BatchLimits(max_texts=2, max_tokens=10_000, max_wait_ms=50))

    async def main() -> None:
        calls = [
            batcher.run(lambda: batcher.backend.score(_batch([[3, 4]])), metrics, "m")
            for _ in range(6)
        ]
        await asyncio.gather(*calls)
        await batcher.aclose()

    asyncio.run(main())
    count = metrics.registry.get_sample_value("lmserve_batch_size_count", {"model": "m"})
    assert count is not None and count >= 3  # never more than 2 texts a pass


def test_outside_a_loop_the_backend_scores_directly(backend: OnnxBackend) -> None:
    batcher = MicroBatcher(backend, BatchLimits())
    got = batcher.backend.score(_batch([[3, 4, 5]]))
    assert got.totals == pytest.approx(backend.score(_batch([[3, 4, 5]])).totals)
    assert batcher.backend.vocab is backend.vocab
