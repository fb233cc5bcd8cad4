"""`fronts: 2`: two front processes on one port (SO_REUSEPORT), each connected to every engine
worker. Connections spread over both; both answer Score (= KenLM-compatible scores equal on
both), Generate (seeded: the same tokens from either front) and Complete sessions; a front
killed with SIGKILL is restarted and serves again; stopping the server stops both."""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Iterator

import grpc
import pytest
from neural_folders import VOCAB, tiny_model, write_onnx_folder
from served import ServerFactory

from lmserve.server.front.api.interceptors import FRONT_KEY
from lmserve.server.front.process.app import BackgroundServer
from lmserve.v1 import lm_service_pb2 as pb
from lmserve.v1 import lm_service_pb2_grpc

TEXTS = ["the cat sat on the mat", "a dog ran to the big house"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server(
    serve: ServerFactory, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BackgroundServer]:
    root = tmp_path_factory.mktemp("fronts")
    write_onnx_folder(tiny_model("gru", seed=3), VOCAB, root / "gru", name="gru")
    # Its own (two front processes on one port), stopped when the module ends.
    with serve.private(root, port=_free_port(), http_enabled=False, fronts=2) as running:
        yield running


def _front_of(call: grpc.Call) -> str:
    return dict(call.trailing_metadata() or ())[FRONT_KEY]


def _score_on_new_connection(address: str) -> tuple[str, list[float]]:
    # A channel of its own: a new TCP connection, which the kernel gives one of the fronts.
    options = [("grpc.use_local_subchannel_pool", 1)]
    with grpc.insecure_channel(address, options=options) as channel:
        stub = lm_service_pb2_grpc.LanguageModelServiceStub(channel)
        response, call = stub.Score.with_call(pb.ScoreRequest(model="gru", texts=TEXTS))
        return _front_of(call), [r.log_prob for r in response.results]


def _generate(address: str, seed: int) -> tuple[str, list[int]]:
    options = [("grpc.use_local_subchannel_pool", 1)]
    with grpc.insecure_channel(address, options=options) as channel:
        stub = lm_service_pb2_grpc.LanguageModelServiceStub(channel)
        request = pb.GenerateRequest(
            model="gru",
            prompt="the cat",
            sampling=pb.SamplingParams(seed=seed),
            stopping=pb.StoppingCriteria(max_new_tokens=8, ignore_eos=True),
        )
        call = stub.Generate(request)
        ids = [t.token_id for message in call for t in message.tokens]
        return _front_of(call), ids


def test_connections_spread_over_both_fronts_with_equal_answers(server: BackgroundServer) -> None:
    seen: dict[str, list[float]] = {}
    for _ in range(40):
        front, totals = _score_on_new_connection(server.address)
        seen.setdefault(front, totals)
        assert totals == pytest.approx(seen[front], abs=1e-6)
        if len(seen) == 2:
            break
    assert set(seen) == {"0", "1"}, "40 connections all went to one front"
    assert seen["0"] == pytest.approx(seen["1"], abs=1e-6)


def test_seeded_generation_is_the_same_from_either_front(server: BackgroundServer) -> None:
    by_front: dict[str, list[int]] = {}
    for _ in range(40):
        front, ids = _generate(server.address, seed=5)
        assert len(ids) == 8
        by_front.setdefault(front, ids)
        assert by_front[front] == ids
        if len(by_front) == 2:
            break
    assert set(by_front) == {"0", "1"}
    assert by_front["0"] == by_front["1"]


def test_a_killed_front_is_restarted_and_serves_again(server: BackgroundServer) -> None:
    fronts = server.running.fronts
    assert fronts is not None
    [pid] = fronts.pids()
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        pids = fronts.pids()
        if pids and pids != [pid]:
            break
        time.sleep(0.2)
    assert fronts.pids() and fronts.pids() != [pid]
    served = set()
    for _ in range(60):
        try:
            front, _ = _score_on_new_connection(server.address)
        except grpc.RpcError:  # a connection the dead front had accepted
            continue
        served.add(front)
        if served == {"0", "1"}:
            break
        time.sleep(0.05)
    assert served == {"0", "1"}
