"""ScoreStream against the real server of `conftest.py`: the same answers as unary Score, in
request order, and a bad request ends the stream naming its index after the earlier answers."""

from __future__ import annotations

import asyncio
import queue
import time
from collections.abc import AsyncIterator, Iterator

import grpc
import pytest
from integration_data import MAX_TEXTS
from metrics_scrape import scrape

from lmserve.client import (
    AsyncLmServeClient,
    InvalidArgumentError,
    LmServeClient,
    ModelNotFoundError,
    TextScore,
)
from lmserve.server.front.process.app import BackgroundServer
from lmserve.v1 import lm_service_pb2 as pb
from lmserve.v1 import lm_service_pb2_grpc

Stub = lm_service_pb2_grpc.LanguageModelServiceStub
# Batches of different sizes and contents (an OOV, an empty text), so a reordering shows.
BATCHES = [
    ["looking on a little more loin", "in the zebra"],
    [""],
    ["higher . . ,", "also call for", "a little", "looking on"],
    ["more loin"],
]


@pytest.fixture()
def client(server: BackgroundServer) -> Iterator[LmServeClient]:
    with LmServeClient(server.address, timeout=10) as c:
        yield c


def test_stream_equals_unary_score_in_order(client: LmServeClient) -> None:
    for return_tokens in (False, True):
        unary = [client.score("test", b, return_tokens=return_tokens) for b in BATCHES]
        streamed = list(client.score_stream("test", BATCHES, return_tokens=return_tokens))
        assert streamed == unary
    assert [len(s) for s in streamed] == [len(b) for b in BATCHES]
    assert streamed[1][0].token_count == 1  # the empty text: just </s>


def test_stream_takes_token_lists_and_options(client: LmServeClient) -> None:
    lists = [[t.split() for t in b] for b in BATCHES]
    streamed = list(client.score_stream("test", lists, bos=False, eos=False))
    assert streamed == [client.score("test", b, bos=False, eos=False) for b in BATCHES]


def test_each_request_names_its_own_model(stub: Stub) -> None:
    requests = [
        pb.ScoreRequest(model="test", texts=BATCHES[0]),
        pb.ScoreRequest(model="kjv3", texts=["In the beginning God created"]),
        pb.ScoreRequest(model="test", texts=BATCHES[2]),
    ]
    streamed = list(stub.ScoreStream(iter(requests), timeout=10))
    assert streamed == [stub.Score(r, timeout=10) for r in requests]
    assert [r.model for r in streamed] == ["test", "kjv3", "test"]


def test_lockstep_client_gets_each_answer_before_sending_the_next(stub: Stub) -> None:
    # The server answers each request as it comes: it never waits for more to read ahead.
    outbox: queue.Queue[pb.ScoreRequest | None] = queue.Queue()
    outbox.put(pb.ScoreRequest(model="test", texts=BATCHES[0]))
    call = stub.ScoreStream(iter(outbox.get, None), timeout=10)
    answers = []
    for response in call:
        answers.append(response)
        outbox.put(
            pb.ScoreRequest(model="test", texts=BATCHES[len(answers)]) if len(answers) < 3 else None
        )
    assert [len(a.results) for a in answers] == [len(b) for b in BATCHES[:3]]


def test_leaving_early_ends_the_stream_on_the_server(
    server: BackgroundServer, client: LmServeClient
) -> None:
    endless = iter(lambda: BATCHES[0], None)  # a stream that never ends by itself
    for i, scores in enumerate(client.score_stream("test", endless)):
        assert len(scores) == 2
        if i == 5:
            break
    assert client.score("test", ["a"])  # the server still answers; the stream was cancelled
    deadline = time.monotonic() + 5
    while _inflight(server, "ScoreStream") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _inflight(server, "ScoreStream") == 0


