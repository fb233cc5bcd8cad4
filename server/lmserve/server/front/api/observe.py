"""The server's interceptor chain, with the observability the settings ask for.

    interceptors = server_interceptors(settings, metrics, token)
    server = grpc.aio.server(interceptors=interceptors)

Order, outermost first: the OpenTelemetry span (`otel_tracing`; covers everything, refused
calls included), ServingInterceptor (request id, metrics, error mapping; counts what auth
refuses), AuthInterceptor (when a token is configured).
"""

from __future__ import annotations

import importlib
from types import ModuleType

from starlette.types import ASGIApp

from lmserve.server.front.api.auth import AuthInterceptor
from lmserve.server.front.api.grpc_types import Interceptor
from lmserve.server.front.api.interceptors import ServingInterceptor
from lmserve.server.metrics import Metrics
from lmserve.server.settings import Settings

OTEL_MODULE = "opentelemetry.instrumentation.grpc"
OTEL_ASGI_MODULE = "opentelemetry.instrumentation.asgi"


class TracingUnavailable(RuntimeError):
    """`otel_tracing` is on but the OpenTelemetry gRPC instrumentation is not installed."""


def _otel(module_name: str) -> ModuleType:
    """An OpenTelemetry instrumentation module, or TracingUnavailable in one line."""
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        raise TracingUnavailable(
            f"otel_tracing is on but {module_name} cannot be imported ({exc}): "
            "install lmserve[otel] or set otel_tracing false"
        ) from None


def tracing_interceptor() -> Interceptor:
    """OpenTelemetry's aio server interceptor (each RPC a span, on the global tracer provider).
    Raises TracingUnavailable, in one line, when the `otel` extra is missing."""
    interceptor: Interceptor = _otel(OTEL_MODULE).aio_server_interceptor()
    return interceptor


def traced_http(app: ASGIApp) -> ASGIApp:
    """The HTTP front's ASGI app with each request a span (OpenTelemetry's ASGI middleware, on
    the same global tracer provider as the gRPC spans)."""
    traced: ASGIApp = _otel(OTEL_ASGI_MODULE).OpenTelemetryMiddleware(app)
    return traced


def access_log_enabled(settings: Settings) -> bool:
    """`access_log`, or by default on with JSON logs (both fronts ask this)."""
    return settings.access_log if settings.access_log is not None else settings.log_format == "json"


def server_interceptors(
    settings: Settings, metrics: Metrics, token: str | None, front: int = 0
) -> list[Interceptor]:
    """The interceptors for `grpc.aio.server`, outermost first (`front`: which front process)."""
    access = access_log_enabled(settings)
    chain: list[Interceptor] = []
    if settings.otel_tracing:
        chain.append(tracing_interceptor())
    chain.append(ServingInterceptor(metrics, access_log=access, front=front))
    if token is not None:
        chain.append(AuthInterceptor(token, health_open=settings.auth_health_open))
    return chain


__all__ = [
    "TracingUnavailable",
    "access_log_enabled",
    "server_interceptors",
    "traced_http",
    "tracing_interceptor",
]
