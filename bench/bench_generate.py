"""Generate through a real server (own process) at 1, 8, 32 and 64 concurrent streams, next to
the raw batched step of the same model at the same batch sizes, measured in the same run.

    python bench/bench_generate.py [--quick] [--tokens 64] [--runs 3]

Models: the shipped default models (`make models`): kjv-lstm (LSTM 512/512 over 12,352 words,
ONNX Runtime) and kjv-5gram (whose step is a full next-token distribution per row). Per
concurrency level it reports the aggregate generated tokens/s, per-token latency p50/p99 (the
gaps between a stream's messages as the client receives them, each spread over the tokens the
message carries) and time to first token; the raw figure is `batch / step seconds`
(`Stepper.step`, no sampling, no gRPC). The streams come from one asyncio client. Sampling is
plain (temperature 1), `ignore_eos` so every stream makes exactly `--tokens` tokens. Each level
runs with a message per token (stream_interval 1) and, from 8 streams up, with 4 steps a
message (`..._interval4_...`). `..._vs_raw` records give the issue's ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from typing import Any

from common import (
    DEFAULT_LSTM,
    DEFAULT_NGRAM,
    QUICK_ENV,
    default_model,
    emit,
    linked_repository,
    log,
    percentile,
    quick,
    record,
    repeat,
)
from server_process import ServerProcess

CONCURRENCY = (1, 8, 32, 64)
# Steps per stream message: 1 (every token, the default) and a grouped setting for throughput.
INTERVALS = (1, 4)


class RawSteps:
    """The raw batched `Stepper.step` of a model (no sampling, no gRPC), timed at a batch size
    whenever asked, so that each server figure is compared with raw steps measured right next
    to it: this VM's speed drifts by tens of percent within a minute."""

    def __init__(self, stepper: Any, label: str, runs: int) -> None:
        import numpy as np

        self.stepper = stepper
        self.label = label
        self.runs = runs
        self.rng = np.random.default_rng(0)
        self.seconds: dict[int, list[float]] = {}  # per-step seconds, every measurement

    def measure(self, batch: int) -> float:
        """Median seconds of one step at `batch` over `runs` timed runs (after a warm-up)."""
        vocab = len(self.stepper.vocab)
        _, state = self.stepper.prefill([[int(t)] for t in self.rng.integers(3, vocab, batch)])
        tokens = self.rng.integers(3, vocab, batch)
        steps = 20 if batch <= 8 else 10

        def many() -> None:
            for _ in range(steps):
                self.stepper.step(tokens, state)

        per_step = [s / steps for s in repeat(many, self.runs)]
        self.seconds.setdefault(batch, []).extend(per_step)
        return statistics.median(per_step)

    def emit(self) -> None:
        for batch, seconds in sorted(self.seconds.items()):
            emit(
                record(
                    f"generate_{self.label}_raw_step_batch{batch}_tokens_per_s",
                    "tokens/s",
                    [batch / s for s in seconds],
                    step_ms=1000 * statistics.median(seconds),
                    measurements=len(seconds),
                )
            )


async def _stream(
    client: Any, model: str, tokens: int, seed: int, interval: int
) -> tuple[float, list[float]]:
    """One Generate stream read message by message, as the client library reads it: seconds to
    the first token, and each later token's gap from the token before it. A message's gap from
    the previous message is spread evenly over the tokens it carries, so steps that travel
    together (`stream_interval`, or a writer that fell behind) are not counted as zero gaps."""
    from lmserve.client import GeneratedToken
    from lmserve.client import _requests as req

    request = req.generate_request(
        model, "", max_new_tokens=tokens, ignore_eos=True, seed=seed, stream_interval=interval
    )
    start = time.perf_counter()
    first: float | None = None
    last = start
    gaps: list[float] = []
    async for message in client.stub.Generate(request, timeout=600):
        now = time.perf_counter()
        count = sum(isinstance(e, GeneratedToken) for e in req.generation_events(message))
        if not count:
            continue
        if first is None:
            first = now - start
        else:
            gaps.extend([(now - last) / count] * count)
        last = now
    assert first is not None, "the stream carried no token"
    return first, gaps


async def _served_async(
    target: str, model: str, streams: int, tokens: int, runs: int, interval: int
) -> tuple[list[float], list[float], list[float]]:
    from lmserve.client import AsyncLmServeClient

    rates: list[float] = []
    ttft: list[float] = []
    gaps: list[float] = []
    async with AsyncLmServeClient(target, timeout=600) as client:
        await _stream(client, model, 4, 0, 1)  # warm up
        for _ in range(runs):
            start = time.perf_counter()
            results = await asyncio.gather(
                *(_stream(client, model, tokens, i, interval) for i in range(streams))
            )
            rates.append(streams * tokens / (time.perf_counter() - start))
            ttft.extend(first for first, _ in results)
            gaps.extend(gap for _, stream_gaps in results for gap in stream_gaps)
    return rates, ttft, gaps


