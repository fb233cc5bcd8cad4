"""Every RPC of `lmserve.v1.LanguageModelService` over HTTP in the Connect protocol, answered by
the gRPC servicer's own methods (one copy of validation and conversion).

    POST /lmserve.v1.LanguageModelService/Score   content-type: application/json
    {"model": "kjv-5gram", "texts": ["in the beginning"]}

connectrpc speaks the protocol: unary calls as plain JSON (or binary protobuf) bodies, streams as
Connect envelopes (`application/connect+json`), gRPC-Web beside them, `Connect-Timeout-Ms` as
the deadline, errors as `{"code": "invalid_argument", "message": ...}` with the HTTP status of
the gRPC code. The endpoints are built from the service's descriptor, so a new RPC in the .proto
is served here as soon as the servicer has it. JSON uses proto3 JSON names (`returnTokens`);
an unknown field is INVALID_ARGUMENT, not silently dropped (a misspelt option would be).
"""

from __future__ import annotations

import json
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, TypeAlias, TypeVar

from connectrpc._server_shared import (
    EndpointBidiStream,
    EndpointClientStream,
    EndpointServerStream,
    EndpointUnary,
)
from connectrpc.code import Code
from connectrpc.errors import ConnectError
from connectrpc.method import IdempotencyLevel, MethodInfo, StreamType
from connectrpc.request import RequestContext
from connectrpc.server import ConnectASGIApplication, Endpoint
from google.protobuf import json_format
from google.protobuf.descriptor import MethodDescriptor
from google.protobuf.message import DecodeError, Message

from lmserve.server.errors import InvalidArgument
from lmserve.server.front.api.http.calls import CallFailed, HttpCalls
from lmserve.server.front.api.http.failures import Failure
from lmserve.server.front.api.servicer import LanguageModelServicer, RpcContext
from lmserve.v1 import lm_service_pb2 as pb

if TYPE_CHECKING:  # connectrpc types its ASGI app with asgiref's types (not imported at runtime)
    from asgiref.typing import (
        ASGIReceiveCallable,
        ASGIReceiveEvent,
        ASGISendCallable,
        Scope,
    )

M = TypeVar("M", bound=Message)

SERVICE = pb.DESCRIPTOR.services_by_name["LanguageModelService"]
PATH = f"/{SERVICE.full_name}"
# Reads that change nothing: Connect lets these be GET requests (cacheable).
_NO_SIDE_EFFECTS = frozenset({"ListModels", "GetModel"})


class Undecodable:
    """What the codecs return for a body that is not the RPC's request message: the endpoint
    turns it into INVALID_ARGUMENT inside the observed call, so it is counted and logged like
    any other refusal (as the gRPC front's lenient deserializer does)."""

    __slots__ = ("message_name", "reason")

    def __init__(self, message_name: str, reason: str) -> None:
        self.message_name, self.reason = message_name, reason

    def error(self) -> InvalidArgument:
        return InvalidArgument("request", f"not a valid {self.message_name} message: {self.reason}")


# What the codecs hand connectrpc for a request body: the RPC's request message, or the marker.
Decoded: TypeAlias = Message | Undecodable
# What the servicer's method of an RPC takes: its request message, or a client stream of them.
Requests: TypeAlias = Message | AsyncIterator[Message]
# What it answers: messages, or (Score) the response's prebuilt wire bytes.
Reply: TypeAlias = Message | bytes
# The servicer's method of an RPC, looked up by the RPC's name: it takes that RPC's request
# message (the one class the codecs decode for it, `method.input_type`), so the pairing is by
# name, not by type; unary-answered methods are coroutines, streaming ones async generators.
UnaryHandler: TypeAlias = Callable[[Requests, RpcContext], Awaitable[Reply]]
StreamHandler: TypeAlias = Callable[[Requests, RpcContext], AsyncIterator[Reply]]
Context: TypeAlias = RequestContext[Decoded, Message]
# What connectrpc's application takes (its public `Endpoint` is the base of these four).
AnyEndpoint: TypeAlias = (
    EndpointUnary[Decoded, Message]
    | EndpointClientStream[Decoded, Message]
    | EndpointServerStream[Decoded, Message]
    | EndpointBidiStream[Decoded, Message]
)


