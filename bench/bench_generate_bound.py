"""The best Generate figures any server on this stack could reach on this machine, in the terms
of `bench_generate.py`'s goals: an upper bound for its `..._vs_raw` throughput ratios and a lower
bound for one stream's inter-token time over the raw batch-1 step.

    python bench/bench_generate_bound.py [--quick] [--streams 32] [--tokens 256] [--runs 3]
                                         [--period 0.001]

Throughput.
Per iteration of continuous batching at `--streams` streams, a server must at least
- run the model step: its compute, timed as ONNX Runtime with ONE intra-op thread (one core busy
  that long; the default two-thread session uses more CPU than that, not less);
- draw one token per row: `sample_next` over the step's real rows, plain sampling;
- send each stream its tokens: grpcio's own cost per message, in the server and in the client,
  timed on `canned_stream_server.py`, which streams prebuilt messages (no model, no sampling,
  no protobuf building) to the asyncio client `bench_generate.py` uses and, as the leanest
  client Python has, to a bare grpc.aio call that keeps the messages as bytes.
Spread perfectly over all cores with nothing lost to waiting, that CPU takes at least
`cpu / cores` seconds per iteration; the bound is the raw two-thread step's wall time over that.
`..._bare_client...` records put the bare call's CPU in place of the client's, and
`..._server_only...` ones leave the client out, as if it ran on another machine.
Every term is a floor, so the real ratio can only be lower. Each run measures every term, in
turn, and the records give the medians of the per-run bounds. Messages per iteration are the
streams (one message per token) or streams / 4 (`stream_interval` 4).

Latency. A stream's traffic itself slows the model step beside it on a small machine: the raw
batch-1 step is timed alone and while a canned stream paced at `--period` (its server and a
`stream_reader.py` client in two other processes) runs beside it; that step plus one draw, over
the step alone, is the least one stream's inter-token time can be, as a ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from bench_generate import RawSteps
from canned_stream_server import METHOD, SERVICE
from common import DEFAULT_LSTM, QUICK_ENV, REPO_ROOT, default_model, emit, log, quick, record
from server_process import ServerProcess

from lmserve.server.allocator import keep_freed_memory
from lmserve.server.decoding.params import SamplingParams
from lmserve.server.decoding.sampling import SequenceSampler, request_generators, sample_next

INTERVALS = (1, 4)


class CannedStreamServer(ServerProcess):
    """`canned_stream_server.py` in a child process on a free port (`period`: seconds between
    a stream's messages, 0 for as fast as they go)."""

    def __init__(self, period: float = 0.0) -> None:
        super().__init__(REPO_ROOT)
        self.period = period

    def command(self) -> list[str]:
        script = Path(__file__).with_name("canned_stream_server.py")
        return [sys.executable, str(script), str(self.port), "--period", str(self.period)]


@contextmanager
def stream_beside(server: CannedStreamServer) -> Iterator[None]:
    """While inside, a `stream_reader.py` process reads `server`'s stream: one paced stream's
    traffic, server and client, running beside this process."""
    script = Path(__file__).with_name("stream_reader.py")
    reader = subprocess.Popen(
        [sys.executable, str(script), server.target],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(1.5)  # started, connected, streaming
        if reader.poll() is not None:
            raise RuntimeError(f"stream_reader.py exited with {reader.returncode}")
        yield
    finally:
        reader.terminate()
        reader.wait()


async def _client_streams(target: str, streams: int, tokens: int) -> int:
    """`streams` concurrent Generate streams read to the end by `AsyncLmServeClient`; the
    token messages received."""
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


async def _bare_streams(target: str, streams: int, tokens: int) -> int:
    """The same streams on a bare grpc.aio call whose messages stay bytes (no parsing): the
    least a Python client can spend. Returns the token messages received."""
    from grpc import aio

    from lmserve.v1 import lm_service_pb2 as pb

    request = pb.GenerateRequest(
        model="canned", stopping=pb.StoppingCriteria(max_new_tokens=tokens)
    ).SerializeToString()
    async with aio.insecure_channel(target) as channel:
        generate = channel.unary_stream(f"/{SERVICE}/{METHOD}", None, None)  # bytes

        async def one() -> int:
            return sum([1 async for _ in generate(request)]) - 1  # less the `finished` one

        await one()
        counts = await asyncio.gather(*(one() for _ in range(streams)))
    return sum(counts)


def message_cpu(
    server: CannedStreamServer, streams: int, tokens: int, bare: bool = False
) -> tuple[float, float]:
    """Seconds of server CPU and of client CPU per token message."""
    read = _bare_streams if bare else _client_streams
    server_before, client_before = server.cpu_seconds(), time.process_time()
    messages = asyncio.run(read(server.target, streams, tokens))
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


def throughput_bound(
    served: RawSteps, one_core: RawSteps, streams: int, tokens: int, runs: int
) -> None:
    """The `streams`-stream records (see the module's docstring)."""
    cores = os.cpu_count() or 1
    terms: dict[str, list[float]] = {}
    bounds: dict[str, list[float]] = {}
    with CannedStreamServer() as server:
        for run in range(runs):
            log(f"throughput, run {run + 1}/{runs}")
            # Each step is timed before and after the rest (the VM drifts within a minute).
            raw_before, compute_before = served.measure(streams), one_core.measure(streams)
            sampling = sampling_seconds(served.stepper, streams, 20)
            server_msg, client_msg = message_cpu(server, streams, tokens)
            _, bare_msg = message_cpu(server, streams, tokens, bare=True)
            compute = (compute_before + one_core.measure(streams)) / 2
            raw_step = (raw_before + served.measure(streams)) / 2
            for name, value in (
                ("raw_step", raw_step),
                ("model_compute", compute),
                ("sampling", sampling),
                ("server_message_cpu", server_msg),
                ("client_message_cpu", client_msg),
                ("bare_client_message_cpu", bare_msg),
            ):
                terms.setdefault(name, []).append(value)
            for interval in INTERVALS:
                messages = streams / interval
                server_cpu = compute + sampling + messages * server_msg
                suffix = "" if interval == 1 else f"_interval{interval}"
                for client, per_message in (("with_client", client_msg), ("bare_client", bare_msg)):
                    bounds.setdefault(f"{client}{suffix}", []).append(
                        raw_step * cores / (server_cpu + messages * per_message)
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


def latency_bound(served: RawSteps, runs: int, period: float) -> None:
    """One stream's inter-token floor: the raw batch-1 step timed while a canned stream at
    `period` runs beside it (its server and client in two other processes), plus one plain
    draw at batch 1, over the same raw step timed with nothing beside it (before and after)."""
    idle: list[float] = []
    beside: list[float] = []
    sampling: list[float] = []
    floors: list[float] = []
    with CannedStreamServer(period) as server:
        for run in range(runs):
            log(f"latency, run {run + 1}/{runs}")
            before = served.measure(1)
            with stream_beside(server):
                busy = served.measure(1)
            after = served.measure(1)
            draw = sampling_seconds(served.stepper, 1, 200)
            idle.append((before + after) / 2)
            beside.append(busy)
            sampling.append(draw)
            floors.append((busy + draw) / idle[-1])
    ms = [1e3 * v for v in idle], [1e3 * v for v in beside], [1e3 * v for v in sampling]
    emit(record("generate_bound_raw_step_batch1_idle_ms", "ms", ms[0]))
    emit(record("generate_bound_raw_step_batch1_beside_stream_ms", "ms", ms[1], period_s=period))
    emit(record("generate_bound_sampling_batch1_ms", "ms", ms[2]))
    emit(
        record(
            "generate_bound_1stream_itl_vs_raw_step",
            "ratio",
            floors,
            period_s=period,
            note="lower bound of one stream's inter-token time / the raw batch-1 step: the "
            "step slowed by one paced stream's traffic beside it, plus a draw",
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=None, help="messages per stream")
    parser.add_argument("--runs", type=int, default=None)
    parser.add_argument(
        "--period", type=float, default=0.001, help="seconds between the paced stream's messages"
    )
    args = parser.parse_args()
    if args.quick:
        os.environ[QUICK_ENV] = "1"
    tokens = args.tokens or (64 if quick() else 256)
    runs = args.runs or (1 if quick() else 3)
    keep_freed_memory()

    from lmserve.server.backends.onnx import OnnxBackend, OnnxOptions
    from lmserve.server.families.catalog import make_stepper
    from lmserve.server.manifest import read_manifest

    folder = default_model(DEFAULT_LSTM)
    manifest = read_manifest(folder)
    served = RawSteps(make_stepper(OnnxBackend.load(folder, manifest, OnnxOptions())), "lstm", 3)
    one_core = RawSteps(
        make_stepper(OnnxBackend.load(folder, manifest, OnnxOptions(intra_op_threads=1))),
        "lstm_1thread",
        3,
    )
    throughput_bound(served, one_core, args.streams, tokens, runs)
    latency_bound(served, runs, args.period)


if __name__ == "__main__":
    main()
