"""The plaintext health port (`health_port`): Kubernetes' gRPC probes reach grpc.health.v1
there while the main port speaks TLS with bearer-token auth; nothing else is served on it."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from pki_files import make_pki
from prometheus_client import CollectorRegistry
from serve_process import ServeProcess, clean_env, serve_command, wait_until

from lmserve.server.front.process.app import BackgroundServer, start_background_server
from lmserve.server.settings import load_settings
from lmserve.v1 import lm_service_pb2 as pb
from lmserve.v1 import lm_service_pb2_grpc

TOKEN = "health-port-token-9e1f"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


def free_port() -> int:
    """A port free right now on 127.0.0.1 (port 0 means "off" for health_port)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _check(channel: grpc.Channel, service: str = "") -> int:
    stub = health_pb2_grpc.HealthStub(channel)
    return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def secured(model_repository: Path, pki: Path) -> Iterator[BackgroundServer]:
    """TLS and auth on the main port, whose health service needs the token too."""
    settings = {
        "model_repository": model_repository,
        "host": "127.0.0.1",
        "port": 0,
        "metrics_enabled": False,
        "tls_cert_file": pki / "server.pem",
        "tls_key_file": pki / "server.key",
        "auth_token": TOKEN,
        "auth_health_open": False,
        "health_host": "127.0.0.1",
        "health_port": free_port(),
    }
    with start_background_server(load_settings(settings), registry=CollectorRegistry()) as server:
        yield server


def test_health_port_answers_plaintext_without_a_token(
    secured: BackgroundServer, pki: Path
) -> None:
    credentials = grpc.ssl_channel_credentials((pki / "ca.pem").read_bytes())
    with grpc.secure_channel(f"localhost:{secured.port}", credentials) as main:
        with pytest.raises(grpc.RpcError) as refused:  # the main port wants the token
            _check(main)
        assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED
    with grpc.insecure_channel(f"127.0.0.1:{secured.health_port}") as channel:
        assert _check(channel) == SERVING
        assert _check(channel, "lmserve.v1.LanguageModelService/test") == SERVING
        listed = health_pb2_grpc.HealthStub(channel).List(health_pb2.HealthListRequest(), timeout=5)
        assert listed.statuses["lmserve.v1.LanguageModelService"].status == SERVING


def test_health_port_serves_no_model_rpcs(secured: BackgroundServer) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{secured.health_port}") as channel:
        stub = lm_service_pb2_grpc.LanguageModelServiceStub(channel)
        metadata = (("authorization", f"Bearer {TOKEN}"),)
        with pytest.raises(grpc.RpcError) as score:  # not even with the token
            stub.Score(pb.ScoreRequest(model="test", texts=["a little"]), metadata=metadata)
        assert score.value.code() is grpc.StatusCode.UNIMPLEMENTED
        reflect = channel.stream_stream(
            "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
            request_serializer=None,
            response_deserializer=None,
        )
        with pytest.raises(grpc.RpcError) as reflection:
            list(reflect(iter([b""]), timeout=5))
        assert reflection.value.code() is grpc.StatusCode.UNIMPLEMENTED


def test_sigterm_turns_the_health_port_not_serving_during_the_notice(
    model_repository: Path, pki: Path
) -> None:
    notice = 4.0
    flags = ("--tls-cert-file", str(pki / "server.pem"), "--tls-key-file", str(pki / "server.key"))
    flags += ("--health-port", str(free_port()), "--shutdown-notice-seconds", str(notice))
    with ServeProcess(model_repository, *flags) as server:
        assert server.health_port
        with grpc.insecure_channel(f"127.0.0.1:{server.health_port}") as channel:
            assert _check(channel) == SERVING
            signalled = time.monotonic()
            server.process.send_signal(signal.SIGTERM)
            assert wait_until(lambda: _check(channel) == NOT_SERVING, timeout=notice / 2)
            assert time.monotonic() - signalled < notice, "too slow to check within the notice"
        assert server.wait(timeout=notice + 15) == 0
    with socket.socket() as probe:  # stopped with the main server: the port is free again
        probe.bind(("127.0.0.1", server.health_port))


def test_a_taken_health_port_exits_with_one_clear_line(model_repository: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = subprocess.run(
            serve_command(model_repository, "--health-port", str(port)),
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert started.returncode == 1
    expected = f"lmserve serve: cannot bind 127.0.0.1:{port}: address in use"
    assert started.stderr.strip().splitlines() == [expected]
