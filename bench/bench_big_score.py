"""One very big Score on the neural model: memory, success, and whether health still answers.

    python bench/bench_big_score.py [--quick] [--texts 1000] [--words 1100] [--max-rss-gb 4]

The server (`lmserve serve`, own process, a fresh one per run) serves the default models
(models/). One Score request on kjv-lstm of `--texts` texts of about `--words` words each (KJV
test sentences concatenated). Meanwhile the server's RSS is sampled every 50 ms (psutil) and a
gRPC health Check is sent every 0.5 s (2 s timeout); one more Check after the call. A guard
kills the server when its RSS passes `--max-rss-gb` (the whole request once took more than
this 24 GB machine had), and the run reports that instead of taking the machine down.

Each run prints one JSON line: whether the call succeeded (else its status and message), its
seconds, the peak and starting RSS, whether the guard fired, the health Checks answered during
and after. Then records with the medians over runs.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from typing import Any

from common import (
    DEFAULT_MODELS,
    QUICK_ENV,
    REPO_ROOT,
    default_model,
    emit,
    log,
    quick,
    read_lines,
    record,
)
from grpc_calls import Stubs, health_request, score_request
from server_process import ServerProcess

TEST_LINES = REPO_ROOT / "export" / "lmserve" / "export" / "corpora" / "kjv" / "test.txt"
MODEL = "kjv-lstm"
MB = 1024 * 1024


def big_texts(count: int, words: int) -> list[str]:
    """`count` texts of whole test sentences, each cut at the first sentence reaching `words`."""
    lines = [line for line in read_lines(TEST_LINES) if line.strip()]
    texts, k = [], 0
    for _ in range(count):
        parts: list[str] = []
        n = 0
        while n < words:
            line = lines[k % len(lines)]
            k += 1
            parts.append(line)
            n += len(line.split())
        texts.append(" ".join(parts))
    return texts


class RssGuard(threading.Thread):
    """Samples the server's RSS every `period` s; kills the server above `limit` bytes."""

    def __init__(self, server: ServerProcess, limit: int, period: float = 0.05) -> None:
        super().__init__(daemon=True)
        import psutil

        self.server, self.limit, self.period = server, limit, period
        self.process = psutil.Process(server.pid)
        self.start_rss = self.peak = self.process.memory_info().rss
        self.samples = 0
        self.killed = False
        self.stop = threading.Event()

    def run(self) -> None:
        import psutil

        while not self.stop.is_set():
            try:
                rss = self.process.memory_info().rss
            except psutil.Error:
                return  # the server is gone
            self.samples += 1
            self.peak = max(self.peak, rss)
            if rss > self.limit:
                log(f"server RSS {rss / MB:.0f} MB > {self.limit / MB:.0f} MB: killing it")
                self.killed = True
                self.server.kill()
                return
            self.stop.wait(self.period)


class HealthProbe(threading.Thread):
    """A health Check every `period` s on its own channel: how many were answered, how fast."""

    def __init__(self, target: str, period: float = 0.5, timeout: float = 2.0) -> None:
        super().__init__(daemon=True)
        self.target, self.period, self.timeout = target, period, timeout
        self.sent = 0
        self.answered_ms: list[float] = []
        self.stop = threading.Event()

    def run(self) -> None:
        stubs = Stubs.open(self.target)
        try:
            while not self.stop.is_set():
                self.sent += 1
                ms = check(stubs, self.timeout)
                if ms is not None:
                    self.answered_ms.append(ms)
                self.stop.wait(self.period)
        finally:
            stubs.close()


def check(stubs: Stubs, timeout: float) -> float | None:
    """ms of one health Check, None when it failed or timed out."""
    import grpc

    start = time.perf_counter()
    try:
        stubs.health.Check(health_request(), timeout=timeout)
    except grpc.RpcError:
        return None
    return (time.perf_counter() - start) * 1e3


def one_run(texts: list[str], args: argparse.Namespace, run: int) -> dict[str, Any]:
    import grpc

    result: dict[str, Any] = {"name": "big_score_run", "run": run, "texts": len(texts)}
    result["words"] = sum(len(t.split()) for t in texts)
    with ServerProcess(DEFAULT_MODELS) as server:
        stubs = Stubs.open(server.target)
        try:
            stubs.lm.Score(score_request(MODEL, texts[:1]), timeout=60)  # warm-up
            guard = RssGuard(server, int(args.max_rss_gb * 1024 * MB))
            health = HealthProbe(server.target)
            guard.start()
            health.start()
            start = time.perf_counter()
            try:
                response = stubs.lm.Score(score_request(MODEL, texts), timeout=args.timeout)
                result["ok"] = True
                result["tokens"] = sum(r.token_count for r in response.results)
            except grpc.RpcError as exc:
                result["ok"] = False
                result["status"] = str(exc.code())
                result["message"] = (exc.details() or "")[:300]
            result["seconds"] = round(time.perf_counter() - start, 3)
            health.stop.set()
            health.join()
            after = check(stubs, 5.0) if server.alive() else None
            guard.stop.set()
            guard.join()
        finally:
            stubs.close()
    result.update(
        peak_rss_mb=round(guard.peak / MB, 1),
        start_rss_mb=round(guard.start_rss / MB, 1),
        rss_samples=guard.samples,
        killed_for_rss=guard.killed,
        max_rss_gb=args.max_rss_gb,
        health_during_sent=health.sent,
        health_during_answered=len(health.answered_ms),
        health_during_max_ms=round(max(health.answered_ms), 1) if health.answered_ms else None,
        health_after_answered=after is not None,
        health_after_ms=round(after, 1) if after is not None else None,
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short runs (or LMSERVE_BENCH_QUICK)")
    parser.add_argument("--runs", type=int, default=None, help="3 (1 with --quick)")
    parser.add_argument("--texts", type=int, default=None, help="1000 (100 with --quick)")
    parser.add_argument("--words", type=int, default=1100, help="words per text, about")
    parser.add_argument("--max-rss-gb", type=float, default=4.0, help="kill the server above")
    parser.add_argument("--timeout", type=float, default=1800.0, help="the Score's deadline, s")
    args = parser.parse_args()
    if args.quick:
        os.environ[QUICK_ENV] = "1"
    runs = args.runs or (1 if quick() else 3)
    count = args.texts or (100 if quick() else 1000)
    default_model(DEFAULT_MODELS / MODEL)
    texts = big_texts(count, args.words)
    log(f"{count} texts, {sum(len(t.split()) for t in texts)} words, guard {args.max_rss_gb} GB")
    results = []
    for run in range(runs):
        result = one_run(texts, args, run)
        print(json.dumps(result), flush=True)
        results.append(result)
    setup = {"texts": count, "words_per_text": args.words, "max_rss_gb": args.max_rss_gb}
    emit(record("big_score_peak_rss_mb", "MB", [r["peak_rss_mb"] for r in results], **setup))
    emit(record("big_score_seconds", "s", [r["seconds"] for r in results], **setup))
    for key in ("ok", "killed_for_rss", "health_after_answered"):
        emit(record(f"big_score_{key}", "fraction of runs", [float(r[key]) for r in results]))
    answered = [r["health_during_answered"] / max(r["health_during_sent"], 1) for r in results]
    emit(record("big_score_health_during_answered", "fraction of checks", answered))


if __name__ == "__main__":
    main()
