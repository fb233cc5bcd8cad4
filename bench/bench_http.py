"""The HTTP front against the gRPC port of the same server (own process), in one run each:

    python bench/bench_http.py [--quick] [--runs 3] [--sessions 32] [--streams 32] [--tokens 64]

(a) Autocomplete: `--sessions` users typing KJV test sentences at once, a key every 100 ms (a
    fast typist), the same CompleteRequest messages over a gRPC Complete stream and over the
    `/ws/complete` WebSocket; per-keystroke round trip p50/p99. Goal: WebSocket p99 <= 1.5x
    gRPC's.
(b) Generation: `--streams` concurrent streams of `--tokens` tokens (kjv-lstm, ignore_eos,
    seeded sampling) as gRPC Generate and as OpenAI streaming completions (SSE); aggregate
    tokens/s. Goal: OpenAI >= 0.8x gRPC.
(c) Scoring: 16 concurrent callers of Score (kjv-5gram, one 10-word text per call) over gRPC
    and over Connect JSON; calls/s.
Each pair alternates gRPC and HTTP run by run (medians of `--runs`; ratios per run pair), and
beside each figure the server's CPU time (front + engine workers) per unit of work: the load
generator shares the two cores, so CPU per keystroke / token / call is the fairer comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any, TypeVar

from common import (
    DEFAULT_LSTM,
    DEFAULT_NGRAM,
    QUICK_ENV,
    REPO_ROOT,
    default_model,
    emit,
    linked_repository,
    log,
    percentile,
    quick,
    record,
)
from http_client import HttpConnection
from server_process import ServerProcess, free_port

TEST_SENTENCES = REPO_ROOT / "export" / "lmserve" / "export" / "corpora" / "kjv" / "test.txt"
SERVICE = "/lmserve.v1.LanguageModelService"
T = TypeVar("T")
SCORE_TEXT = "and god said let there be light and there was light"


# -- (a) autocomplete ---------------------------------------------------------------------------


def keystrokes(model: str, text: str, keys: int) -> list[dict[str, Any]]:
    """The CompleteRequest messages (proto3 JSON) of typing `text`'s first `keys` characters:
    a letter refines the partial word, a space commits the word."""
    messages: list[dict[str, Any]] = []
    word = ""
    for ch in text[:keys]:
        message: dict[str, Any] = {"k": 3, "sequence": str(len(messages) + 1)}
        if not messages:
            message["model"] = model
        if ch == " ":
            message["appendText"], word = word, ""
        else:
            word += ch
        message["partialWord"] = word
        messages.append(message)
    return messages


async def _grpc_typist(stub: Any, messages: list[dict[str, Any]], out: list[float]) -> None:
    from google.protobuf.json_format import ParseDict

    from lmserve.v1 import lm_service_pb2 as pb

    outbox: asyncio.Queue[Any] = asyncio.Queue()

    async def requests() -> Any:
        while (item := await outbox.get()) is not None:
            yield item

    call = stub.Complete(requests())
    await _typing(
        messages, out, lambda m: outbox.put(ParseDict(m, pb.CompleteRequest())), call.read
    )
    await outbox.put(None)
    await call.read()


async def _ws_typist(url: str, messages: list[dict[str, Any]], out: list[float]) -> None:
    from websockets.asyncio.client import connect

    async with connect(url, compression=None) as socket:

        async def send(message: dict[str, Any]) -> None:
            await socket.send(json.dumps(message))

        await _typing(messages, out, send, socket.recv)


async def _typing(
    messages: list[dict[str, Any]],
    out: list[float],
    send: Callable[[dict[str, Any]], Awaitable[Any]],
    receive: Callable[[], Awaitable[Any]],
    interval: float = 0.1,
) -> None:
    """One user: a key every `interval` seconds, one message in flight; the first message
    (opening the session) is not a keystroke."""
    await send(messages[0])
    await receive()
    await asyncio.sleep(random.uniform(0, interval))
    due = time.perf_counter()
    for message in messages[1:]:
        started = time.perf_counter()
        await send(message)
        await receive()
        out.append(time.perf_counter() - started)
        due += interval
        await asyncio.sleep(max(0.0, due - time.perf_counter()))


async def _typing_run(
    server: ServerProcess, http_port: int, front: str, texts: list[str], model: str, keys: int
) -> list[float]:
    out: list[float] = []
    scripts = [keystrokes(model, t, keys) for t in texts]
    if front == "grpc":
        import grpc

        from lmserve.v1 import lm_service_pb2_grpc

        async with grpc.aio.insecure_channel(server.target) as channel:
            stub = lm_service_pb2_grpc.LanguageModelServiceStub(channel)
            await asyncio.gather(*(_grpc_typist(stub, s, out) for s in scripts))
    else:
        url = f"ws://127.0.0.1:{http_port}/ws/complete"
        await asyncio.gather(*(_ws_typist(url, s, out) for s in scripts))
    return out


def autocomplete(
    server: ServerProcess, http_port: int, sessions: int, keys: int, runs: int, model: str
) -> None:
    lines = [
        line for line in TEST_SENTENCES.read_text(encoding="utf-8").splitlines() if len(line) > keys
    ]
    figures: dict[str, dict[str, list[float]]] = {
        f: {"p50": [], "p99": [], "cpu": []} for f in ("grpc", "ws")
    }

    def typing(run: int, front: str) -> Coroutine[Any, Any, list[float]]:
        texts = [line.lower() for line in lines[run * sessions : (run + 1) * sessions]]
        return _typing_run(server, http_port, front, texts, model, keys)

    for front, rtts, _, cpu in _alternating(server, ("grpc", "ws"), runs, typing):
        figures[front]["p50"].append(1e3 * percentile(rtts, 50))
        figures[front]["p99"].append(1e3 * percentile(rtts, 99))
        figures[front]["cpu"].append(1e3 * cpu / len(rtts))
    _emit_pair(
        f"http_complete_{sessions}sessions_{model}",
        figures,
        "p99",
        lower_is_better=True,
        sessions=sessions,
        keys_per_session=keys,
        key_interval_ms=100,
    )


# -- (b) generation -----------------------------------------------------------------------------


async def _grpc_stream(stub: Any, model: str, tokens: int, seed: int) -> int:
    from lmserve.v1 import lm_service_pb2 as pb

    request = pb.GenerateRequest(
        model=model,
        prompt="and",
        sampling=pb.SamplingParams(seed=seed),
        stopping=pb.StoppingCriteria(max_new_tokens=tokens, ignore_eos=True),
    )
    count = 0
    async for message in stub.Generate(request, timeout=600):
        count += len(message.tokens)
    return count


async def _openai_stream(port: int, model: str, tokens: int, seed: int) -> int:
    body = json.dumps(
        {
            "model": model,
            "prompt": "and",
            "max_tokens": tokens,
            "stream": True,
            "seed": seed,
            "ignore_eos": True,
        }
    ).encode()
    count, pending, done = 0, b"", False
    async with HttpConnection("127.0.0.1", port) as connection:
        async for piece in connection.post_streaming("/v1/completions", body, "application/json"):
            pending += piece
            *events, pending = pending.split(b"\n\n")
            for event in events:
                if event == b"data: [DONE]":
                    done = True
                elif event.startswith(b"data: ") and b'"text"' in event:
                    count += 1
    assert done, "the stream did not end with [DONE]"
    return count


async def _generate_run(
    server: ServerProcess, http_port: int, front: str, model: str, streams: int, tokens: int
) -> int:
    if front == "grpc":
        import grpc

        from lmserve.v1 import lm_service_pb2_grpc

        async with grpc.aio.insecure_channel(server.target) as channel:
            stub = lm_service_pb2_grpc.LanguageModelServiceStub(channel)
            counts = await asyncio.gather(
                *(_grpc_stream(stub, model, tokens, i) for i in range(streams))
            )
    else:
        counts = await asyncio.gather(
            *(_openai_stream(http_port, model, tokens, i) for i in range(streams))
        )
    return sum(counts)


def generation(
    server: ServerProcess, http_port: int, model: str, streams: int, tokens: int, runs: int
) -> None:
    figures: dict[str, dict[str, list[float]]] = {
        f: {"tokens_per_s": [], "cpu": []} for f in ("grpc", "openai")
    }

    def streaming(run: int, front: str) -> Coroutine[Any, Any, int]:
        return _generate_run(server, http_port, front, model, streams, tokens)

    for front, count, seconds, cpu in _alternating(server, ("grpc", "openai"), runs, streaming):
        assert count >= streams * tokens * 0.9, (front, count)
        figures[front]["tokens_per_s"].append(streams * tokens / seconds)
        figures[front]["cpu"].append(1e3 * cpu / (streams * tokens))
    _emit_pair(
        f"http_generate_{streams}streams_{model}",
        figures,
        "tokens_per_s",
        lower_is_better=False,
        streams=streams,
        tokens_per_stream=tokens,
    )


# -- (c) scoring --------------------------------------------------------------------------------


async def _score_run(
    server: ServerProcess, http_port: int, front: str, model: str, callers: int, seconds: float
) -> int:
    deadline = time.perf_counter() + seconds
    calls = 0

    if front == "grpc":
        import grpc

        from lmserve.v1 import lm_service_pb2 as pb
        from lmserve.v1 import lm_service_pb2_grpc

        request = pb.ScoreRequest(model=model, texts=[SCORE_TEXT])
        async with grpc.aio.insecure_channel(server.target) as channel:
            stub = lm_service_pb2_grpc.LanguageModelServiceStub(channel)

            async def grpc_caller() -> None:
                nonlocal calls
                while time.perf_counter() < deadline:
                    await stub.Score(request, timeout=30)
                    calls += 1

            await asyncio.gather(*(grpc_caller() for _ in range(callers)))
        return calls

    body = json.dumps({"model": model, "texts": [SCORE_TEXT]}).encode()

    async def json_caller() -> None:
        nonlocal calls
        async with HttpConnection("127.0.0.1", http_port) as connection:
            while time.perf_counter() < deadline:
                status, _ = await connection.post(f"{SERVICE}/Score", body, "application/json")
                assert status == 200, status
                calls += 1

    await asyncio.gather(*(json_caller() for _ in range(callers)))
    return calls


def scoring(
    server: ServerProcess, http_port: int, model: str, callers: int, seconds: float, runs: int
) -> None:
    figures: dict[str, dict[str, list[float]]] = {
        f: {"calls_per_s": [], "cpu": []} for f in ("grpc", "json")
    }

    def calling(run: int, front: str) -> Coroutine[Any, Any, int]:
        return _score_run(server, http_port, front, model, callers, seconds)

    for front, calls, elapsed, cpu in _alternating(server, ("grpc", "json"), runs, calling):
        figures[front]["calls_per_s"].append(calls / elapsed)
        figures[front]["cpu"].append(1e3 * cpu / calls)
    _emit_pair(
        f"http_score_{callers}callers_{model}",
        figures,
        "calls_per_s",
        lower_is_better=False,
        callers=callers,
    )


# -- records ------------------------------------------------------------------------------------


def _alternating(
    server: ServerProcess,
    fronts: tuple[str, str],
    runs: int,
    work: Callable[[int, str], Coroutine[Any, Any, T]],
) -> Iterator[tuple[str, T, float, float]]:
    """`work(run, front)` for the gRPC front, then the HTTP one, run after run (the first run
    a warm-up, not yielded): each run's result, wall seconds and the server's CPU seconds."""
    for run in range(runs + 1):
        for front in fronts:
            cpu, started = server.cpu_seconds(), time.perf_counter()
            result: T = asyncio.run(work(run, front))
            seconds, cpu = time.perf_counter() - started, server.cpu_seconds() - cpu
            if run:
                yield front, result, seconds, cpu


def _emit_pair(
    name: str,
    figures: dict[str, dict[str, list[float]]],
    key: str,
    *,
    lower_is_better: bool,
    **extra: Any,
) -> None:
    """Each front's figures (medians of the runs), CPU ms per unit, and HTTP / gRPC per run."""
    grpc_front, http_front = figures
    for front, values in figures.items():
        for what, runs in values.items():
            unit = {"cpu": "ms CPU per unit", "p50": "ms", "p99": "ms"}.get(what, what)
            emit(record(f"{name}_{front}_{what}", unit, runs, **extra))
    ratios = [
        h / g for h, g in zip(figures[http_front][key], figures[grpc_front][key], strict=True)
    ]
    emit(
        record(
            f"{name}_{http_front}_vs_{grpc_front}_{key}",
            "ratio",
            ratios,
            lower_is_better=lower_is_better,
            **extra,
        )
    )
    cpu = [
        h / g for h, g in zip(figures[http_front]["cpu"], figures[grpc_front]["cpu"], strict=True)
    ]
    emit(record(f"{name}_{http_front}_vs_{grpc_front}_cpu_per_unit", "ratio", cpu, **extra))
    log(
        f"{name}: {http_front}/{grpc_front} {key} {statistics.median(ratios):.2f}x, "
        f"CPU per unit {statistics.median(cpu):.2f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="few, short runs")
    parser.add_argument("--runs", type=int, default=None)
    parser.add_argument("--sessions", type=int, default=32)
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=None)
    parser.add_argument("--keys", type=int, default=40)
    parser.add_argument("--only", choices=["complete", "generate", "score"], default=None)
    args = parser.parse_args()
    if args.quick:
        os.environ[QUICK_ENV] = "1"
    runs = args.runs or (1 if quick() else 3)
    tokens = args.tokens or (16 if quick() else 64)
    lstm, ngram = default_model(DEFAULT_LSTM), default_model(DEFAULT_NGRAM)
    http_port = free_port()
    with ServerProcess(
        linked_repository("http-repo", lstm, ngram), extra_args=("--http-port", str(http_port))
    ) as server:
        if args.only in (None, "complete"):
            autocomplete(server, http_port, args.sessions, args.keys, runs, lstm.name)
        if args.only in (None, "generate"):
            generation(server, http_port, lstm.name, args.streams, tokens, runs)
        if args.only in (None, "score"):
            scoring(server, http_port, ngram.name, 16, 1.0 if quick() else 3.0, runs)


if __name__ == "__main__":
    main()
