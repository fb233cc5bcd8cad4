"""A Generate client that stops reading pauses its sequences; reading again resumes them.

Real server on loopback (a hand-made bigram and a tiny ONNX LSTM), raw gRPC clients. The client
channels turn off BDP probing so the HTTP/2 window stays at its initial 64 KiB: the server's
writes then block after a bounded number of tokens, as they do for any client that stops
reading once its window is full.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from served import ServerFactory

from lmserve.server.front.process.app import BackgroundServer
from lmserve.server.manifest import ModelManifest, write_manifest
from lmserve.v1 import lm_service_pb2 as pb
from lmserve.v1 import lm_service_pb2_grpc

BIGRAM_ARPA = """\\data\\
ngram 1=6
ngram 2=6

\\1-grams:
-1.0\t<unk>\t0
-99\t<s>\t-0.3
-0.9\t</s>\t0
-0.5\tthe\t-0.2
-1.1\tcat\t-0.2
-1.3\tsat\t-0.2

\\2-grams:
-0.2\t<s> the
-0.3\tthe cat
-0.1\tcat sat
-0.2\tsat the
-1.5\tcat </s>
-1.0\tthe </s>

\\end\\
"""
MAX_UNREAD = 32
CHANNEL_OPTIONS = [("grpc.http2.bdp_probe", 0)]


@pytest.fixture(scope="module")
def server(
    serve: ServerFactory, tmp_path_factory: pytest.TempPathFactory, tiny_lstm: Path
) -> BackgroundServer:
    root = tmp_path_factory.mktemp("backpressure-models")
    (root / "lstm").symlink_to(tiny_lstm, target_is_directory=True)
    (root / "bigram").mkdir()
    (root / "bigram" / "model.arpa").write_text(BIGRAM_ARPA)
    write_manifest(
        root / "bigram",
        ModelManifest.model_validate(
            {
                "name": "bigram",
                "kind": "ngram",
                "format": "arpa",
                "files": {"arpa": {"path": "model.arpa"}},
            }
        ),
    )
    return serve(
        root,
        # In-process engine: these tests watch the scheduler itself (its slots, steps and
        # parked streams); test_engine_workers checks the same calls through a worker.
        engine_workers=False,
        max_active_sequences=8,
        max_new_tokens=1_000_000,
        max_unread_events=MAX_UNREAD,
    )


@pytest.fixture
def stub(server: BackgroundServer) -> Iterator[lm_service_pb2_grpc.LanguageModelServiceStub]:
    with grpc.insecure_channel(server.address, options=CHANNEL_OPTIONS) as channel:
        yield lm_service_pb2_grpc.LanguageModelServiceStub(channel)


def _scheduler(server: BackgroundServer, model: str):  # type: ignore[no-untyped-def]
    return server.running.models.ready(model).engine.scheduler  # type: ignore[attr-defined]


def _request(model: str, tokens: int, seed: int = 7) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        model=model,
        sampling=pb.SamplingParams(temperature=1.0, seed=seed),
        logprobs=True,
        top_logprobs=5,  # larger messages: the 64 KiB window holds a few hundred tokens
        stopping=pb.StoppingCriteria(max_new_tokens=tokens, ignore_eos=True),
    )


def _tokens(responses: Iterator[pb.GenerateResponse]) -> list[tuple[int, int]]:
    """(index, token id) of every token, in the order received."""
    return [(t.index, t.token_id) for r in responses for t in r.tokens]


def _wait(condition, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _parked_stream(server: BackgroundServer, model: str):  # type: ignore[no-untyped-def]
    """The one parked stream, once its window is full: parked, and no more events for 0.2 s
    (it parks and resumes while the handler writes into the window before that)."""
    scheduler = _scheduler(server, model)
    _wait(lambda: bool(scheduler.parked))
    (stream,) = scheduler.parked
    handed = -1
    while handed != stream.handed or stream not in scheduler.parked:
        handed = stream.handed
        time.sleep(0.2)
    return scheduler, stream


@pytest.mark.parametrize(("model", "tokens"), [("bigram", 2_000), ("lstm", 2_000)])
def test_a_slow_reader_pauses_and_gets_every_token_in_order(
    server: BackgroundServer,
    stub: lm_service_pb2_grpc.LanguageModelServiceStub,
    model: str,
    tokens: int,
) -> None:
    expected = _tokens(stub.Generate(_request(model, tokens), timeout=30))  # read at once
    assert [i for i, _ in expected] == list(range(tokens))

    call = stub.Generate(_request(model, tokens), timeout=30)  # opened, not read
    scheduler, stream = _parked_stream(server, model)
    handed = stream.handed
    assert handed < tokens  # stopped well before the end
    assert scheduler.parks >= 1
    parked = server.running.metrics.registry.get_sample_value(
        "lmserve_parked_sequences", {"model": model}
    )
    assert parked == 1
    time.sleep(0.5)
    assert stream.handed == handed  # nothing more generated while parked
    assert stream in scheduler.parked

    # Other streams of the same model keep going meanwhile.
    other = _tokens(stub.Generate(_request(model, 300, seed=1), timeout=10))
    assert len(other) == 300
    assert stream.handed == handed

    got = _tokens(call)  # reads again: it resumes (and parks and resumes as the window fills)
    assert got == expected  # every token, in order, the same as without a pause
    assert not scheduler.parked and not scheduler.active
    parked = server.running.metrics.registry.get_sample_value(
        "lmserve_parked_sequences", {"model": model}
    )
    assert parked == 0


def test_a_parked_stream_keeps_its_deadline_and_frees_its_slot(
    server: BackgroundServer, stub: lm_service_pb2_grpc.LanguageModelServiceStub
) -> None:
    call = stub.Generate(_request("bigram", 500_000), timeout=1.0)
    scheduler, _ = _parked_stream(server, "bigram")
    _wait(lambda: not scheduler.parked)
    with pytest.raises(grpc.RpcError) as failure:
        _tokens(call)
    assert failure.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert not scheduler.active


def test_a_parked_stream_holds_its_slot(
    server: BackgroundServer, stub: lm_service_pb2_grpc.LanguageModelServiceStub
) -> None:
    scheduler = _scheduler(server, "bigram")
    calls = [stub.Generate(_request("bigram", 500_000, seed=s), timeout=20) for s in range(8)]
    try:
        _wait(lambda: len(scheduler.parked) == 8)
        assert not scheduler.active
        late = stub.Generate(_request("bigram", 5), timeout=0.5)  # every slot is held
        with pytest.raises(grpc.RpcError) as failure:
            _tokens(late)
        assert failure.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    finally:
        for call in calls:
            call.cancel()
    _wait(lambda: not scheduler.parked)  # the cancelled parked streams gave their slots back
    assert len(_tokens(stub.Generate(_request("bigram", 5), timeout=5))) == 5
