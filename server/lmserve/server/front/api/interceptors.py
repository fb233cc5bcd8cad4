"""The one place errors become gRPC status codes, deadlines are checked, RPCs are measured and
given a request id (and where prebuilt response bytes pass the serializer).

    server = grpc.aio.server(interceptors=[ServingInterceptor(metrics), AuthInterceptor(token)])

Each RPC gets the caller's `x-request-id` (or a new one) as its id: in `call_context` for log
lines, and sent back in the response's trailing metadata (initial metadata would commit the call
early and stop the client's transparent retries). Going first, it also counts the calls
the auth interceptor refuses (its handlers raise `errors.Unauthenticated`), before the status is
sent; a handler's own abort is counted with the code it aborted with. Overloaded answers carry
google.rpc details (`status_details`).

Servicers raise `lmserve.server.errors` exceptions; this maps them (`STATUS_CODES`). Anything
unexpected becomes INTERNAL with the traceback in the server log, never sent to the caller.
Request bytes that do not parse as the RPC's message get INVALID_ARGUMENT (gRPC itself would
answer UNKNOWN and log a traceback per request): the deserializer returns a marker instead of
raising, and the wrapped handler turns the marker into the error.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from grpc import aio

from lmserve.server import errors
from lmserve.server.call_context import current_call
from lmserve.server.front.api.grpc_types import Context, Interceptor, MethodHandler
from lmserve.server.front.api.observed_call import CallObserver
from lmserve.server.front.api.status_details import overload_status
from lmserve.server.metrics import Metrics

log = logging.getLogger(__name__)
REQUEST_ID_KEY = "x-request-id"
# The front process that answered, 0 for the first (`fronts: N`).
FRONT_KEY = "x-lmserve-front"

STATUS_CODES: dict[type[errors.LmServeError], grpc.StatusCode] = {
    errors.InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    errors.ModelNotFound: grpc.StatusCode.NOT_FOUND,
    errors.ModelUnavailable: grpc.StatusCode.UNAVAILABLE,
    errors.Overloaded: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.DeadlineExceeded: grpc.StatusCode.DEADLINE_EXCEEDED,
    errors.Unimplemented: grpc.StatusCode.UNIMPLEMENTED,
    errors.Cancelled: grpc.StatusCode.CANCELLED,
    errors.Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
    # The model's own output was unusable (NaN, +inf): a server-side failure, said plainly.
    errors.ModelOutputError: grpc.StatusCode.INTERNAL,
}


def note_model(name: str) -> None:
    """Labels the current RPC's metrics and log lines with this (existing) model's name; the
    servicer calls it once it knows the name is real (callers cannot grow the label set)."""
    info = current_call()
    if info is not None:
        info.model = name


def status_code(exc: errors.LmServeError) -> grpc.StatusCode:
    for cls in type(exc).__mro__:
        code = STATUS_CODES.get(cls)
        if code is not None:
            return code
    return grpc.StatusCode.INTERNAL


class ServingInterceptor(Interceptor):
    """Wraps every handler: request id, deadline check, error mapping, request metrics and
    (with `access_log`) one INFO line per RPC on the `lmserve.access` logger."""

    def __init__(self, metrics: Metrics, *, access_log: bool = False, front: int = 0) -> None:
        self._observer = CallObserver(metrics, access_log=access_log)
        # Which front process answered (`fronts: N`), in the trailing metadata.
        self._front = str(front)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[MethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> MethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        method = handler_call_details.method.rsplit("/", 1)[-1]
        wrap = self._wrap_unary if not handler.response_streaming else self._wrap_streaming
        factory: Callable[..., MethodHandler]
        behavior: Callable[..., Any]
        if handler.unary_unary:
            factory, behavior = grpc.unary_unary_rpc_method_handler, handler.unary_unary
        elif handler.stream_unary:
            factory, behavior = grpc.stream_unary_rpc_method_handler, handler.stream_unary
        elif handler.unary_stream:
            factory, behavior = grpc.unary_stream_rpc_method_handler, handler.unary_stream
        elif handler.stream_stream:
            factory, behavior = grpc.stream_stream_rpc_method_handler, handler.stream_stream
        else:
            return handler
        deserializer = handler.request_deserializer
        message = _message_name(deserializer, method)
        checked = _checking_requests(behavior, message, handler.request_streaming)
        return factory(
            wrap(method, checked),
            request_deserializer=_lenient(deserializer, method),
            response_serializer=_passing_bytes(handler.response_serializer),
        )

    @contextlib.asynccontextmanager
    async def _serving(self, method: str, context: Context) -> AsyncIterator[None]:
        """Around one RPC: the deadline check, in-flight gauge, error mapping and metrics.

        A failed RPC is counted before its status is sent: a caller that scrapes /metrics as
        soon as it has the error must find it counted (answers that succeed are counted before
        gRPC sends them, when the handler returns)."""
        call = self._observer.start(method, _metadata_value(context, REQUEST_ID_KEY))
        try:
            trailing = ((REQUEST_ID_KEY, call.info.request_id), (FRONT_KEY, self._front))
            context.set_trailing_metadata(trailing)
            _check_deadline(context)
            yield
        except BaseException as exc:
            code = _code_for(exc, context)
            call.finish(code.name)
            await _answer_failure(method, exc, code, context, trailing)
        finally:
            call.finish(grpc.StatusCode.OK.name)  # no-op after a failure

    def _wrap_unary(self, method: str, behavior: Callable[..., Any]) -> Callable[..., Any]:
        async def wrapped(request: Any, context: Context) -> Any:
            async with self._serving(method, context):
                return await behavior(request, context)

        return wrapped

    def _wrap_streaming(self, method: str, behavior: Callable[..., Any]) -> Callable[..., Any]:
        if not inspect.isasyncgenfunction(behavior):
            return self._wrap_unary(method, behavior)  # writes with context.write

        async def wrapped(request: Any, context: Context) -> AsyncIterator[Any]:
            async with self._serving(method, context):
                async for response in behavior(request, context):
                    yield response

        return wrapped


def _metadata_value(context: Context, key: str) -> str | None:
    """The first value of an ASCII metadata key the caller sent, if any."""
    for item in context.invocation_metadata() or ():
        if item[0] == key:
            value = item[1]
            return value if isinstance(value, str) else None
    return None


class _Undecodable:
    """What the lenient deserializer returns for bytes that are not the request message."""


_UNDECODABLE = _Undecodable()


def _message_name(deserializer: Callable[[bytes], Any] | None, method: str) -> str:
    """The request message's full name (`lmserve.v1.ScoreRequest`), for the error message."""
    descriptor = getattr(getattr(deserializer, "__self__", None), "DESCRIPTOR", None)
    return str(getattr(descriptor, "full_name", f"{method} request"))


