"""Is a cheap request served promptly while a big neural Score runs? (the engine rework's goal)

    python bench/bench_isolation.py [--quick] [--runs 3] [--seconds 10] [--alone-seconds 5]

The server (`lmserve serve`, own process) serves the default model repository (models/). Each
run: a probe client sends, in turn, a one-sentence Score on kjv-5gram (n-gram), a gRPC health
Check, a one-sentence Score on kjv-lstm (neural) and a ListModels, one call at a time, first
alone, then while a background client thread loops a 400-line Score on kjv-lstm. A call
started in a phase is waited for, so a stalled server shows as few, very slow calls (kinds
with none completed are reported as such); `--parallel-probes` gives each kind its own
thread, so every kind is measured even then (the probes then queue behind each other too).
By default (`--paced`) each kind runs on a timer of its own in its own thread instead, as a
client timing them would: the n-gram sentence every 20 ms, the kjv-lstm one every 50 ms, health
and ListModels every 100 ms (the back-to-back probing of `--no-paced` measured 5.7 ms where
such a client saw 37 ms). Each run
prints one JSON line (p50/p99 per probe kind and phase, the background's tokens/s); then one
record per probe kind and phase with the medians over runs, the load phase's p99 next to its
target (n-gram < 20 ms, neural < 50 ms, health and ListModels < 50 ms).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from common import (
    DEFAULT_MODELS,
    QUICK_ENV,
    REPO_ROOT,
    default_model,
    emit,
    log,
    percentile,
    quick,
    read_lines,
    record,
)
from grpc_calls import Latencies, Stubs, health_request, list_models_request, score_request
from server_process import ServerProcess

TEST_LINES = REPO_ROOT / "export" / "lmserve" / "export" / "corpora" / "kjv" / "test.txt"
NGRAM, NEURAL = "kjv-5gram", "kjv-lstm"
KINDS = ("ngram_score", "health", "neural_score", "list_models")
# p99 under load that the rework must meet, ms
TARGETS_MS = {"ngram_score": 20.0, "neural_score": 50.0, "health": 50.0, "list_models": 50.0}


class Background(threading.Thread):
    """Loops one big Score on the neural model until stopped; counts what it scored."""

    def __init__(self, target: str, texts: list[str]) -> None:
        super().__init__(daemon=True)
        self.target, self.texts = target, texts
        self.stop = threading.Event()
        self.requests = 0
        self.tokens = 0
        self.errors: list[str] = []
        self.seconds = 0.0

    def run(self) -> None:
        import grpc

        stubs = Stubs.open(self.target)
        request = score_request(NEURAL, self.texts)
        start = time.perf_counter()
        try:
            while not self.stop.is_set():
                try:
                    response = stubs.lm.Score(request, timeout=600)
                except grpc.RpcError as exc:
                    self.errors.append(str(exc.code()))
                    time.sleep(0.1)
                    continue
                self.requests += 1
                self.tokens += sum(r.token_count for r in response.results)
        finally:
            self.seconds = time.perf_counter() - start
            stubs.close()


def probe(
    stubs: Stubs, sentences: list[str], seconds: float, parallel: bool = False
) -> dict[str, Latencies]:
    """One call at a time, the kinds in turn, for `seconds` (a call started in time is
    finished). With `parallel`, each kind loops in its own thread instead, so a kind stuck
    behind a stalled server does not keep the others from being measured."""
    out = {kind: Latencies() for kind in KINDS}
    calls: dict[str, Callable[[str], Any]] = {
        "ngram_score": lambda s: stubs.lm.Score(score_request(NGRAM, [s]), timeout=60),
        "health": lambda s: stubs.health.Check(health_request(), timeout=60),
        "neural_score": lambda s: stubs.lm.Score(score_request(NEURAL, [s]), timeout=60),
        "list_models": lambda s: stubs.lm.ListModels(list_models_request(), timeout=60),
    }
    deadline = time.perf_counter() + seconds
    lines = itertools.cycle(sentences)

    def loop(kinds: tuple[str, ...]) -> None:
        for kind in itertools.cycle(kinds):
            if time.perf_counter() >= deadline:
                return
            out[kind].call(functools.partial(calls[kind], next(lines)))

    if not parallel:
        loop(KINDS)
        return out
    threads = [threading.Thread(target=loop, args=((kind,),)) for kind in KINDS]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


# `--paced`: what a client timing each kind on its own clock sees (issue #31's figures): the
# n-gram sentence every 20 ms and the kjv-lstm one every 50 ms, each kind in its own thread.
PACED_PERIOD_S = {
    "ngram_score": 0.020,
    "neural_score": 0.050,
    "health": 0.100,
    "list_models": 0.100,
}


def paced_probe(stubs: Stubs, sentences: list[str], seconds: float) -> dict[str, Latencies]:
    """Each kind on its own period in its own thread (a call that overruns its period is
    followed at once by the next): latencies as a client on a timer sees them."""
    out = {kind: Latencies() for kind in KINDS}
    calls: dict[str, Callable[[str], Any]] = {
        "ngram_score": lambda s: stubs.lm.Score(score_request(NGRAM, [s]), timeout=60),
        "health": lambda s: stubs.health.Check(health_request(), timeout=60),
        "neural_score": lambda s: stubs.lm.Score(score_request(NEURAL, [s]), timeout=60),
        "list_models": lambda s: stubs.lm.ListModels(list_models_request(), timeout=60),
    }
    deadline = time.perf_counter() + seconds

    def loop(kind: str) -> None:
        lines = itertools.cycle(sentences[KINDS.index(kind) * 31 :] + sentences)
        period = PACED_PERIOD_S[kind]
        due = time.perf_counter()
        while due < deadline:
            out[kind].call(functools.partial(calls[kind], next(lines)))
            due += period
            time.sleep(max(0.0, due - time.perf_counter()))

    threads = [threading.Thread(target=loop, args=(kind,)) for kind in KINDS]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def summary(latencies: dict[str, Latencies]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for kind, lat in latencies.items():
        ms = [s * 1e3 for s in lat.seconds]
        out[kind] = {
            "calls": len(ms),
            "errors": lat.errors[:5],
            "error_count": len(lat.errors),
            "p50_ms": round(percentile(ms, 50), 3) if ms else None,
            "p99_ms": round(percentile(ms, 99), 3) if ms else None,
            "max_ms": round(max(ms), 3) if ms else None,
        }
    return out


def one_run(server: ServerProcess, args: argparse.Namespace, run: int) -> dict[str, Any]:
    lines = [line for line in read_lines(TEST_LINES) if line.strip()]
    sentences = lines[run * 97 % len(lines) :] + lines  # each run probes other sentences
    stubs = Stubs.open(server.target)
    try:
        probe(stubs, sentences, 0.5)  # warm-up: connections, first calls
        measure = (
            paced_probe if args.paced else functools.partial(probe, parallel=args.parallel_probes)
        )
        alone = measure(stubs, sentences, args.alone_seconds)
        background = Background(server.target, [lines[i % len(lines)] for i in range(400)])
        background.start()
        time.sleep(args.settle)  # the first big request is in flight
        loaded = measure(stubs, sentences, args.seconds)
        background.stop.set()
        background.join()
    finally:
        stubs.close()
    return {
        "name": "isolation_run",
        "run": run,
        "parallel_probes": args.parallel_probes,
        "paced": args.paced,
        "alone_seconds": args.alone_seconds,
        "loaded_seconds": args.seconds,
        "alone": summary(alone),
        "loaded": summary(loaded),
        "background": {
            "requests": background.requests,
            "texts_per_request": 400,
            "tokens_per_s": round(background.tokens / background.seconds, 1),
            "errors": background.errors[:5],
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short runs (or LMSERVE_BENCH_QUICK)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=None, help="probing under load per run")
    parser.add_argument("--alone-seconds", type=float, default=None, help="probing alone per run")
    parser.add_argument("--parallel-probes", action="store_true", help="a thread per kind")
    parser.add_argument(
        "--paced",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="each kind on its own timer in its own thread, as a client sees it (default); "
        "--no-paced: the kinds back to back, one call at a time",
    )
    parser.add_argument("--settle", type=float, default=0.3, help="after starting the load")
    args = parser.parse_args()
    if args.quick:
        os.environ[QUICK_ENV] = "1"
    short = quick()
    args.seconds = args.seconds or (3.0 if short else 10.0)
    args.alone_seconds = args.alone_seconds or (1.5 if short else 4.0)
    default_model(DEFAULT_MODELS / NGRAM)
    default_model(DEFAULT_MODELS / NEURAL)
    runs = []
    with ServerProcess(DEFAULT_MODELS) as server:
        for run in range(args.runs):
            log(f"run {run + 1}/{args.runs}: {args.alone_seconds:g} s alone, then loaded")
            result = one_run(server, args, run)
            print(json.dumps(result), flush=True)
            runs.append(result)
    for phase in ("alone", "loaded"):
        for kind in KINDS:
            calls = sum(r[phase][kind]["calls"] for r in runs)
            errors = sum(r[phase][kind]["error_count"] for r in runs)
            for stat in ("p50_ms", "p99_ms"):
                name = f"isolation_{kind}_{phase}_{stat}"
                values = [r[phase][kind][stat] for r in runs if r[phase][kind][stat] is not None]
                extra: dict[str, Any] = {"kind": kind, "phase": phase, "calls": calls}
                extra["errors"] = errors
                if phase == "loaded" and stat == "p99_ms":
                    extra["target_ms"] = TARGETS_MS[kind]
                if not values:  # not one call of this kind completed in the window
                    print(json.dumps({"name": name, "unit": "ms", "median": None, **extra}))
                    log(f"  {name}: no call completed")
                    continue
                rec = record(name, "ms", values, **extra)
                if "target_ms" in extra:
                    rec["meets_target"] = rec["median"] < extra["target_ms"]
                emit(rec)
    rates = [r["background"]["tokens_per_s"] for r in runs]
    emit(record("isolation_background_tokens_per_s", "tokens/s", rates, texts_per_request=400))


if __name__ == "__main__":
    main()
