"""The HTTP port: uvicorn (HTTP/1.1, the default) or hypercorn (HTTP/1.1 and HTTP/2: h2c and
TLS with ALPN, so Connect's bidirectional streams run full-duplex) serving `api.http.app` on the
server's own event loop, so HTTP calls reach the same served models (and engine workers) as gRPC
calls, with nothing in between (`http_server` picks one).

    front = await start_http_server(app, settings)   # bound; front.port is the port
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


class HypercornFront:
    """A started hypercorn server on one socket: HTTP/1.1 and HTTP/2 (h2c by prior knowledge or
    upgrade; with TLS, negotiated by ALPN). The same interface as `HttpFront`."""

    def __init__(self, task: asyncio.Task[None], sock: socket.socket, tls: bool) -> None:
        self._task = task
        self._stop = asyncio.Event()
        self.port: int = sock.getsockname()[1]
        self._tls = tls
        self._config: object = None

    @classmethod
    async def start(cls, app: object, settings: Settings) -> HypercornFront:
        from hypercorn.app_wrappers import ASGIWrapper
        from hypercorn.asyncio.run import worker_serve
        from hypercorn.config import Config, Sockets

        sock = _listening_socket(settings.host, settings.http_port)
        config = Config()
        config.accesslog = None
        config.errorlog = logging.getLogger("hypercorn.error")
        config.include_server_header = False
        config.graceful_timeout = settings.grace_period_seconds
        config.websocket_max_message_size = settings.max_message_bytes
        config.h11_max_incomplete_size = 64 * 1024
        tls = settings.tls_cert_file is not None
        if tls:
            config.certfile = str(settings.tls_cert_file)
            config.keyfile = str(settings.tls_key_file)
            if settings.tls_client_ca_file is not None:
                config.ca_certs = str(settings.tls_client_ca_file)
                config.verify_mode = ssl.CERT_REQUIRED
        sockets = Sockets([sock] if tls else [], [] if tls else [sock], [])
        stop = asyncio.Event()
        started = asyncio.Event()

        async def serve() -> None:
            started.set()
            await worker_serve(
                ASGIWrapper(app),  # type: ignore[arg-type]
                config,
                sockets=sockets,
                shutdown_trigger=stop.wait,
            )

        task = asyncio.create_task(serve())
        await started.wait()
        await asyncio.sleep(0)  # its listening server is started on the next turns
        front = cls(task, sock, tls)
        front._stop = stop
        front._config = config
        return front

    @property
    def scheme(self) -> str:
        return "https" if self._tls else "http"

    async def stop(self, grace: float | None) -> None:
        config = self._config
        if grace is not None and config is not None:
            config.graceful_timeout = max(0.0, grace)  # type: ignore[attr-defined]
        self._stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    def hurry(self) -> None:
        self._task.cancel()


async def start_http_server(app: object, settings: Settings) -> HttpFront | HypercornFront:
    """The HTTP port's server, as `http_server` names it."""
    if settings.http_server == "hypercorn":
        return await HypercornFront.start(app, settings)
    return await HttpFront.start(app, settings)
