"""The HTTP port: uvicorn serving `api.http.app` on the server's own event loop, so HTTP calls
reach the same served models (and engine workers) as gRPC calls, with nothing in between.

    front = await HttpFront.start(app, settings)     # bound; front.port is the port
    await front.stop(grace)                           # refuse new, let in-flight ones finish

uvicorn runs without its signal handlers (the server has its own: `app.serve`) and without its
logging setup (lmserve's: `logging_setup`). TLS uses the gRPC port's certificate files, mTLS
included.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl

import uvicorn
from uvicorn.config import LOGGING_CONFIG  # noqa: F401  (uvicorn's loggers exist before ours)

from lmserve.server.settings import Settings

log = logging.getLogger(__name__)


def _listening_socket(host: str, port: int) -> socket.socket:
    """A bound, listening socket for `host:port` (IPv6 `[::]` included); OSError names it."""
    bare = host.strip("[]")
    family = socket.AF_INET6 if ":" in bare else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        # Accepted connections inherit it. asyncio sets it itself only on the sockets of a
        # server it binds; without it every keep-alive request after the first waited for
        # the client's delayed ACK (44 ms a call, measured).
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((bare, port))
        sock.listen(2048)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot bind {host}:{port} (HTTP): {exc.strerror or exc}") from None
    return sock


class HttpFront:
    """A started uvicorn server on one socket; `port` is the bound port."""

    def __init__(self, server: uvicorn.Server, sock: socket.socket) -> None:
        self._server = server
        self._socket = sock
        self.port: int = sock.getsockname()[1]
        self._ticking: asyncio.Task[None] | None = None

    @classmethod
    async def start(cls, app: object, settings: Settings) -> HttpFront:
        sock = _listening_socket(settings.host, settings.http_port)
        config = uvicorn.Config(
            app,  # type: ignore[arg-type]
            lifespan="off",
            log_config=None,
            access_log=False,  # the access log is lmserve's own (`observed_call`)
            server_header=False,
            ssl_certfile=settings.tls_cert_file,
            ssl_keyfile=settings.tls_key_file,
            ssl_ca_certs=settings.tls_client_ca_file,
            ssl_cert_reqs=ssl.CERT_REQUIRED if settings.tls_client_ca_file else ssl.CERT_NONE,
            ws_max_size=settings.max_message_bytes,
            # gRPC's `maximum_concurrent_rpcs`, as uvicorn counts it (connections and calls
            # beyond it are answered 503 at once).
            limit_concurrency=settings.max_concurrent_rpcs,
            timeout_graceful_shutdown=int(settings.grace_period_seconds),
        )
        config.load()
        server = uvicorn.Server(config)
        server.lifespan = config.lifespan_class(config)
        try:
            await server.startup(sockets=[sock])
        except BaseException:
            sock.close()
            raise
        front = cls(server, sock)
        # Its once-a-second tick keeps the Date header current and notices `should_exit`.
        front._ticking = asyncio.create_task(server.main_loop())
        return front

    @property
    def scheme(self) -> str:
        return "https" if self._server.config.ssl is not None else "http"

    async def stop(self, grace: float | None) -> None:
        """Stops accepting; open requests get `grace` seconds (None: as long as they take)."""
        self._server.should_exit = True
        self._server.config.timeout_graceful_shutdown = None if grace is None else int(grace)
        if grace is not None and grace <= 0:
            self._server.force_exit = True
        if self._ticking is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticking
        await self._server.shutdown(sockets=[self._socket])

    def hurry(self) -> None:
        """Ends a stop in progress now: open requests are cancelled."""
        self._server.force_exit = True
