"""A long prompt entering Generate while 16 LSTM streams generate: their inter-token latency
before vs while the prompt is read (chunked prefill), through a real server (own process).

    python bench/bench_prefill.py [--quick] [--runs 3] [--streams 16] [--prompt-tokens 20000]

Per run: 16 streams (kjv-lstm, plain sampling, ignore_eos) start and run 1 s; for `--window`
seconds their messages' gaps are the "before" sample; then one Generate with a
`--prompt-tokens` prompt (random word ids) and max_new_tokens 1 is sent, and every gap of the
16 streams whose message arrives until that request's token arrives is the "while" sample. Gaps
are spread over the tokens a message carries (as bench_generate.py). Reported per run: p50/p99
of both samples, the p99 ratio (while / before: the issue's goal is <= 2), and the long
request's time to first token; medians over runs. Run it with PYTHONPATH pointing at another
checkout's `server/` to measure that code (e.g. the one-shot prefill before this change).
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
    percentile,
    quick,
    record,
)
from server_process import ServerProcess


async def _follow(client: Any, model: str, seed: int, arrivals: list[tuple[float, int]]) -> None:
    """Streams one after another until cancelled: (arrival time, tokens carried) per message,
    and (nan, 0) between two streams (no gap is counted across)."""
    from lmserve.client import GeneratedToken
    from lmserve.client import _requests as req

    request = req.generate_request(model, "", max_new_tokens=4096, ignore_eos=True, seed=seed)
    while True:
        async for message in client.stub.Generate(request, timeout=600):
            count = sum(isinstance(e, GeneratedToken) for e in req.generation_events(message))
            if count:
                arrivals.append((time.perf_counter(), count))
        arrivals.append((float("nan"), 0))


def _gaps(arrivals: list[tuple[float, int]], start: float, end: float) -> list[float]:
    """Gaps of messages arriving in (start, end], each spread over its tokens."""
    out: list[float] = []
    for (t0, _), (t1, count) in zip(arrivals, arrivals[1:], strict=False):
        if count and t0 == t0 and start < t1 <= end:  # t0 == t0: not the nan between streams
            out.extend([(t1 - t0) / count] * count)
    return out


async def _run(
    target: str, model: str, streams: int, prompt_tokens: int, window: float, vocab: int
) -> dict[str, float]:
    import numpy as np

    from lmserve.client import AsyncLmServeClient
    from lmserve.client import _requests as req

    rng = np.random.default_rng(prompt_tokens)
    prompt = rng.integers(3, vocab, prompt_tokens).tolist()
    async with AsyncLmServeClient(target, timeout=600) as client:
        arrivals: list[list[tuple[float, int]]] = [[] for _ in range(streams)]
        tasks = [
            asyncio.create_task(_follow(client, model, i, arrivals[i])) for i in range(streams)
        ]
        await asyncio.sleep(1.0)
        before_start = time.perf_counter()
        await asyncio.sleep(window)
        sent = time.perf_counter()
        request = req.generate_request(model, prompt, max_new_tokens=1, ignore_eos=True, seed=0)
        async for _ in client.stub.Generate(request, timeout=600):
            break
        first = time.perf_counter()
        for task in tasks:
            task.cancel()
        for outcome in await asyncio.gather(*tasks, return_exceptions=True):
            if not isinstance(outcome, asyncio.CancelledError | None):
                raise RuntimeError(f"a stream failed: {outcome!r}")
    before = [g for a in arrivals for g in _gaps(a, before_start, sent)]
    during = [g for a in arrivals for g in _gaps(a, sent, first)]
    out = {
        "before_p50_ms": 1000 * percentile(before, 50),
        "before_p99_ms": 1000 * percentile(before, 99),
        "while_p50_ms": 1000 * percentile(during, 50),
        "while_p99_ms": 1000 * percentile(during, 99),
        "while_max_ms": 1000 * max(during, default=first - sent),
        "long_prompt_ttft_s": first - sent,
    }
    out["p99_ratio"] = out["while_p99_ms"] / out["before_p99_ms"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="one short run")
    parser.add_argument("--runs", type=int, default=None)
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=None)
    parser.add_argument("--window", type=float, default=3.0, help="seconds of 'before' gaps")
    args = parser.parse_args()
    if args.quick:
        os.environ[QUICK_ENV] = "1"
    runs = args.runs or (1 if quick() else 3)
    prompt_tokens = args.prompt_tokens or (5000 if quick() else 20_000)

    from lmserve.server.manifest import read_manifest

    folder = default_model(DEFAULT_LSTM)
    manifest = read_manifest(folder)
    vocab = 1000  # prompt ids among the 1000 most frequent words
    results: list[dict[str, float]] = []
    with ServerProcess(linked_repository("prefill-repo", folder)) as server:
        for run in range(runs):
            rec = asyncio.run(
                _run(server.target, manifest.name, args.streams, prompt_tokens, args.window, vocab)
            )
            log(f"run {run}: {rec}")
            results.append(rec)
    summary: dict[str, Any] = {
        key: statistics.median(r[key] for r in results) for key in results[0]
    }
    emit(
        record(
            f"prefill_{prompt_tokens}_tokens_beside_{args.streams}_lstm_streams_itl_p99_ratio",
            "ratio",
            [r["p99_ratio"] for r in results],
            per_run=results,
            **{f"median_{k}": v for k, v in summary.items()},
            server_pythonpath=os.environ.get("PYTHONPATH", ""),
            note="p99 inter-token latency of the running streams while the prompt is read, "
            "over their p99 before it arrived (medians of runs)",
        )
    )


if __name__ == "__main__":
    main()
