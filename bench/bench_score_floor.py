"""A small unary Score against the transport's floor: the served kjv-5gram beside a canned grpcio
server that answers Score at once with an empty message, unloaded, one caller, interleaved.

    python bench/bench_score_floor.py [--calls 2000] [--runs 5] [--text "and god said"]

Both are called the same way (one plain grpcio channel, the request's bytes built once, the
answer's bytes not parsed), so the ratio is what lmserve adds to the least any grpcio server
costs a call: tokenizing, the limits, scoring and building the answer (and, for a model scored
in its engine worker, the hop there and back). A third server in the same runs, the canned one
with `--serving` (the request parsed, lmserve's serving interceptor), splits that between the
transport layer and the Score path. Prints JSON records: each server's p50 and p99 in ms and its
CPU per call, and the p50 ratio of each run (lmserve / canned, and canned_serving / canned),
medians over the runs.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import grpc
import psutil
from canned_stream_server import SCORE_METHOD, SERVICE
from common import DEFAULT_NGRAM, default_model, emit, linked_repository, log, percentile, record
from server_process import ServerProcess, free_port

from lmserve.v1 import lm_service_pb2 as pb

BENCH_DIR = Path(__file__).resolve().parent
MODEL = "kjv-5gram"


def _latencies(target: str, request: bytes, calls: int) -> list[float]:
    """`calls` unary Score calls one after another, each one's seconds."""
    with grpc.insecure_channel(target) as channel:
        grpc.channel_ready_future(channel).result(timeout=30)
        call = channel.unary_unary(f"/{SERVICE}/{SCORE_METHOD}", None, None)
        for _ in range(50):  # warm-up: connection, first tokenization, page faults
            call(request)
        out = []
        for _ in range(calls):
            started = time.perf_counter()
            call(request)
            out.append(time.perf_counter() - started)
        return out


def _cpu(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            process = psutil.Process(pid)
            times = process.cpu_times()
            total += times.user + times.system
            for child in process.children(recursive=True):
                child_times = child.cpu_times()
                total += child_times.user + child_times.system
        except psutil.NoSuchProcess:
            continue
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--text", default="and god said let there be light")
    args = parser.parse_args()
    request = pb.ScoreRequest(model=MODEL, texts=[args.text]).SerializeToString()
    port, serving_port = free_port(), free_port()
    script = str(BENCH_DIR / "canned_stream_server.py")
    canned = subprocess.Popen([sys.executable, script, str(port)])
    canned_serving = subprocess.Popen([sys.executable, script, str(serving_port), "--serving"])
    repository = linked_repository("score-floor", default_model(DEFAULT_NGRAM))
    names = ("lmserve", "canned", "canned_serving")
    try:
        with ServerProcess(repository) as server:
            served: dict[str, list[float]] = {name: [] for name in names}
            cpu: dict[str, list[float]] = {name: [] for name in names}
            p99: dict[str, list[float]] = {name: [] for name in names}
            ratios, serving_ratios = [], []
            for run in range(args.runs):
                for name, target, pid in (
                    ("lmserve", server.target, server.pid),
                    ("canned", f"127.0.0.1:{port}", canned.pid),
                    ("canned_serving", f"127.0.0.1:{serving_port}", canned_serving.pid),
                ):
                    before = _cpu([pid])
                    times = _latencies(target, request, args.calls)
                    cpu[name].append((_cpu([pid]) - before) / (args.calls + 50) * 1e6)
                    served[name].append(percentile(times, 50) * 1e3)
                    p99[name].append(percentile(times, 99) * 1e3)
                ratios.append(served["lmserve"][-1] / served["canned"][-1])
                serving_ratios.append(served["canned_serving"][-1] / served["canned"][-1])
                log(
                    f"run {run}: p50 {served['lmserve'][-1]:.3f} ms vs {served['canned'][-1]:.3f}"
                    f" (canned with serving {served['canned_serving'][-1]:.3f})"
                )
    finally:
        for process in (canned, canned_serving):
            process.terminate()
            process.wait(timeout=30)
    for name in names:
        emit(record(f"score_floor_{name}_p50_ms", "ms", served[name]))
        emit(record(f"score_floor_{name}_p99_ms", "ms", p99[name]))
        emit(record(f"score_floor_{name}_server_cpu_us_per_call", "us", cpu[name]))
    emit(
        record(
            "score_floor_p50_ratio",
            "ratio",
            ratios,
            note=f"lmserve p50 / canned p50 per run ({MODEL}, one text: {args.text!r})",
        )
    )
    emit(
        record(
            "score_floor_serving_p50_ratio",
            "ratio",
            serving_ratios,
            note="canned server with the request parsed and lmserve's serving interceptor, "
            "p50 / canned p50 per run",
        )
    )
    log(f"median p50 ratio {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
