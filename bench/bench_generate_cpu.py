"""Server CPU per generated token at `--streams` LSTM streams, next to the raw ONNX step's CPU
per token at the same batch, measured in the same run (the issue's goal: ratio <= 1.5). The
server's CPU is the front's and its engine workers' together; the front's share is recorded too.
`LMSERVE_ENGINE_WORKERS=false` in the environment measures the one-process server instead.

    python bench/bench_generate_cpu.py [--quick] [--streams 32] [--tokens 128] [--runs 3]

Per run: the raw batched `Stepper.step` of kjv-lstm at batch `--streams` (no sampling, no
gRPC) is timed in this process by CPU time (`time.process_time`, all of ONNX Runtime's
threads), then `--streams` concurrent Generate streams (plain sampling, ignore_eos, one message
per token) run through a real server (own process) and its CPU time (psutil: user + system)
over the run is divided by the tokens generated. CPU time, unlike wall time, hardly moves with
what else runs on the machine. Records: server CPU ms per token, raw CPU ms per token, and the
per-run ratio server / raw (median of runs).
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
    QUICK_ENV,
    default_model,
    emit,
    linked_repository,
    log,
    quick,
    record,
)
from server_process import ServerProcess


def _raw_cpu_per_token(stepper: Any, batch: int, steps: int) -> float:
    """CPU seconds per row of one raw step at `batch` (after a warm-up), median of 3."""
    import numpy as np

    rng = np.random.default_rng(0)
    vocab = len(stepper.vocab)
    _, state = stepper.prefill([[int(t)] for t in rng.integers(3, vocab, batch)])
    tokens = rng.integers(3, vocab, batch)
    stepper.step(tokens, state)
    out = []
    for _ in range(3):
        start = time.process_time()
        for _ in range(steps):
            stepper.step(tokens, state)
        out.append((time.process_time() - start) / (steps * batch))
    return statistics.median(out)


async def _generate(target: str, model: str, streams: int, tokens: int) -> int:
    """`streams` concurrent streams of `tokens` tokens; returns the tokens received."""
    from lmserve.client import AsyncLmServeClient, GeneratedToken

    async def one(client: Any, seed: int) -> int:
        count = 0
        async for event in client.generate(
            model, "", max_new_tokens=tokens, ignore_eos=True, seed=seed
        ):
            count += isinstance(event, GeneratedToken)
        return count

    async with AsyncLmServeClient(target, timeout=600) as client:
        await one(client, 0)  # warm up
        counts = await asyncio.gather(*(one(client, i) for i in range(streams)))
    return sum(counts)


def _front_cpu(server: ServerProcess) -> float:
    times = server.processes()[0].cpu_times()
    return float(times.user + times.system)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="one short run")
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=None)
    parser.add_argument("--runs", type=int, default=None)
    args = parser.parse_args()
    if args.quick:
        os.environ[QUICK_ENV] = "1"
    tokens = args.tokens or (64 if quick() else 128)
    runs = args.runs or (1 if quick() else 3)

    from lmserve.server.backends.onnx import OnnxBackend, OnnxOptions
    from lmserve.server.families.catalog import make_stepper
    from lmserve.server.manifest import read_manifest

    folder = default_model(DEFAULT_LSTM)
    manifest = read_manifest(folder)
    stepper = make_stepper(OnnxBackend.load(folder, manifest, OnnxOptions()))
    server_ms: list[float] = []
    front_ms: list[float] = []
    raw_ms: list[float] = []
    ratios: list[float] = []
    with ServerProcess(linked_repository("generate-repo", folder)) as server:
        for run in range(runs):
            raw = _raw_cpu_per_token(stepper, args.streams, 20)
            before, front_before = server.cpu_seconds(), _front_cpu(server)
            generated = asyncio.run(_generate(server.target, manifest.name, args.streams, tokens))
            used = server.cpu_seconds() - before
            front_ms.append(1000 * (_front_cpu(server) - front_before) / (generated + tokens))
            # The warm-up stream's tokens count too: it ran on the server's CPU.
            per_token = used / (generated + tokens)
            raw = (raw + _raw_cpu_per_token(stepper, args.streams, 20)) / 2
            log(f"run {run}: server {1000 * per_token:.3f} ms/token, raw {1000 * raw:.3f}")
            server_ms.append(1000 * per_token)
            raw_ms.append(1000 * raw)
            ratios.append(per_token / raw)
    n = args.streams
    emit(record(f"generate_lstm_server_{n}streams_cpu_ms_per_token", "ms", server_ms))
    emit(record(f"generate_lstm_raw_step_batch{n}_cpu_ms_per_token", "ms", raw_ms))
    emit(
        record(
            f"generate_lstm_server_{n}streams_front_cpu_ms_per_token",
            "ms",
            front_ms,
            note="the front process alone (gRPC, frames, messages); the rest is the worker's",
        )
    )
    emit(
        record(
            f"generate_lstm_server_{n}streams_cpu_per_token_vs_raw",
            "ratio",
            ratios,
            tokens_per_stream=tokens,
            server_pythonpath=os.environ.get("PYTHONPATH", ""),
            note="server CPU s per generated token / raw step CPU s per row at the same batch, "
            "per run (raw timed before and after the run)",
        )
    )


if __name__ == "__main__":
    main()
