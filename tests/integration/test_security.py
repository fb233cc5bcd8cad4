"""TLS, mTLS and bearer-token auth against real servers on loopback, with certificates made here
by `openssl` for a test CA, the server (localhost / 127.0.0.1) and a client."""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from pki_files import make_pki
from prometheus_client import CollectorRegistry

from lmserve.client import AsyncLmServeClient, LmServeClient
from lmserve.client.errors import LmServeClientError
from lmserve.server.front.process.app import BackgroundServer, start_background_server
from lmserve.server.settings import load_settings

TOKEN = "s3cret-token-4c1d"
WRONG = "wrong-token-77aa"
pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _server(model_repository: Path, **settings: Any) -> BackgroundServer:
    base = {"model_repository": model_repository, "host": "127.0.0.1", "port": 0}
    base |= {"metrics_enabled": False}
    return start_background_server(load_settings(base | settings), registry=CollectorRegistry())


def _score(client: LmServeClient) -> int:
    return client.score("test", ["looking on a little"], timeout=10)[0].token_count


@pytest.fixture(scope="module")
def tls_server(model_repository: Path, pki: Path) -> Iterator[BackgroundServer]:
    with _server(
        model_repository, tls_cert_file=pki / "server.pem", tls_key_file=pki / "server.key"
    ) as server:
        yield server


def test_tls_serves_clients_that_trust_the_ca(tls_server: BackgroundServer, pki: Path) -> None:
    for host in ("localhost", "127.0.0.1"):  # both names are in the certificate
        with LmServeClient(f"{host}:{tls_server.port}", tls_ca_file=pki / "ca.pem") as client:
            assert _score(client) == 5


def test_tls_refuses_plaintext_and_untrusted_servers(
    tls_server: BackgroundServer, pki: Path
) -> None:
    with LmServeClient(tls_server.address) as plaintext, pytest.raises(LmServeClientError):
        _score(plaintext)
    target = f"localhost:{tls_server.port}"
    with LmServeClient(target, tls_ca_file=pki / "other-ca.pem") as wrong_ca:
        with pytest.raises(LmServeClientError):
            _score(wrong_ca)


def test_mtls_requires_a_client_certificate_from_the_ca(model_repository: Path, pki: Path) -> None:
    with _server(
        model_repository,
        tls_cert_file=pki / "server.pem",
        tls_key_file=pki / "server.key",
        tls_client_ca_file=pki / "ca.pem",
    ) as server:
        target = f"localhost:{server.port}"
        with LmServeClient(target, tls_ca_file=pki / "ca.pem") as anonymous:
            with pytest.raises(LmServeClientError):
                _score(anonymous)
        stranger = {"tls_cert_file": pki / "stranger.pem", "tls_key_file": pki / "stranger.key"}
        with LmServeClient(target, tls_ca_file=pki / "ca.pem", **stranger) as client:
            with pytest.raises(LmServeClientError):
                _score(client)
        known = {"tls_cert_file": pki / "client.pem", "tls_key_file": pki / "client.key"}
        with LmServeClient(target, tls_ca_file=pki / "ca.pem", **known) as client:
            assert _score(client) == 5


@pytest.fixture(scope="module")
def token_server(
    model_repository: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BackgroundServer]:
    token_file = tmp_path_factory.mktemp("secrets") / "token"
    token_file.write_text(TOKEN + "\n")
    with _server(model_repository, auth_token_file=token_file) as server:
        yield server


def test_token_auth_refuses_missing_and_wrong_tokens(
    token_server: BackgroundServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    messages = []
    for token in (None, WRONG):
        with LmServeClient(token_server.address, token=token) as client:
            for call in (
                lambda: _score(client),
                lambda: client.list_models(timeout=10),
                lambda: list(client.generate("test", "a", max_new_tokens=3, timeout=10)),
                lambda: list(client.score_stream("test", [["a little"]], timeout=10)),
            ):
                with pytest.raises(LmServeClientError) as err:
                    call()
                assert err.value.code == grpc.StatusCode.UNAUTHENTICATED
                messages.append(err.value.message)
    assert "missing authorization" in messages[0]
    assert "invalid bearer token" in messages[-1]
    logged = [r.getMessage() for r in caplog.records]
    assert any("refused" in line for line in logged)  # the server did log the refusals
    text = "\n".join(messages + logged)
    assert TOKEN not in text and WRONG not in text


def test_the_right_token_serves_every_kind_of_call(token_server: BackgroundServer) -> None:
    with LmServeClient(token_server.address, token=TOKEN) as client:
        assert _score(client) == 5
        assert [s.token_count for [s] in client.score_stream("test", [["a little"]])] == [3]
        events = list(client.generate("test", "a", max_new_tokens=3, seed=1, timeout=10))
        assert events[-1].reason in ("length", "end_of_sentence")  # type: ignore[union-attr]

    async def with_async_client() -> int:
        async with AsyncLmServeClient(token_server.address, token=TOKEN) as client:
            [score] = await client.score("test", ["looking on a little"])
            return score.token_count

    assert asyncio.run(with_async_client()) == 5


def test_health_is_open_without_a_token_unless_closed(
    token_server: BackgroundServer, model_repository: Path
) -> None:
    with LmServeClient(token_server.address) as client:
        assert client.health().status == "SERVING"
    with _server(model_repository, auth_token=TOKEN, auth_health_open=False) as closed:
        with LmServeClient(closed.address) as client, pytest.raises(LmServeClientError) as err:
            client.health()
        assert err.value.code == grpc.StatusCode.UNAUTHENTICATED
        with LmServeClient(closed.address, token=TOKEN) as client:
            assert client.health().status == "SERVING"


def test_token_over_tls_travels_as_call_credentials(model_repository: Path, pki: Path) -> None:
    with _server(
        model_repository,
        tls_cert_file=pki / "server.pem",
        tls_key_file=pki / "server.key",
        auth_token=TOKEN,
    ) as server:
        target = f"localhost:{server.port}"
        with LmServeClient(target, tls_ca_file=pki / "ca.pem", token=TOKEN) as client:
            assert _score(client) == 5
        with LmServeClient(target, tls_ca_file=pki / "ca.pem", token=WRONG) as client:
            with pytest.raises(LmServeClientError) as err:
                _score(client)
            assert err.value.code == grpc.StatusCode.UNAUTHENTICATED


def test_half_a_security_configuration_is_refused(pki: Path) -> None:
    with pytest.raises(ValueError, match="together"):
        load_settings({"tls_cert_file": pki / "server.pem"})
    with pytest.raises(ValueError, match="needs tls_cert_file"):
        load_settings({"tls_client_ca_file": pki / "ca.pem"})
    with pytest.raises(ValueError, match="not both"):
        load_settings({"auth_token": TOKEN, "auth_token_file": pki / "ca.pem"})
