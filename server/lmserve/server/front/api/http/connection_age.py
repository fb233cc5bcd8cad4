"""`max_connection_age_seconds` on the HTTP front, as gRPC applies it on its port.

    app = ConnectionAge(site, max_age_seconds=300)

A client keeps an HTTP/1.1 connection open for as long as it likes, so behind a load balancer
that spreads connections (not requests) a new replica would get no traffic from it. Once a
connection is older than the age, its next response carries `Connection: close`: the client
finishes that request and opens a new connection (and may reach another replica). Connections
are told apart by their client address and port. WebSockets are left alone (an autocomplete
session lives as long as its page).
"""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

# Connections not seen for this many ages are forgotten (their client has gone).
_FORGET_AFTER_AGES = 4


class ConnectionAge:
    """The ASGI middleware (see the module doc)."""

    def __init__(self, app: ASGIApp, max_age_seconds: float) -> None:
        self.app = app
        self.max_age = max_age_seconds
        self._opened: dict[tuple[str, int], tuple[float, float]] = {}  # first seen, last seen
        self._pruned = time.monotonic()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        client = scope.get("client")
        if scope["type"] != "http" or not client:
            await self.app(scope, receive, send)
            return
        now = time.monotonic()
        key = (str(client[0]), int(client[1]))
        opened, _ = self._opened.get(key, (now, now))
        self._opened[key] = (opened, now)
        self._prune(now)
        if now - opened < self.max_age:
            await self.app(scope, receive, send)
            return
        del self._opened[key]  # this connection ends after the response

        async def closing(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [h for h in message.get("headers", []) if h[0].lower() != b"connection"]
                message = {**message, "headers": [*headers, (b"connection", b"close")]}
            await send(message)

        await self.app(scope, receive, closing)

    def _prune(self, now: float) -> None:
        if now - self._pruned < self.max_age:
            return
        self._pruned = now
        horizon = now - _FORGET_AFTER_AGES * self.max_age
        for key, (_, seen) in list(self._opened.items()):
            if seen < horizon:
                del self._opened[key]
