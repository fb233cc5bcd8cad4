"""The HTTP front's one ASGI application: what each path is answered by.

/lmserve.v1.LanguageModelService/<Method>   every RPC, Connect protocol (`connect_service`)
/v1/models, /v1/completions                 the OpenAI-compatible API (`openai_api`)
/tokenize, /detokenize, /tokenizer_info     vLLM's tokenizer endpoints (`tokenizer_api`)
/ws/complete                                autocomplete sessions over a WebSocket
/, /demo                                    the autocomplete page (`demo_page`)
/healthz                                    200 while serving, 503 otherwise (HTTP probes)

Every path is behind `OriginPolicy`: a browser page of another origin is refused unless
`allowed_origins` lists it.
"""

from __future__ import annotations

import logging
from typing import cast

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from lmserve.server.front.api.health import HealthServicer
from lmserve.server.front.api.http.calls import HttpCalls
from lmserve.server.front.api.http.complete_socket import complete_socket_routes
from lmserve.server.front.api.http.connect_service import PATH, ConnectService
from lmserve.server.front.api.http.connection_age import ConnectionAge
from lmserve.server.front.api.http.demo_page import demo_page_routes
from lmserve.server.front.api.http.front import HttpFront, HypercornFront, start_http_server
from lmserve.server.front.api.http.openai_api import openai_routes
from lmserve.server.front.api.http.origins import OriginPolicy
from lmserve.server.front.api.http.tokenizer_api import tokenizer_routes
from lmserve.server.front.api.observe import access_log_enabled, traced_http
from lmserve.server.front.api.observed_call import CallObserver
from lmserve.server.front.api.servicer import LanguageModelServicer
from lmserve.server.metrics import Metrics
from lmserve.server.settings import Settings

log = logging.getLogger(__name__)


class Site:
    """Connect calls go straight to connectrpc's app; everything else to Starlette's router."""

    def __init__(self, connect: ASGIApp, routes: list[BaseRoute]) -> None:
        self._connect = connect
        self._prefix = PATH + "/"
        self._router = Starlette(routes=routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(self._prefix):
            await self._connect(scope, receive, send)
        else:
            await self._router(scope, receive, send)


def build_site(
    servicer: LanguageModelServicer,
    calls: HttpCalls,
    health: HealthServicer,
    *,
    max_message_bytes: int,
) -> Site:
    async def healthz(request: Request) -> Response:
        serving = health.serving()
        return PlainTextResponse(
            "SERVING\n" if serving else "NOT_SERVING\n", status_code=200 if serving else 503
        )

    routes: list[BaseRoute] = [
        Route("/healthz", healthz, methods=["GET"]),
        *complete_socket_routes(servicer, calls),
        *demo_page_routes(),
        *openai_routes(servicer, calls, max_message_bytes=max_message_bytes),
        *tokenizer_routes(servicer, calls, max_message_bytes=max_message_bytes),
    ]
    # connectrpc types its __call__ with asgiref's scope TypedDicts, Starlette with mappings:
    # the same ASGI callable.
    connect = cast(ASGIApp, ConnectService(servicer, calls, max_message_bytes=max_message_bytes))
    return Site(connect, routes)


async def start_http_front(
    settings: Settings,
    servicer: LanguageModelServicer,
    health: HealthServicer,
    metrics: Metrics,
    token: str | None,
) -> HttpFront | HypercornFront:
    """Opens the HTTP front on the same models, auth, TLS, limits and metrics as the gRPC
    port (and, with `otel_tracing`, each request a span)."""
    observer = CallObserver(metrics, access_log=access_log_enabled(settings), front="http")
    site = build_site(
        servicer, HttpCalls(observer, token), health, max_message_bytes=settings.max_message_bytes
    )
    guarded: ASGIApp = OriginPolicy(site, settings.allowed_origins, metrics)
    if settings.max_connection_age_seconds:
        guarded = ConnectionAge(guarded, settings.max_connection_age_seconds)
    app = traced_http(guarded) if settings.otel_tracing else guarded
    front = await start_http_server(app, settings)
    log.info(
        "HTTP on %s://%s:%d/ (Connect JSON, OpenAI /v1, autocomplete page)",
        front.scheme,
        settings.host,
        front.port,
    )
    return front