def _served(
    target: str, model: str, label: str, streams: int, tokens: int, runs: int, interval: int
) -> dict[str, Any]:
    """`streams` concurrent Generate streams from one asyncio client (one process, one channel:
    the lightest load generator Python has), all started together."""
    rates, ttft, gaps = asyncio.run(_served_async(target, model, streams, tokens, runs, interval))
    suffix = "" if interval == 1 else f"_interval{interval}"
    extra: dict[str, Any] = {
        "streams": streams,
        "tokens_per_stream": tokens,
        "stream_interval": interval,
        "ttft_p50_ms": 1000 * percentile(ttft, 50),
        "ttft_p99_ms": 1000 * percentile(ttft, 99),
    }
    extra["inter_token_p50_ms"] = 1000 * percentile(gaps, 50)
    extra["inter_token_p99_ms"] = 1000 * percentile(gaps, 99)
    rec = record(
        f"generate_{label}_server_{streams}streams{suffix}_tokens_per_s", "tokens/s", rates, **extra
    )
    emit(rec)
    return rec


def _ratios(label: str, rec: dict[str, Any], raw_step: float) -> None:
    """The throughput goal as a ratio against the raw step timed just before and after this
    level: server tokens/s over raw tokens/s at the same batch."""
    n, interval = rec["streams"], rec["stream_interval"]
    suffix = "" if interval == 1 else f"_interval{interval}"
    emit(
        record(
            f"generate_{label}_server_{n}streams{suffix}_vs_raw",
            "ratio",
            [r * raw_step / n for r in rec["runs"]],
            raw_step_ms=1000 * raw_step,
            note=f"server tokens/s / raw step tokens/s at batch {n}, timed around this level",
        )
    )


def _itl_ratios(
    target: str, model: str, label: str, steps: RawSteps, tokens: int, runs: int
) -> None:
    """The latency goal, run by run: one stream's inter-token p50 over the raw batch-1 step
    timed just before and just after that run (one ratio per run; the VM drifts between runs)."""
    ratios: list[float] = []
    raw: list[float] = []
    for _ in range(runs):
        before = steps.measure(1)
        _, _, gaps = asyncio.run(_served_async(target, model, 1, tokens, 1, 1))
        raw_step = (before + steps.measure(1)) / 2
        ratios.append(percentile(gaps, 50) / raw_step)
        raw.append(raw_step)
    emit(
        record(
            f"generate_{label}_server_1stream_itl_p50_vs_raw_step",
            "ratio",
            ratios,
            raw_step_ms=1000 * statistics.median(raw),
            note="per run: inter-token p50 through the server / raw batch-1 step timed around it",
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="few, short runs (< 2 minutes)")
    parser.add_argument("--tokens", type=int, default=None, help="tokens per stream")
    parser.add_argument("--runs", type=int, default=None)
    args = parser.parse_args()
    if args.quick:
        os.environ[QUICK_ENV] = "1"
    tokens = args.tokens or (16 if quick() else 64)
    runs = args.runs or (1 if quick() else 3)

    from lmserve.server.backends.ngram.folder import load_model_folder_binary
    from lmserve.server.backends.onnx import OnnxBackend, OnnxOptions
    from lmserve.server.families.catalog import make_stepper
    from lmserve.server.manifest import read_manifest

    onnx_dir, ngram_dir = default_model(DEFAULT_LSTM), default_model(DEFAULT_NGRAM)
    onnx_name = read_manifest(onnx_dir).name
    ngram_name = read_manifest(ngram_dir).name

    raw = {
        "lstm": RawSteps(
            make_stepper(OnnxBackend.load(onnx_dir, read_manifest(onnx_dir), OnnxOptions())),
            "lstm",
            runs + 1,
        ),
        "ngram": RawSteps(
            make_stepper(load_model_folder_binary(ngram_dir, read_manifest(ngram_dir))),
            "ngram",
            runs + 1,
        ),
    }

    with ServerProcess(linked_repository("generate-repo", onnx_dir, ngram_dir)) as server:
        for model, label in ((onnx_name, "lstm"), (ngram_name, "ngram")):
            log(f"server: {model}")
            steps = raw[label]
            for interval in INTERVALS:
                for streams in CONCURRENCY:
                    if interval > 1 and streams == 1:
                        continue
                    before = steps.measure(streams)
                    rec = _served(server.target, model, label, streams, tokens, runs, interval)
                    after = steps.measure(streams)
                    _ratios(label, rec, (before + after) / 2)
            _itl_ratios(server.target, model, label, steps, max(tokens, 128), runs)
            steps.emit()


if __name__ == "__main__":
    main()
