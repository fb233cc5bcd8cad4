"""Autocomplete through a real server (own process): keystroke savings and keystroke latency.

    python bench/bench_complete.py [--sentences 100] [--sessions 32] [--keys 40] [--runs 3]
        [--key-intervals-ms 100,0]

(a) Savings: held-out KJV test sentences typed letter by letter with k=3 suggestions, a word
    taken with one tap as soon as it is offered (its space free): 1 - keys / characters
    (spaces included), for kjv-lstm, kjv-5gram and kjv-lstm-5gram on the same sentences
    (`lmserve.client.savings`). One round trip per simulated keystroke, as a user's.
(b) Latency: `--sessions` sessions typing at once (asyncio, one AsyncCompletionSession each,
    `--keys` keystrokes each, test sentences letter by letter) on kjv-lstm and on kjv-5gram;
    per-keystroke round trip p50 and p99 per run, medians of `--runs` runs, with each user
    typing a key every `--key-intervals-ms` (100: a fast typist; 0: the next key as soon as
    the answer came, the server's throughput bound). Targets: neural p99 <= 10 ms, n-gram
    p99 <= 3 ms. Beside them, the transport floor: the same users and pace, each key a
    one-word n-gram ScoreStream message (no model work to speak of).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from common import (
    DEFAULT_MODELS,
    REPO_ROOT,
    emit,
    linked_repository,
    log,
    percentile,
    quick,
    read_lines,
    record,
    timed,
)
from server_process import ServerProcess

TEST_SENTENCES = REPO_ROOT / "export" / "lmserve" / "export" / "corpora" / "kjv" / "test.txt"
SAVINGS_MODELS = ("kjv-lstm", "kjv-5gram", "kjv-lstm-5gram")
LATENCY_MODELS = {"kjv-lstm": 10.0, "kjv-5gram": 3.0}  # model -> p99 target in ms


class SessionSuggest:
    """`keystroke_savings`'s suggest function on one CompletionSession: each call is one
    keystroke's message (a new sentence resets, a finished word is accepted, a letter typed
    refines the partial word)."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.context: list[str] = []
        self.answer: list[str] | None = None

    def __call__(self, context: Sequence[str], partial: str, k: int) -> list[str]:
        context = list(context)
        if context != self.context:
            if context[:-1] == self.context:
                found = self.session.accept(context[-1])
            else:
                found = self.session.reset()
                for word in context:
                    found = self.session.accept(word)
            self.context = context
            if not partial:
                return [c.word for c in found]
        return [c.word for c in self.session.suggest(partial, k)]


def savings(
    target: str, sentences: list[str], k: int, models: tuple[str, ...] = SAVINGS_MODELS
) -> None:
    from lmserve.client import LmServeClient
    from lmserve.client.savings import keystroke_savings

    with LmServeClient(target) as client:
        for model in models:
            with client.complete(model, k=k) as session:
                started = time.perf_counter()
                got = keystroke_savings(sentences, SessionSuggest(session), k)
                seconds = time.perf_counter() - started
            emit(
                record(
                    f"complete_keystroke_savings_{model}_k{k}",
                    "fraction",
                    [got.savings],
                    model=model,
                    sentences=len(sentences),
                    characters=got.characters,
                    keys=got.keys,
                    words=got.words,
                    accepted_words=got.accepted,
                    seconds=round(seconds, 3),
                )
            )


async def _typist(
    client: Any, model: str, text: str, keys: int, interval: float, out: list[float]
) -> None:
    """One user: a key every `interval` seconds (0: the next key as soon as answered)."""
    async with client.complete(model, k=3) as session:
        await session.reset()  # opens the stream: not a keystroke
        await asyncio.sleep(random.uniform(0, interval))  # users do not type in step
        due = time.perf_counter()
        for ch in text[:keys]:
            started = time.perf_counter()
            await session.type(ch)
            out.append(time.perf_counter() - started)
            due += interval
            await asyncio.sleep(max(0.0, due - time.perf_counter()))


async def _latency_run(
    target: str, model: str, texts: list[str], keys: int, interval: float
) -> list[float]:
    from lmserve.client import AsyncLmServeClient

    out: list[float] = []
    async with AsyncLmServeClient(target) as client:
        await asyncio.gather(*(_typist(client, model, t, keys, interval, out) for t in texts))
    return out


async def _floor_user(stub: Any, keys: int, interval: float, out: list[float]) -> None:
    """One user of the transport floor: a one-word n-gram ScoreStream message per key (no
    model work to speak of), paced like a typist, one message in flight."""
    from lmserve.v1 import lm_service_pb2 as pb

    outbox: asyncio.Queue[Any] = asyncio.Queue()

    async def requests() -> Any:
        while (item := await outbox.get()) is not None:
            yield item

    call = stub.ScoreStream(requests())
    message = pb.ScoreRequest(model="kjv-5gram", texts=["the"])
    await asyncio.sleep(random.uniform(0, interval))
    due = time.perf_counter()
    for _ in range(keys):
        started = time.perf_counter()
        await outbox.put(message)
        await call.read()
        out.append(time.perf_counter() - started)
        due += interval
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
    await outbox.put(None)
    await call.read()  # the end of the stream


async def _floor_run(target: str, sessions: int, keys: int, interval: float) -> list[float]:
    import grpc

    from lmserve.v1 import lm_service_pb2_grpc

    out: list[float] = []
    async with grpc.aio.insecure_channel(target) as channel:
        stub = lm_service_pb2_grpc.LanguageModelServiceStub(channel)
        await asyncio.gather(*(_floor_user(stub, keys, interval, out) for _ in range(sessions)))
    return out


