"""Real servers for the tests, all started one way: the session's `serve` fixture.

    server = serve(repository, max_active_sequences=4)            # shared, started once
    with serve.private(repository, auth_token="t") as server: ...  # its own, stopped after

Each is `start_background_server` on `repository` with `settings` over `DEFAULTS`: a real port on
loopback, real engine worker processes (unless the settings say `engine_workers: False`), its own
Prometheus registry. `serve(...)` keeps the server for the session and hands the same one to
every caller with the same repository and settings, so modules that serve the same models the
same way share one; a test that stops, reloads, kills or otherwise changes its server uses
`serve.private(...)`, a context manager. `ServeProcess` (integration/serve_process.py) is the
other way in, for tests of the `lmserve serve` process itself.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from lmserve.server.front.process.app import BackgroundServer, start_background_server
from lmserve.server.settings import load_settings

# What every test server has unless its caller says otherwise: loopback, free ports, and no
# metrics listener (a test that reads /metrics asks for one on port 0).
DEFAULTS: Mapping[str, object] = {
    "host": "127.0.0.1",
    "port": 0,
    "metrics_enabled": False,
}

Key = tuple[str, tuple[tuple[str, str], ...]]


def _key(repository: Path, settings: Mapping[str, object]) -> Key:
    return str(Path(repository).resolve()), tuple(sorted((k, repr(v)) for k, v in settings.items()))


class ServerFactory:
    def __init__(self) -> None:
        self._shared: dict[Key, BackgroundServer] = {}

    def start(self, repository: Path, settings: Mapping[str, object]) -> BackgroundServer:
        given = {**DEFAULTS, "model_repository": repository, **settings}
        return start_background_server(load_settings(given), registry=CollectorRegistry())

    def __call__(self, repository: Path, **settings: object) -> BackgroundServer:
        """The session's server on `repository` with `settings`, started on first use."""
        key = _key(repository, settings)
        if key not in self._shared:
            self._shared[key] = self.start(repository, settings)
        return self._shared[key]

    def private(self, repository: Path, **settings: object) -> BackgroundServer:
        """A server of the caller's own (a context manager: stopped when the block ends)."""
        return self.start(repository, settings)

    def close(self) -> None:
        servers, self._shared = list(self._shared.values()), {}
        for server in reversed(servers):
            server.stop(grace=1.0)


@pytest.fixture(scope="session")
def serve() -> Iterator[ServerFactory]:
    factory = ServerFactory()
    yield factory
    factory.close()
