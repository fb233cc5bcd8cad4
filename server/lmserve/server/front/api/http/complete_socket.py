"""Autocomplete from a browser: `/ws/complete`, a WebSocket carrying one Complete stream.

    ws://host:8080/ws/complete?access_token=TOKEN       (or an `authorization` header)
    -> {"model": "kjv-lstm", "k": 3, "partialWord": "sa", "sequence": "1"}
    <- {"sessionId": "kjv-lstm/...", "completions": [{"word": "said", "logProb": -0.4}, ...],
        "sequence": "1", "model": "kjv-lstm"}

Each text frame is one `lmserve.v1.CompleteRequest` in proto3 JSON, each answer one
`CompleteResponse` (the Connect front's codec: camelCase names, unknown fields refused). The
frames are the request iterator of the gRPC servicer's own `Complete`, so the semantics are the
gRPC stream's: every message answered in order, the latest keystroke wins (older waiting ones
answered `skipped`), rollback, a session rebuilt from `context`, sessions that outlive the
socket. The socket is one call (`HttpCalls`: request id, token, metrics, access log); closing
it after the last answer ends the call OK.

A failure (a refused token, a frame that is not a CompleteRequest, a field the servicer
refuses) is answered with one frame `{"error": {"code": "invalid_argument", "message": ...}}`
(Connect's code names) and the socket closed: 1008 (policy) for the caller's mistakes, 1011
for the server's own, 1013 (try again later) for overload and unavailability. The session
stays usable from a new socket, as after a failed gRPC stream.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator
from typing import cast

import grpc
from starlette.routing import BaseRoute, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from lmserve.server.errors import InvalidArgument
from lmserve.server.front.api.http.calls import REQUEST_ID_HEADER, CallFailed, HttpCalls
from lmserve.server.front.api.http.connect_service import JsonCodec, Undecodable
from lmserve.server.front.api.http.failures import Failure
from lmserve.server.front.api.servicer import LanguageModelServicer, NoDeadline
from lmserve.v1 import lm_service_pb2 as pb

PATH = "/ws/complete"
# Close codes (RFC 6455 7.4.1): the caller's mistake, the server's, a busy or leaving server.
POLICY, INTERNAL, TRY_AGAIN_LATER = 1008, 1011, 1013
_SERVER_SIDE = {
    grpc.StatusCode.INTERNAL: INTERNAL,
    grpc.StatusCode.UNKNOWN: INTERNAL,
    grpc.StatusCode.DATA_LOSS: INTERNAL,
    grpc.StatusCode.UNAVAILABLE: TRY_AGAIN_LATER,
    grpc.StatusCode.RESOURCE_EXHAUSTED: TRY_AGAIN_LATER,
}
# A close frame's reason: at most 123 bytes of UTF-8.
_REASON_BYTES = 123
_CODEC = JsonCodec()


def authorization_of(websocket: WebSocket) -> str | None:
    """The `authorization` header, else `?access_token=` as a bearer token (a browser's
    WebSocket cannot set headers)."""
    header = websocket.headers.get("authorization")
    if header:
        return header
    token = websocket.query_params.get("access_token")
    return None if token is None else f"Bearer {token}"


def error_frame(failure: Failure) -> str:
    """`{"error": {"code": ..., "message": ...}}`, codes as Connect names them."""
    code = "canceled" if failure.code is grpc.StatusCode.CANCELLED else failure.code.name.lower()
    return json.dumps({"error": {"code": code, "message": failure.message}})


def close_reason(failure: Failure) -> str:
    """The close frame's reason: the code and as much of the message as fits."""
    reason = f"{failure.code.name.lower()}: {failure.message}"
    return reason.encode()[:_REASON_BYTES].decode(errors="ignore")


async def _requests(websocket: WebSocket) -> AsyncIterator[pb.CompleteRequest]:
    """The socket's frames as CompleteRequests, until the client closes it."""
    while True:
        message = await websocket.receive()
        if message["type"] == "websocket.disconnect":
            return
        text = message.get("text")
        if text is None:
            raise InvalidArgument(
                "frame", "is binary; send each CompleteRequest as a text frame of proto3 JSON"
            )
        request = _CODEC.decode(text.encode(), pb.CompleteRequest)
        if isinstance(request, Undecodable):
            raise InvalidArgument(
                "frame", f"is not a CompleteRequest in proto3 JSON: {request.reason}"
            )
        assert isinstance(request, pb.CompleteRequest)
        yield request


async def _refuse(websocket: WebSocket, failure: Failure) -> None:
    """The error frame, then the close (a client already gone is left alone)."""
    try:
        if websocket.application_state is WebSocketState.CONNECTING:
            await websocket.accept()
        await websocket.send_text(error_frame(failure))
        await websocket.close(_SERVER_SIDE.get(failure.code, POLICY), close_reason(failure))
    except (WebSocketDisconnect, RuntimeError):
        pass  # the client is gone


def complete_socket_routes(servicer: LanguageModelServicer, calls: HttpCalls) -> list[BaseRoute]:
    """The `/ws/complete` route, answered by `servicer.Complete`."""

    async def complete_socket(websocket: WebSocket) -> None:
        headers = {REQUEST_ID_HEADER: websocket.headers.get(REQUEST_ID_HEADER, "")}
        try:
            async with calls.call(
                "Complete", headers, authorization=authorization_of(websocket)
            ) as call:
                request_id = call.info.request_id.encode()
                await websocket.accept(headers=[(REQUEST_ID_HEADER.encode(), request_id)])
                # An async generator (closed here when the client leaves mid-answer).
                answers = cast(
                    AsyncGenerator[pb.CompleteResponse, None],
                    servicer.Complete(_requests(websocket), NoDeadline()),  # sockets have none
                )
                try:
                    async with contextlib.aclosing(answers):
                        async for response in answers:
                            await websocket.send_text(_CODEC.encode(response).decode())
                except WebSocketDisconnect:
                    # The client left while it was being answered: a cancelled gRPC stream.
                    call.finish(grpc.StatusCode.CANCELLED.name)
                    return
        except CallFailed as failed:
            await _refuse(websocket, failed.failure)
            return
        if websocket.client_state is WebSocketState.CONNECTED:
            with contextlib.suppress(WebSocketDisconnect, RuntimeError):
                await websocket.close()

    return [WebSocketRoute(PATH, complete_socket)]
