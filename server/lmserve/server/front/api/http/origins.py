"""Which web pages may call the HTTP front: the same origin, and the ones `allowed_origins` lists.

    app = OriginPolicy(site, allowed=("https://app.example.com",), metrics=metrics)

A browser tells every cross-origin request's page in the `Origin` header, and sends it on a
WebSocket handshake too (where no CORS applies: without a check, any page a user visits could
open an autocomplete session against a server on their machine, cross-site WebSocket
hijacking). Requests without an `Origin` (curl, gRPC and Connect clients, the server's own
page's GETs) are not browsers' cross-origin calls and pass. A request from the server's own
origin passes. A request from a listed origin passes, with the CORS headers the browser needs
(`Access-Control-Allow-Origin`, and the preflight's methods and headers). Any other origin gets
403 with a line naming the setting, is counted (`lmserve_http_refused_origins_total`) and logged
at WARNING; its preflight gets the same 403, so the browser never sends the call.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from lmserve.server.metrics import Metrics

log = logging.getLogger(__name__)

# What a listed page may send and read (Connect's and the OpenAI API's headers).
ALLOWED_METHODS = "GET, POST, OPTIONS"
EXPOSED_HEADERS = "x-request-id, retry-after, grpc-status, grpc-message"
PREFLIGHT_MAX_AGE = "600"
_WEB_SCHEMES = {"ws": "http", "wss": "https", "http": "http", "https": "https"}


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value).decode("latin-1")
    return None


def _same_origin(scope: Scope, origin: str) -> bool:
    host = _header(scope, b"host")
    scheme = _WEB_SCHEMES.get(str(scope.get("scheme", "http")), "http")
    return host is not None and origin.lower() == f"{scheme}://{host}".lower()


class OriginPolicy:
    """The ASGI middleware that enforces it (see the module doc)."""

    def __init__(self, app: ASGIApp, allowed: Iterable[str], metrics: Metrics | None) -> None:
        self.app = app
        self.allowed = {o.rstrip("/").lower() for o in allowed}
        self.any = "*" in self.allowed
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        origin = _header(scope, b"origin") if kind in ("http", "websocket") else None
        if origin is None or _same_origin(scope, origin):
            await self.app(scope, receive, send)
            return
        if not (self.any or origin.rstrip("/").lower() in self.allowed):
            await self._refuse(scope, receive, send, origin)
            return
        if kind == "websocket":
            await self.app(scope, receive, send)
            return
        if scope["method"] == "OPTIONS" and _header(scope, b"access-control-request-method"):
            await self._preflight(scope, send, origin)
            return
        await self.app(scope, receive, self._with_cors(send, origin))

    def _with_cors(self, send: Send, origin: str) -> Send:
        async def send_with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers += [
                    (b"access-control-allow-origin", origin.encode("latin-1")),
                    (b"access-control-expose-headers", EXPOSED_HEADERS.encode()),
                    (b"vary", b"Origin"),
                ]
                message = {**message, "headers": headers}
            await send(message)

        return send_with_cors

    async def _preflight(self, scope: Scope, send: Send, origin: str) -> None:
        requested = _header(scope, b"access-control-request-headers") or ""
        headers = [
            (b"access-control-allow-origin", origin.encode("latin-1")),
            (b"access-control-allow-methods", ALLOWED_METHODS.encode()),
            (b"access-control-allow-headers", requested.encode("latin-1")),
            (b"access-control-max-age", PREFLIGHT_MAX_AGE.encode()),
            (b"vary", b"Origin"),
        ]
        await send({"type": "http.response.start", "status": 204, "headers": headers})
        await send({"type": "http.response.body", "body": b""})

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, origin: str) -> None:
        kind = scope["type"]
        path = str(scope.get("path", ""))
        if self.metrics is not None:
            self.metrics.http_refused_origins.labels(kind=kind).inc()
        log.warning(
            "refused a %s request to %s from origin %r (not the server's own, nor in "
            "allowed_origins)",
            "WebSocket" if kind == "websocket" else "HTTP",
            path,
            origin[:200],
        )
        body = (
            f"origin {origin[:200]} is not allowed: add it to allowed_origins "
            "(LMSERVE_ALLOWED_ORIGINS) to let its pages call this server\n"
        ).encode()
        if kind == "websocket":
            # The handshake is refused before it is accepted: the server answers 403.
            await receive()  # websocket.connect
            await send({"type": "websocket.close", "code": 1008})
            return
        headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"vary", b"Origin")]
        await send({"type": "http.response.start", "status": 403, "headers": headers})
        await send({"type": "http.response.body", "body": body})
