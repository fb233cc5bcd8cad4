"""The best Generate throughput any server on this stack could reach on this machine, as a ratio
to the raw ONNX Runtime step: an upper bound for `bench_generate.py`'s `..._vs_raw` ratios.

    python bench/bench_generate_bound.py [--quick] [--streams 32] [--tokens 256] [--runs 3]

Per iteration of continuous batching at `--streams` streams, a server must at least
- run the model step: its compute, timed as ONNX Runtime with ONE intra-op thread (one core busy
  that long; the default two-thread session uses more CPU than that, not less);
- draw one token per row: `sample_next` over the step's real rows, plain sampling;
- send each stream its tokens: grpcio's own cost per message, in the server and in the client,
  timed on `canned_stream_server.py`, which streams prebuilt messages to the same asyncio client
  `bench_generate.py` uses (no model, no sampling, no protobuf building).
Spread perfectly over all cores with nothing lost to waiting, that CPU takes at least
`cpu / cores` seconds per iteration; the bound is the raw two-thread step's wall time over that.
Every term is a floor, so the real ratio can only be lower. Each run measures every term, in
turn, and the records give the medians of the per-run bounds. Messages per iteration are the
streams (one message per token) or streams / 4 (`stream_interval` 4).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from bench_generate import RawSteps
from common import QUICK_ENV, REPO_ROOT, emit, log, quick, record
from server_process import ServerProcess

from lmserve.server.allocator import keep_freed_memory
from lmserve.server.decoding.params import SamplingParams
from lmserve.server.decoding.sampling import SequenceSampler, request_generators, sample_next

INTERVALS = (1, 4)


class CannedStreamServer(ServerProcess):
    """`canned_stream_server.py` in a child process on a free port."""

    def __init__(self) -> None:
        super().__init__(REPO_ROOT)

    def command(self) -> list[str]:
        return [
            sys.executable,
            str(Path(__file__).with_name("canned_stream_server.py")),
            str(self.port),
        ]


async def _streams(target: str, streams: int, tokens: int) -> int:
    """`streams` concurrent Generate streams read to the end; the token messages received."""
    from lmserve.client import AsyncLmServeClient, GeneratedToken

    async def one(client: Any) -> int:
        count = 0
        async for event in client.generate("canned", max_new_tokens=tokens):
            count += isinstance(event, GeneratedToken)
        return count

    async with AsyncLmServeClient(target, timeout=600) as client:
        await one(client)  # warm up the channel
        counts = await asyncio.gather(*(one(client) for _ in range(streams)))
    return sum(counts)


def message_cpu(server: CannedStreamServer, streams: int, tokens: int) -> tuple[float, float]:
    """Seconds of server CPU and of client CPU per token message."""
    server_before, client_before = server.cpu_seconds(), time.process_time()
    messages = asyncio.run(_streams(server.target, streams, tokens))
    server_cpu = server.cpu_seconds() - server_before
    client_cpu = time.process_time() - client_before
    if messages != streams * tokens:
        raise RuntimeError(f"expected {streams * tokens} token messages, got {messages}")
    return server_cpu / messages, client_cpu / messages


def sampling_seconds(stepper: Any, streams: int, repeats: int) -> float:
    """Median seconds of one plain `sample_next` over the model's real rows at `streams`."""
    vocab = stepper.vocab
    rng = np.random.default_rng(1)
    log_probs, _ = stepper.prefill([[int(t)] for t in rng.integers(3, len(vocab), streams)])
    rows = [SequenceSampler(SamplingParams(), g, []) for g in request_generators(3, streams)]
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        sample_next(log_probs, rows, eos_id=vocab.eos_id, bos_id=vocab.bos_id)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=None, help="messages per stream")
    parser.add_argument("--runs", type=int, default=None)
    args = parser.parse_args()
    if args.quick:
        os.environ[QUICK_ENV] = "1"
    tokens = args.tokens or (64 if quick() else 256)
    runs = args.runs or (1 if quick() else 3)
    streams, cores = args.streams, os.cpu_count() or 1
    keep_freed_memory()

    from neural_model import default_folders

    from lmserve.server.backends.onnx import OnnxBackend, OnnxOptions
    from lmserve.server.backends.stepping import make_stepper
    from lmserve.server.registry.manifest import read_manifest

    folder, _, _ = default_folders()
    manifest = read_manifest(folder)
    served = RawSteps(make_stepper(OnnxBackend.load(folder, manifest, OnnxOptions())), "lstm", 3)
    one_core = RawSteps(
        make_stepper(OnnxBackend.load(folder, manifest, OnnxOptions(intra_op_threads=1))),
        "lstm_1thread",
        3,
    )
    terms: dict[str, list[float]] = {}
    bounds: dict[str, list[float]] = {}
    with CannedStreamServer() as server:
        for run in range(runs):
            log(f"run {run + 1}/{runs}")
            raw_step = served.measure(streams)
            compute = one_core.measure(streams)
            sampling = sampling_seconds(served.stepper, streams, 20)
            server_msg, client_msg = message_cpu(server, streams, tokens)
            for name, value in (
                ("raw_step", raw_step),
                ("model_compute", compute),
                ("sampling", sampling),
                ("server_message_cpu", server_msg),
                ("client_message_cpu", client_msg),
            ):
                terms.setdefault(name, []).append(value)
            for interval in INTERVALS:
                messages = streams / interval
                server_cpu = compute + sampling + messages * server_msg
                suffix = "" if interval == 1 else f"_interval{interval}"
                bounds.setdefault(f"with_client{suffix}", []).append(
                    raw_step * cores / (server_cpu + messages * client_msg)
                )
                bounds.setdefault(f"server_only{suffix}", []).append(raw_step * cores / server_cpu)
    for name, values in terms.items():
        micro = name.endswith("message_cpu")
        emit(
            record(
                f"generate_bound_{name}_{'us' if micro else 'ms'}",
                "us" if micro else "ms",
                [v * (1e6 if micro else 1e3) for v in values],
                streams=streams,
            )
        )
    for name, values in bounds.items():
        emit(
            record(
                f"generate_bound_{streams}streams_{name}_vs_raw",
                "ratio",
                values,
                cores=cores,
                note="upper bound of server tokens/s / raw step tokens/s at this batch"
                + ("; the client's CPU not counted" if name.startswith("server_only") else ""),
            )
        )


if __name__ == "__main__":
    main()