def transport_floor(target: str, sessions: int, keys: int, runs: int, interval_ms: float) -> None:
    """The same users and pace, each key one bidi message that costs the server almost nothing:
    what grpcio alone costs a keystroke here, client and server on the same two cores."""
    p50s, p99s = [], []
    for run in range(runs + 1):  # the first is a warm-up
        rtts = asyncio.run(_floor_run(target, sessions, keys, interval_ms / 1e3))
        if run:
            p50s.append(percentile(rtts, 50) * 1e3)
            p99s.append(percentile(rtts, 99) * 1e3)
    name = f"complete_floor_{sessions}streams_every{interval_ms:g}ms"
    extra = {"sessions": sessions, "keys_per_session": keys, "key_interval_ms": interval_ms}
    emit(record(f"{name}_p50_ms", "ms", p50s, **extra))
    emit(record(f"{name}_p99_ms", "ms", p99s, **extra))


def latency(
    target: str, lines: list[str], sessions: int, keys: int, runs: int, interval_ms: float
) -> None:
    """Round trips of `sessions` users typing at once, each a key every `interval_ms` (a fast
    typist: 100 ms), and with no pause at all (0: the server's throughput bound)."""
    long_enough = [line for line in lines if len(line) >= keys]
    for model, target_ms in LATENCY_MODELS.items():
        p50s, p99s = [], []
        for run in range(runs + 1):  # the first is a warm-up
            texts = long_enough[run * sessions : (run + 1) * sessions]
            rtts = asyncio.run(_latency_run(target, model, texts, keys, interval_ms / 1e3))
            if run:
                p50s.append(percentile(rtts, 50) * 1e3)
                p99s.append(percentile(rtts, 99) * 1e3)
        extra = {
            "model": model,
            "sessions": sessions,
            "keys_per_session": keys,
            "key_interval_ms": interval_ms,
        }
        name = f"complete_{sessions}sessions_{model}_every{interval_ms:g}ms"
        emit(record(f"{name}_p50_ms", "ms", p50s, **extra))
        emit(
            record(
                f"{name}_p99_ms",
                "ms",
                p99s,
                target_ms=target_ms,
                **extra,
            )
        )


def primitives(runs: int) -> None:
    """The server's per-keystroke search on the kjv-lstm vocabulary (12,352 words), in-process:
    a prefix lookup, and top-3 over the prefix's words of a full distribution."""
    import numpy as np

    from lmserve.server.decoding.completion import top_k_words
    from lmserve.server.text.prefix_index import WordPrefixIndex
    from lmserve.server.text.vocab import Vocabulary

    words = (DEFAULT_MODELS / "kjv-lstm" / "vocab.txt").read_text(encoding="utf-8").split("\n")
    vocab = Vocabulary.from_words([w for w in words if w])
    index = WordPrefixIndex.from_vocab(vocab)
    log_probs = np.log(np.random.default_rng(0).dirichlet(np.ones(len(vocab)))).astype(np.float32)
    prefixes = ["", "t", "th", "lo", "beg", "righteous"]
    calls = 2000

    def lookups() -> None:
        for _ in range(calls // len(prefixes)):
            for p in prefixes:
                index.ids_with_prefix(p)

    lookup_s = [timed(lookups) for _ in range(runs)]
    emit(record("complete_prefix_lookup_us", "us", [s / calls * 1e6 for s in lookup_s]))
    for prefix in ("", "t", "th"):
        ids = index.ids_with_prefix(prefix)

        def top(ids: Any = ids) -> None:
            for _ in range(calls):
                top_k_words(log_probs, ids, 3)

        top_s = [timed(top) for _ in range(runs)]
        emit(
            record(
                f"complete_top3_prefix_{prefix or 'empty'}_us",
                "us",
                [s / calls * 1e6 for s in top_s],
                candidates=len(ids),
            )
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sentences", type=int, default=20 if quick() else 100)
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--sessions", type=int, default=32)
    parser.add_argument("--keys", type=int, default=20 if quick() else 40)
    parser.add_argument(
        "--key-intervals-ms",
        default="100,0",
        help="each user's time between keys, one latency measurement per value (0: none)",
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--skip-savings", action="store_true")
    parser.add_argument("--skip-latency", action="store_true")
    parser.add_argument(
        "--with-model",
        type=Path,
        action="append",
        default=[],
        help="another model folder whose keystroke savings to measure beside the defaults",
    )
    args = parser.parse_args()
    primitives(args.runs)
    from lmserve.client import LmServeClient, LmServeClientError

    lines = [line for line in read_lines(TEST_SENTENCES) if line.strip()]
    repository: Path = DEFAULT_MODELS
    models: tuple[str, ...] = SAVINGS_MODELS
    if args.with_model:
        from lmserve.server.manifest import read_manifest

        defaults = [DEFAULT_MODELS / name for name in ("kjv-5gram", "kjv-lstm", "kjv-lstm-5gram")]
        repository = linked_repository("complete-repo", *defaults, *args.with_model)
        models = (*models, *(read_manifest(folder).name for folder in args.with_model))
    with ServerProcess(repository) as server:
        try:
            with LmServeClient(server.target) as client, client.complete("kjv-5gram") as s:
                s.suggest("")
        except LmServeClientError as exc:
            log(f"bench_complete: the server cannot complete yet: {exc}")
            return 1
        if not args.skip_savings:
            log(f"keystroke savings over {args.sentences} test sentences, k={args.k}")
            savings(server.target, lines[: args.sentences], args.k, models)
        if not args.skip_latency:
            log(f"latency: {args.sessions} sessions x {args.keys} keys, {args.runs} runs")
            for interval in (float(v) for v in args.key_intervals_ms.split(",")):
                latency(server.target, lines, args.sessions, args.keys, args.runs, interval)
                transport_floor(server.target, args.sessions, args.keys, args.runs, interval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