def _lenient(
    deserializer: Callable[[bytes], Any] | None, method: str
) -> Callable[[bytes], Any] | None:
    """The handler's deserializer, returning `_UNDECODABLE` (one log line) where it raises."""
    if deserializer is None:
        return None

    def deserialize(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception as exc:
            log.warning("%s: undecodable request of %d bytes (%s)", method, len(data), exc)
            return _UNDECODABLE

    return deserialize


def _undecodable(message: str) -> errors.InvalidArgument:
    return errors.InvalidArgument("request", f"not a valid {message} message")


def _checking_requests(
    behavior: Callable[..., Any], message: str, streaming: bool
) -> Callable[..., Any]:
    """`behavior`, raising INVALID_ARGUMENT for an undecodable request (or stream message)."""

    async def requests(iterator: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for request in iterator:
            if request is _UNDECODABLE:
                raise _undecodable(message)
            yield request

    if streaming:

        def with_stream(request_iterator: AsyncIterator[Any], context: Any) -> Any:
            return behavior(requests(request_iterator), context)

        return _like(behavior, with_stream)

    def with_request(request: Any, context: Any) -> Any:
        if request is _UNDECODABLE:
            raise _undecodable(message)
        return behavior(request, context)

    return _like(behavior, with_request)


def _like(behavior: Callable[..., Any], call: Callable[..., Any]) -> Callable[..., Any]:
    """`call` as an async generator function when `behavior` is one (`_wrap_streaming` looks)."""
    if not inspect.isasyncgenfunction(behavior):

        async def plain(request: Any, context: Any) -> Any:
            return await call(request, context)

        return plain

    async def generator(request: Any, context: Any) -> AsyncIterator[Any]:
        async for response in call(request, context):
            yield response

    return generator


def _passing_bytes(serializer: Callable[[Any], bytes] | None) -> Callable[[Any], bytes] | None:
    """The handler's response serializer, except that a servicer may answer with the response's
    wire bytes, already written (`worker.replies.score`): those go out as they are."""
    if serializer is None:
        return None

    def serialize(response: Any) -> bytes:
        return response if type(response) is bytes else serializer(response)

    return serialize


def _check_deadline(context: Context) -> None:
    remaining = context.time_remaining()
    if remaining is not None and remaining <= 0:
        raise errors.DeadlineExceeded("the deadline passed before the work started")


def _code_for(exc: BaseException, context: Context) -> grpc.StatusCode:
    if isinstance(exc, errors.LmServeError):
        return status_code(exc)
    if isinstance(exc, aio.AbortError):
        # A handler aborted on its own (the auth interceptor's UNAUTHENTICATED): its code.
        code = context.code()
        return code if isinstance(code, grpc.StatusCode) else grpc.StatusCode.UNKNOWN
    if isinstance(exc, Exception):
        return grpc.StatusCode.INTERNAL
    return grpc.StatusCode.CANCELLED  # CancelledError and friends: the caller went away


async def _answer_failure(
    method: str,
    exc: BaseException,
    code: grpc.StatusCode,
    context: Context,
    trailing: tuple[tuple[str, str], ...],
) -> None:
    """Aborts the RPC with the mapped status (the request id in its trailing metadata);
    re-raises what must propagate."""
    if code is grpc.StatusCode.CANCELLED or isinstance(exc, aio.AbortError):
        raise exc
    if code is grpc.StatusCode.INTERNAL:
        log.error("%s failed unexpectedly", method, exc_info=exc)
        await context.abort(code, f"internal error in {method}; see the server log", trailing)
    if isinstance(exc, errors.Overloaded):  # with RetryInfo: built from `exc`, no work first
        status = overload_status(exc)  # its details travel as trailing metadata
        await context.abort(status.code, status.details, (*status.trailing_metadata, *trailing))
    # Capped: a message over gRPC's metadata limit would turn the status into RESOURCE_EXHAUSTED.
    await context.abort(code, errors.clip(exc, 2 * errors.MESSAGE_LIMIT), trailing)
