"""Small-request latency beside 64 Generate streams: lmserve against the transport's floor.

    python bench/bench_soak_floor.py [--seconds 60] [--streams 64] [--runs 3]

The soak's small-request target (n-gram Score p99 < 20 ms) was set for one scoring client
beside the engine's work. With 64 Generate streams read as fast as they come, from a client on
the same two cores, the machine is saturated by the streams alone, and a part of each small
request's time goes to the streams' transport, whatever the engine does. Each run measures:
1. `lmserve serve` on the default models under a stream load (`soak._generate_worker` in a
   client process of its own: 64 kjv-lstm streams by default, a finished one replaced at once,
   `--stream-models` for the soak's mix), with a probe sending a 4-line Score on kjv-5gram
   every 20 ms through the generated stub, parsing the answer as any client does (the way an
   outside client measured 5.2-5.9x where this script, probing raw bytes every 10 ms beside the
   mixed streams, reported 2.7x; `--raw-probe` keeps that probe); the streams' token rate R;
2. `canned_stream_server.py`, which streams prebuilt messages and answers Score with prebuilt
   bytes (no model, no engine), under the same 64 streams paced to the same total rate R
   (`--period` = streams / R), with the same probe.
(2) is the least any server on grpcio could give on this machine at that stream traffic: the
floor. Records: p50/p99 of both, and p99 over the floor's p99, medians over `--runs`.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import subprocess
import sys
import time
from typing import Any

import grpc
from canned_stream_server import SCORE_METHOD, SERVICE
from common import BENCH_DIR, DEFAULT_MODELS, KJV_TEST, emit, log, percentile, record
from server_process import ServerProcess, free_port
from soak import LSTM, NGRAM, _generate_worker

from lmserve.v1 import lm_service_pb2 as pb

WARMUP_S = 10.0
PROBE_PERIOD_S = 0.02


def _probe(target: str, seconds: float, generic: bool = True) -> list[float]:
    """Latencies of a 4-line Score every PROBE_PERIOD_S for `seconds`: through the generated
    stub, which builds and parses messages as any client does (`generic`), or as raw bytes."""
    lines = KJV_TEST.read_text(encoding="utf-8").splitlines()[:400]
    messages = [pb.ScoreRequest(model=NGRAM, texts=lines[i : i + 4]) for i in range(0, 400, 4)]
    with grpc.insecure_channel(target) as channel:
        if generic:
            call = channel.unary_unary(
                f"/{SERVICE}/{SCORE_METHOD}",
                pb.ScoreRequest.SerializeToString,
                pb.ScoreResponse.FromString,
            )
            requests: list[Any] = messages
        else:
            call = channel.unary_unary(f"/{SERVICE}/{SCORE_METHOD}", None, None)
            requests = [m.SerializeToString() for m in messages]
        call(requests[0], timeout=30)
        times: list[float] = []
        stop_at = time.monotonic() + seconds
        due = time.perf_counter()
        while time.monotonic() < stop_at:
            started = time.perf_counter()
            call(requests[len(times) % len(requests)], timeout=30)
            times.append(time.perf_counter() - started)
            due += PROBE_PERIOD_S
            time.sleep(max(0.0, due - time.perf_counter()))
    return times


def _under_streams(
    target: str, streams: int, seconds: float, models: tuple[str, ...], generic: bool
) -> tuple[list[float], float]:
    """Probe latencies while `streams` Generate streams run (read by a client process of their
    own); and their tokens per second."""
    results: Any = mp.get_context("spawn").Queue()
    stop_at = time.monotonic() + WARMUP_S + seconds
    generator = mp.get_context("spawn").Process(
        target=_generate_worker, args=(target, streams, stop_at, results, 1, models)
    )
    generator.start()
    time.sleep(WARMUP_S)
    started = time.monotonic()
    times = _probe(target, seconds, generic)
    elapsed = time.monotonic() - started
    generated = results.get(timeout=120)
    generator.join()
    if generated["failures"]:
        raise SystemExit(f"Generate failures during the run: {generated['failures']}")
    return times, generated["tokens"] / (WARMUP_S + elapsed)


def _canned(
    streams: int, seconds: float, rate: float, models: tuple[str, ...], generic: bool
) -> list[float]:
    port = free_port()
    period = streams / rate if rate > 0 else 0.0
    server = subprocess.Popen(
        [
            sys.executable,
            str(BENCH_DIR / "canned_stream_server.py"),
            str(port),
            "--period",
            f"{period:.6f}",
        ]
    )
    try:
        target = f"127.0.0.1:{port}"
        grpc.channel_ready_future(grpc.insecure_channel(target)).result(timeout=30)
        times, _ = _under_streams(target, streams, seconds, models, generic)
        return times
    finally:
        server.terminate()
        server.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--stream-models",
        default=LSTM,
        help="comma-separated models the streams generate with, in turn (default kjv-lstm; "
        "the soak's mix: kjv-5gram,kjv-lstm,kjv-lstm-5gram)",
    )
    parser.add_argument(
        "--raw-probe",
        action="store_true",
        help="the probe sends and reads bytes (no protobuf work in the client): the old figure",
    )
    args = parser.parse_args()
    models = tuple(m for m in args.stream_models.split(",") if m)
    generic = not args.raw_probe
    real_p99: list[float] = []
    floor_p99: list[float] = []
    ratios: list[float] = []
    extra: dict[str, list[float]] = {"real_p50": [], "floor_p50": [], "tokens_per_s": []}
    for run in range(args.runs):
        with ServerProcess(DEFAULT_MODELS) as server:
            real, rate = _under_streams(server.target, args.streams, args.seconds, models, generic)
        floor = _canned(args.streams, args.seconds, rate, models, generic)
        real_p99.append(1000 * percentile(real, 99))
        floor_p99.append(1000 * percentile(floor, 99))
        ratios.append(real_p99[-1] / floor_p99[-1])
        extra["real_p50"].append(1000 * percentile(real, 50))
        extra["floor_p50"].append(1000 * percentile(floor, 50))
        extra["tokens_per_s"].append(rate)
        log(
            f"run {run + 1}: lmserve p99 {real_p99[-1]:.1f} ms, floor p99 {floor_p99[-1]:.1f} ms"
            f" at {rate:.0f} tokens/s"
        )
    medians = {k: round(statistics.median(v), 2) for k, v in extra.items()}
    emit(
        record(
            "soak_ngram_score_p99",
            "ms",
            real_p99,
            p50=medians["real_p50"],
            tokens_per_s=medians["tokens_per_s"],
            stream_models=list(models),
            probe="generated stub" if generic else "raw bytes",
        )
    )
    emit(record("soak_floor_score_p99", "ms", floor_p99, p50=medians["floor_p50"]))
    emit(record("soak_ngram_score_p99_vs_floor", "x", ratios))


if __name__ == "__main__":
    main()