def test_bad_batch_mid_stream_names_its_index(client: LmServeClient) -> None:
    batches = [BATCHES[0], BATCHES[2], ["a"] * (MAX_TEXTS + 1), BATCHES[3]]
    received: list[list[TextScore]] = []
    with pytest.raises(InvalidArgumentError) as info:
        for scores in client.score_stream("test", batches):
            received.append(scores)
    assert info.value.code is grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.message.startswith("requests[2].texts: ")
    assert received == [client.score("test", b) for b in batches[:2]]


def test_bad_token_names_request_and_field(stub: Stub) -> None:
    requests = [
        pb.ScoreRequest(model="test", texts=["a little"]),
        pb.ScoreRequest(model="test", token_lists=[pb.TokenList(tokens=["a"])] * 2),
        pb.ScoreRequest(
            model="test", token_lists=[pb.TokenList(tokens=["a"]), pb.TokenList(tokens=["b", ""])]
        ),
    ]
    call = stub.ScoreStream(iter(requests), timeout=10)
    received = []
    with pytest.raises(grpc.RpcError) as info:
        for response in call:
            received.append(response)
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == "requests[2].token_lists[1].tokens[1]: is an empty token"
    assert len(received) == 2


def test_unknown_model_is_not_found(client: LmServeClient, stub: Stub) -> None:
    with pytest.raises(ModelNotFoundError) as info:
        list(client.score_stream("no-such-model", BATCHES))
    assert info.value.message.startswith("requests[0]: model 'no-such-model' not found")
    requests = [
        pb.ScoreRequest(model="test", texts=["a"]),
        pb.ScoreRequest(model="nope", texts=["a"]),
    ]
    with pytest.raises(grpc.RpcError) as raw:
        list(stub.ScoreStream(iter(requests), timeout=10))
    assert raw.value.code() is grpc.StatusCode.NOT_FOUND
    assert raw.value.details().startswith("requests[1]: model 'nope' not found")


def test_failing_batches_iterator_raises_its_own_error(client: LmServeClient) -> None:
    def batches() -> Iterator[list[str]]:
        yield BATCHES[0]
        raise RuntimeError("the corpus file vanished")

    with pytest.raises(RuntimeError, match="vanished"):
        list(client.score_stream("test", batches()))


def test_async_client_stream(server: BackgroundServer, client: LmServeClient) -> None:
    async def ask() -> tuple[list[list[TextScore]], list[list[TextScore]], str]:
        async with AsyncLmServeClient(server.address, timeout=10) as aclient:

            async def batches() -> AsyncIterator[list[str]]:
                for b in BATCHES:
                    yield b

            from_async = [s async for s in aclient.score_stream("test", batches())]
            received = []
            with pytest.raises(InvalidArgumentError) as info:
                async for s in aclient.score_stream("test", [BATCHES[0], []]):
                    received.append(s)
            return from_async, received, info.value.message

    from_async, received, message = asyncio.run(ask())
    assert from_async == [client.score("test", b) for b in BATCHES]
    assert received == [client.score("test", BATCHES[0])]
    assert message.startswith("requests[1].texts: ")


def _inflight(server: BackgroundServer, method: str) -> float:
    return scrape(server)[("lmserve_inflight_requests", frozenset({("method", method)}))]


def test_stream_is_measured(server: BackgroundServer, client: LmServeClient) -> None:
    def delta(name: str, **labels: str) -> float:
        key = (name, frozenset(labels.items()))
        return after.get(key, 0.0) - before.get(key, 0.0)

    before = scrape(server)
    list(client.score_stream("test", BATCHES))
    with pytest.raises(InvalidArgumentError):
        list(client.score_stream("test", [BATCHES[0], []]))
    after = scrape(server)
    total = "lmserve_requests_total"
    assert delta(total, method="ScoreStream", model="test", code="OK", front="grpc") == 1
    assert (
        delta(total, method="ScoreStream", model="test", code="INVALID_ARGUMENT", front="grpc") == 1
    )
    assert delta("lmserve_scored_texts_total", model="test") == sum(map(len, BATCHES)) + 2
    assert after[("lmserve_inflight_requests", frozenset({("method", "ScoreStream")}))] == 0