class JsonCodec:
    """proto3 JSON for google.protobuf messages: compact, and strict about unknown fields."""

    def name(self) -> str:
        return "json"

    def encode(self, message: Message) -> bytes:
        return json_format.MessageToJson(message, indent=None).encode()

    def decode(self, data: bytes | bytearray, message_class: type[M]) -> M | Undecodable:
        message = message_class()
        try:
            json_format.Parse(bytes(data), message)
        except json_format.ParseError as exc:
            return Undecodable(message.DESCRIPTOR.full_name, str(exc))
        return message


class ProtoCodec:
    """Binary protobuf (`application/proto`), for Connect and gRPC-Web clients that send it."""

    def name(self) -> str:
        return "proto"

    def encode(self, message: Message) -> bytes:
        return message.SerializeToString()

    def decode(self, data: bytes | bytearray, message_class: type[M]) -> M | Undecodable:
        try:
            return message_class.FromString(bytes(data))
        except DecodeError as exc:
            return Undecodable(message_class.DESCRIPTOR.full_name, str(exc))


def checked(request: Decoded) -> Message:
    """`request`, or the INVALID_ARGUMENT its body deserves (`Undecodable`)."""
    if isinstance(request, Undecodable):
        raise request.error()
    return request


async def _checked_stream(requests: AsyncIterator[Decoded]) -> AsyncIterator[Message]:
    """A client stream's messages, each checked; a stream whose bytes are not a Connect
    envelope stream (bad flags, a truncated envelope, a length past the body's end) is the
    client's error: INVALID_ARGUMENT naming what was wrong, never a server fault."""
    try:
        async for request in requests:
            yield checked(request)
    except ConnectError as exc:  # raised by the envelope reader over the request body
        raise InvalidArgument("request", f"malformed request stream: {exc.message}") from None


def _requests(request: Decoded | AsyncIterator[Decoded]) -> Requests:
    """A unary call's request, checked; or a client stream's messages, each checked as read."""
    if isinstance(request, Message | Undecodable):
        return checked(request)
    return _checked_stream(request)


class _Context:
    """The servicer's view of a Connect call (`servicer.RpcContext`): its deadline."""

    __slots__ = ("_ctx",)

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx

    def time_remaining(self) -> float | None:
        remaining_ms = self._ctx.timeout_ms
        return None if remaining_ms is None else remaining_ms / 1000


def connect_error(failure: Failure, ctx: Context) -> ConnectError:
    """The Connect error for `failure` (its `Retry-After` a response header)."""
    retry_after = failure.retry_after_header()
    if retry_after is not None:
        ctx.response_headers["retry-after"] = retry_after
    name = "CANCELED" if failure.code.name == "CANCELLED" else failure.code.name
    return ConnectError(Code[name], failure.message)


def _response(message: Message | bytes, output: type[Message]) -> Message:
    """Score answers with prebuilt wire bytes (for gRPC); the codecs want the message."""
    return output.FromString(message) if isinstance(message, bytes) else message


def _headers(ctx: Context) -> dict[str, str]:
    return {key: ctx.request_headers.get(key) or "" for key in ("x-request-id", "authorization")}


