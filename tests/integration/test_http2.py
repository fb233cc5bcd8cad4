"""HTTP/2 on the HTTP port (`http_server: hypercorn`): Connect over h2c, and over TLS where ALPN
picks h2, with a real client (Connect-ES in Node, `httpVersion: "2"`): a Score, and a Complete
session driven full-duplex (each keystroke sent only after the answer to the previous one
arrived, which HTTP/1.1's half-duplex Connect streams cannot do). The default server (uvicorn)
speaks HTTP/1.1 only: the same client is refused."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from node_clients import node_client, run_node
from pki_files import make_pki
from prometheus_client import CollectorRegistry

from lmserve.server.front.process.app import BackgroundServer, start_background_server
from lmserve.server.settings import load_settings


def _server(model_repository: Path, **settings: Any) -> BackgroundServer:
    base = {
        "model_repository": model_repository,
        "host": "127.0.0.1",
        "port": 0,
        "http_port": 0,
        "metrics_enabled": False,
        "http_server": "hypercorn",
        "complete_cache_weight": 0.0,
    }
    return start_background_server(
        load_settings({**base, **settings}), registry=CollectorRegistry()
    )


@pytest.fixture(scope="module")
def script() -> Path:
    return node_client("connect_h2_call.mjs")


@pytest.fixture(scope="module")
def h2c(model_repository: Path) -> Iterator[BackgroundServer]:
    with _server(model_repository) as server:
        yield server


def _check(answer: dict[str, Any]) -> None:
    assert answer["score"][1] == 4 and answer["score"][0] < 0  # "and god said" + </s>
    first, second = answer["answers"]
    assert len(first) == 3 and len(second) >= 1
    assert all(word.startswith(first[0][0]) for word in second)  # the second keystroke's prefix


def test_connect_over_h2c_runs_a_full_duplex_session(h2c: BackgroundServer, script: Path) -> None:
    _check(run_node(script, f"http://127.0.0.1:{h2c.http_port}", "kjv3"))


def test_connect_over_tls_negotiates_h2(
    model_repository: Path, tmp_path: Path, script: Path
) -> None:
    pki = make_pki(tmp_path)
    tls = {"tls_cert_file": pki / "server.pem", "tls_key_file": pki / "server.key"}
    with _server(model_repository, **tls) as server:
        env = {"NODE_EXTRA_CA_CERTS": str(pki / "ca.pem")}
        _check(run_node(script, f"https://localhost:{server.http_port}", "kjv3", env=env))


def test_the_default_server_speaks_http1_only(model_repository: Path, script: Path) -> None:
    import subprocess

    with _server(model_repository, http_server="uvicorn") as server:
        run = subprocess.run(
            ["node", str(script), f"http://127.0.0.1:{server.http_port}", "kjv3"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert run.returncode != 0
    # Refused at the HTTP/2 layer, not a script or model error.
    assert "h2StreamError" in run.stderr and "Protocol error" in run.stderr, run.stderr[-800:]
