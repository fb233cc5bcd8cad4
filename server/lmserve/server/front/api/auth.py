"""Transport security: server TLS credentials (optionally mTLS) and bearer-token auth.

    creds = server_credentials(settings)          # None: plaintext
    token = configured_token(settings)            # None: no auth
    interceptors = [ServingInterceptor(metrics), AuthInterceptor(token)]   # see api/observe

The token is compared in constant time and never logged or echoed: a rejected call is told only
that its token was missing or wrong.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import NoReturn

import grpc

from lmserve.server.errors import Unauthenticated
from lmserve.server.front.api.grpc_types import Context, Interceptor, MethodHandler, Wire
from lmserve.server.settings import Settings

log = logging.getLogger(__name__)

HEALTH_PREFIX = "/grpc.health.v1.Health/"
_SCHEME = "bearer "


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise OSError(f"cannot read the {what} {path}: {exc.strerror or exc}") from None


def server_credentials(settings: Settings) -> grpc.ServerCredentials | None:
    """TLS credentials from the settings' PEM files; with a client CA, client certificates are
    required (mTLS). None when TLS is not configured."""
    if settings.tls_cert_file is None or settings.tls_key_file is None:
        return None
    key = _read(settings.tls_key_file, "TLS key")
    chain = _read(settings.tls_cert_file, "TLS certificate")
    client_ca = None
    if settings.tls_client_ca_file is not None:
        client_ca = _read(settings.tls_client_ca_file, "TLS client CA")
    return grpc.ssl_server_credentials(
        [(key, chain)], root_certificates=client_ca, require_client_auth=client_ca is not None
    )


def configured_token(settings: Settings) -> str | None:
    """The bearer token every RPC must carry, from `auth_token_file` or `auth_token`."""
    if settings.auth_token is not None:
        return settings.auth_token.get_secret_value().strip()
    if settings.auth_token_file is None:
        return None
    token = _read(settings.auth_token_file, "auth token file").decode("utf-8").strip()
    if not token:
        raise OSError(f"the auth token file {settings.auth_token_file} is empty")
    return token


def bearer_problem(value: str | None, expected: bytes) -> str | None:
    """None when `value` (an authorization header or metadata value) carries the expected
    bearer token, else why not (never quoting what was sent). Both fronts ask this."""
    if value is None:
        return "missing authorization: send 'authorization: Bearer <token>'"
    if value[: len(_SCHEME)].lower() != _SCHEME:
        return "the authorization metadata is not a Bearer token"
    sent = value[len(_SCHEME) :].strip().encode("utf-8", "surrogateescape")
    if not hmac.compare_digest(sent, expected):
        return "invalid bearer token"
    return None


class AuthInterceptor(Interceptor):
    """Refuses every RPC without `authorization: Bearer <token>` (UNAUTHENTICATED), except the
    health service when `health_open` (probes carry no token). Goes after ServingInterceptor,
    which answers and counts the `errors.Unauthenticated` its handlers raise; refused calls
    never reach a servicer."""

    def __init__(self, token: str, *, health_open: bool = True) -> None:
        self._expected = token.encode("utf-8")
        self._health_open = health_open

    def _allowed(self, details: grpc.HandlerCallDetails) -> str | None:
        """None when the call may pass, else why not (never quoting what was sent)."""
        if self._health_open and details.method.startswith(HEALTH_PREFIX):
            return None
        values = [v for k, v in details.invocation_metadata or () if k == "authorization"]
        if not values:
            return "missing authorization metadata: send 'authorization: Bearer <token>'"
        value = values[0] if isinstance(values[0], str) else values[0].decode("latin-1")
        return bearer_problem(value, self._expected)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[MethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> MethodHandler:
        problem = self._allowed(handler_call_details)
        handler = await continuation(handler_call_details)
        if problem is None or handler is None:
            return handler
        log.info("refused %s: %s", handler_call_details.method, problem)
        return _refusing(handler, problem)


def _refusing(handler: MethodHandler, problem: str) -> MethodHandler:
    """A handler of the same kind as `handler` that raises Unauthenticated, reading nothing
    (ServingInterceptor counts it, then answers UNAUTHENTICATED)."""

    async def refuse(request: object, context: Context) -> NoReturn:
        raise Unauthenticated(problem)

    async def refuse_stream(request: object, context: Context) -> AsyncIterator[Wire]:
        raise Unauthenticated(problem)
        yield  # an async generator, as streaming handlers are

    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(refuse)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(refuse)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(refuse_stream)
    return grpc.stream_stream_rpc_method_handler(refuse_stream)


__all__ = ["AuthInterceptor", "bearer_problem", "configured_token", "server_credentials"]