def _endpoint(
    method: MethodDescriptor, servicer: LanguageModelServicer, calls: HttpCalls
) -> AnyEndpoint:
    name = method.name
    request_class: type[Message] = getattr(pb, method.input_type.name)
    response_class: type[Message] = getattr(pb, method.output_type.name)
    streams_out = method.server_streaming
    info: MethodInfo[Decoded, Message] = MethodInfo(
        name=name,
        service_name=SERVICE.full_name,
        input=request_class,
        output=response_class,
        idempotency_level=(
            IdempotencyLevel.NO_SIDE_EFFECTS
            if name in _NO_SIDE_EFFECTS
            else IdempotencyLevel.UNKNOWN
        ),
        stream_type=(
            (StreamType.BIDI_STREAM if streams_out else StreamType.CLIENT_STREAM)
            if method.client_streaming
            else (StreamType.SERVER_STREAM if streams_out else StreamType.UNARY)
        ),
    )

    if not streams_out:
        unary: UnaryHandler = getattr(servicer, name)

        async def answer(request: Decoded | AsyncIterator[Decoded], ctx: Context) -> Message:
            try:
                async with calls.call(name, _headers(ctx)) as call:
                    ctx.response_headers["x-request-id"] = call.info.request_id
                    return _response(await unary(_requests(request), _Context(ctx)), response_class)
            except CallFailed as failed:
                raise connect_error(failed.failure, ctx) from None

        if info.stream_type is StreamType.UNARY:
            return Endpoint.unary(info, answer)
        return Endpoint.client_stream(info, answer)

    streaming: StreamHandler = getattr(servicer, name)

    async def stream(
        request: Decoded | AsyncIterator[Decoded], ctx: Context
    ) -> AsyncIterator[Message]:
        try:
            async with calls.call(name, _headers(ctx)) as call:
                ctx.response_headers["x-request-id"] = call.info.request_id
                async for message in streaming(_requests(request), _Context(ctx)):
                    yield _response(message, response_class)
        except CallFailed as failed:
            raise connect_error(failed.failure, ctx) from None

    if info.stream_type is StreamType.SERVER_STREAM:
        return Endpoint.server_stream(info, stream)
    return Endpoint.bidi_stream(info, stream)


class ConnectService(ConnectASGIApplication[LanguageModelServicer]):
    """The ASGI app answering `/lmserve.v1.LanguageModelService/*` (mounted by `front`)."""

    def __init__(
        self, servicer: LanguageModelServicer, calls: HttpCalls, *, max_message_bytes: int
    ) -> None:
        def endpoints(service: LanguageModelServicer) -> dict[str, AnyEndpoint]:
            return {
                f"{PATH}/{method.name}": _endpoint(method, service, calls)
                for method in SERVICE.methods
            }

        super().__init__(
            service=servicer,
            endpoints=endpoints,
            read_max_bytes=max_message_bytes,
            codecs=[ProtoCodec(), JsonCodec()],
        )

    @property
    def path(self) -> str:
        return PATH

    async def __call__(
        self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        """A server-streaming call's one enveloped request is checked here before connectrpc
        reads it: a compressed flag without `connect-content-encoding` is the client's
        INVALID_ARGUMENT (connectrpc answers it `internal`). Client streams are checked as
        they are read (`_checked_stream`)."""
        if scope["type"] == "http" and scope.get("path") in _SERVER_STREAMING:
            headers = dict(scope.get("headers") or ())
            encoding = headers.get(b"connect-content-encoding", b"identity")
            content_type = headers.get(b"content-type", b"")
            if content_type.startswith(b"application/connect+") and encoding == b"identity":
                limit = self._read_max_bytes or 2**31
                body, receive = await _buffered(receive, limit)
                if body[:1] and body[0] & 0x01:
                    await _stream_error(
                        send,
                        content_type,
                        "invalid_argument",
                        "request: malformed request stream: a compressed message without "
                        "connect-content-encoding",
                    )
                    return
        await super().__call__(scope, receive, send)


# The methods whose one request connectrpc reads as an envelope before calling us.
_SERVER_STREAMING = {
    f"{PATH}/{m.name}" for m in SERVICE.methods if m.server_streaming and not m.client_streaming
}


async def _buffered(receive: ASGIReceiveCallable, limit: int) -> tuple[bytes, ASGIReceiveCallable]:
    """The request body (up to `limit` + 1 bytes read), and a `receive` that replays it."""
    chunks: list[bytes] = []
    size = 0
    more = True
    while more and size <= limit:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunk = message.get("body", b"")
        chunks.append(chunk)
        size += len(chunk)
        more = message.get("more_body", False)
    body = b"".join(chunks)
    replayed = False

    async def replay() -> ASGIReceiveEvent:
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": more}
        return await receive()

    return body, replay


async def _stream_error(
    send: ASGISendCallable, content_type: bytes, code: str, message: str
) -> None:
    """A Connect streaming answer that is only its end-of-stream error."""
    payload = json.dumps({"error": {"code": code, "message": message}}).encode()
    body = struct.pack(">BI", 0x02, len(payload)) + payload
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", content_type),
                (b"content-length", str(len(body)).encode()),
            ],
            "trailers": False,  # ASGI's defaults, which asgiref's event types spell out
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})
