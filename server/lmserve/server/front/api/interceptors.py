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

import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, NoReturn, TypeAlias, TypeVar, cast

import grpc
from google.protobuf.message import Message
from grpc import aio

from lmserve.server import errors
from lmserve.server.call_context import current_call
from lmserve.server.front.api.grpc_types import Context, Interceptor, MethodHandler, Wire
from lmserve.server.front.api.observed_call import CallObserver, ObservedCall
from lmserve.server.front.api.status_details import overload_status
from lmserve.server.metrics import Metrics

if TYPE_CHECKING:
    from typing_extensions import TypeIs

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

# What a behaviour takes: a request (a message; wire bytes where a handler has no deserializer),
# or a client stream of them; and the same with the lenient deserializer's marker among them.
In = TypeVar("In")
Out = TypeVar("Out")
# A grpc.aio behaviour: a coroutine function (answering the response, or None when it wrote
# them with `context.write`) or an async generator function of the responses.
UnaryBehavior: TypeAlias = Callable[[In, Context], Awaitable[Wire | None]]
StreamBehavior: TypeAlias = Callable[[In, Context], AsyncIterator[Wire]]
Behavior: TypeAlias = UnaryBehavior[In] | StreamBehavior[In]


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
        # Per full method name: the handler gRPC found and its wrapped one. A servicer's
        # handlers are the same objects call after call, so each is wrapped once, not per call
        # (a refused call's handler is new each time: it is wrapped on its own).
        self._wrapped: dict[str, tuple[MethodHandler, MethodHandler]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[MethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> MethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        full_name = handler_call_details.method
        known = self._wrapped.get(full_name)
        if known is not None and known[0] is handler:
            return known[1]
        wrapped = self._wrap_handler(full_name.rsplit("/", 1)[-1], handler)
        self._wrapped[full_name] = (handler, wrapped)  # one entry per method the server has
        return wrapped

    def _wrap_handler(self, method: str, handler: MethodHandler) -> MethodHandler:
        """`handler` with its behaviour served (`_serve`), undecodable requests refused and
        prebuilt response bytes passed through."""
        deserializer = handler.request_deserializer
        message = _message_name(deserializer, method)
        # grpc-stubs types a handler's behaviour as a synchronous callable; under grpc.aio it is
        # a coroutine function or an async generator function of the same request (`Behavior`).
        factory: Callable[..., MethodHandler]
        served: Behavior[Incoming] | Behavior[AsyncIterator[Incoming]]
        if handler.unary_unary:
            factory = grpc.unary_unary_rpc_method_handler
            served = self._serve(method, cast("Behavior[Wire]", handler.unary_unary), message)
        elif handler.stream_unary:
            factory = grpc.stream_unary_rpc_method_handler
            behavior = cast("Behavior[AsyncIterator[Wire]]", handler.stream_unary)
            served = self._serve(method, _checking_stream(behavior, message))
        elif handler.unary_stream:
            factory = grpc.unary_stream_rpc_method_handler
            served = self._serve(method, cast("Behavior[Wire]", handler.unary_stream), message)
        elif handler.stream_stream:
            factory = grpc.stream_stream_rpc_method_handler
            behavior = cast("Behavior[AsyncIterator[Wire]]", handler.stream_stream)
            served = self._serve(method, _checking_stream(behavior, message))
        else:
            return handler
        return factory(
            served,
            request_deserializer=_lenient(deserializer, method),
            response_serializer=_passing_bytes(handler.response_serializer),
        )

    def _serve(
        self, method: str, behavior: Behavior[In], message: str | None = None
    ) -> Behavior[In | _Undecodable]:
        """`behavior` within one RPC's serving: the request id, the deadline check, in-flight
        gauge, error mapping and metrics; with `message` (a unary request's full name), an
        undecodable request refused as INVALID_ARGUMENT. A coroutine function for a unary
        answer (or one written with `context.write`), an async generator function for a
        stream. One frame per call, no context manager: this runs on every RPC.

        A failed RPC is counted before its status is sent: a caller that scrapes /metrics as
        soon as it has the error must find it counted (answers that succeed are counted before
        gRPC sends them, when the handler returns)."""
        start, front = self._observer.start, self._front

        def begin(context: Context) -> tuple[ObservedCall, Trailing]:
            call = start(method, _metadata_value(context, REQUEST_ID_KEY))
            return call, ((REQUEST_ID_KEY, call.info.request_id), (FRONT_KEY, front))

        def admit(request: In | _Undecodable, context: Context, trailing: Trailing) -> In:
            context.set_trailing_metadata(trailing)
            _check_deadline(context)
            if isinstance(request, _Undecodable):
                raise _undecodable(message or f"{method} request")
            return request

        if _streams(behavior):
            stream = behavior

            async def streamed(request: In | _Undecodable, context: Context) -> AsyncIterator[Wire]:
                call, trailing = begin(context)
                try:
                    async for response in stream(admit(request, context, trailing), context):
                        yield response
                except BaseException as exc:
                    await _failed(call, method, exc, context, trailing)
                finally:
                    call.finish(_OK)  # no-op after a failure

            return streamed

        unary = behavior

        async def answered(request: In | _Undecodable, context: Context) -> Wire | None:
            call, trailing = begin(context)
            try:
                return await unary(admit(request, context, trailing), context)
            except BaseException as exc:
                await _failed(call, method, exc, context, trailing)
                raise  # not reached: `_failed` raises
            finally:
                call.finish(_OK)  # no-op after a failure

        return answered


# A call's trailing metadata: its request id and the front that answered.
Trailing: TypeAlias = tuple[tuple[str, str], ...]
_OK = grpc.StatusCode.OK.name


async def _failed(
    call: ObservedCall, method: str, exc: BaseException, context: Context, trailing: Trailing
) -> NoReturn:
    """Counts a failed call with its mapped code, then answers it (`_answer_failure`)."""
    code = _code_for(exc, context)
    call.finish(code.name)
    await _answer_failure(method, exc, code, context, trailing)
    raise exc  # not reached: `_answer_failure` aborts or re-raises


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
# What gRPC hands a wrapped behaviour: the deserializer's request, or the marker.
Incoming: TypeAlias = Wire | _Undecodable


def _streams(behavior: Behavior[In]) -> TypeIs[StreamBehavior[In]]:
    """Whether `behavior` is an async generator function (else a coroutine function)."""
    return inspect.isasyncgenfunction(behavior)


def _message_name(deserializer: Callable[[bytes], Wire] | None, method: str) -> str:
    """The request message's full name (`lmserve.v1.ScoreRequest`), for the error message."""
    descriptor = getattr(getattr(deserializer, "__self__", None), "DESCRIPTOR", None)
    return str(getattr(descriptor, "full_name", f"{method} request"))


def _lenient(
    deserializer: Callable[[bytes], Wire] | None, method: str
) -> Callable[[bytes], Incoming] | None:
    """The handler's deserializer, returning `_UNDECODABLE` (one log line) where it raises."""
    if deserializer is None:
        return None

    def deserialize(data: bytes) -> Incoming:
        try:
            return deserializer(data)
        except Exception as exc:
            log.warning("%s: undecodable request of %d bytes (%s)", method, len(data), exc)
            return _UNDECODABLE

    return deserialize


def _undecodable(message: str) -> errors.InvalidArgument:
    return errors.InvalidArgument("request", f"not a valid {message} message")


def _checked(request: Incoming, message: str) -> Wire:
    """`request`, or INVALID_ARGUMENT for an undecodable one."""
    if isinstance(request, _Undecodable):
        raise _undecodable(message)
    return request


def _checking_stream(
    behavior: Behavior[AsyncIterator[Wire]], message: str
) -> Behavior[AsyncIterator[Incoming]]:
    """`behavior`, raising INVALID_ARGUMENT for an undecodable message of the stream."""

    async def requests(iterator: AsyncIterator[Incoming]) -> AsyncIterator[Wire]:
        async for request in iterator:
            yield _checked(request, message)

    return _like(behavior, requests)


def _like(behavior: Behavior[In], adapt: Callable[[Out], In]) -> Behavior[Out]:
    """`behavior` taking its request through `adapt`, an async generator function when
    `behavior` is one (`_streams` looks)."""
    if not _streams(behavior):

        async def plain(request: Out, context: Context) -> Wire | None:
            return await behavior(adapt(request), context)

        return plain

    async def generator(request: Out, context: Context) -> AsyncIterator[Wire]:
        async for response in behavior(adapt(request), context):
            yield response

    return generator


def _passing_bytes(
    serializer: Callable[[Message], bytes] | None,
) -> Callable[[Wire], bytes] | None:
    """The handler's response serializer, except that a servicer may answer with the response's
    wire bytes, already written (`worker.replies.score`): those go out as they are."""
    if serializer is None:
        return None

    def serialize(response: Wire) -> bytes:
        return response if isinstance(response, bytes) else serializer(response)

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
