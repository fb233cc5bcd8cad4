"""The OpenAI-compatible API under `/v1`, answered by the gRPC servicer's own methods.

    GET  /v1/models              the READY models (ListModels), OpenAI's list format
    GET  /v1/models/{id}         one model (GetModel)
    POST /v1/completions         legacy completions (Generate; Score for `echo`), JSON or SSE

Every call goes through `HttpCalls` ("Models" or "Completions"): bearer token, request id
(`x-request-id`, echoed), metrics and access log as on the gRPC port. Errors are OpenAI's
`{"error": {"message", "type", "param", "code"}}` with the HTTP status of the servicer's gRPC
code (`Failure.http_status`; `Retry-After` on a full queue). A stream answers only after every
prompt's Generate has accepted its request, so a refused request is an error status, never a
200 stream; a failure once streaming is one `data: {"error": ...}` event, then `data: [DONE]`
(as vLLM does). A client that disconnects cancels its generations, streamed or not.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncGenerator, Awaitable, Mapping
from datetime import datetime
from typing import NotRequired, TypedDict, TypeVar

import grpc
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route
from starlette.types import Receive, Scope, Send

from lmserve.server.call_context import current_call
from lmserve.server.errors import Cancelled, RequestTooLarge
from lmserve.server.front.api.http.calls import REQUEST_ID_HEADER, CallFailed, HttpCalls
from lmserve.server.front.api.http.openai_completions import (
    Choice,
    ChoiceObject,
    CompletionSteps,
    prompt_steps,
)
from lmserve.server.front.api.http.openai_schema import (
    CompletionRequest,
    param_of,
    parse_completion,
)
from lmserve.server.front.api.servicer import LanguageModelServicer, NoDeadline
from lmserve.v1 import lm_service_pb2 as pb

T = TypeVar("T")
DONE = "data: [DONE]\n\n"
_ERROR_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    429: "rate_limit_error",
}


class ErrorObject(TypedDict):
    message: str
    type: str
    param: str | None
    code: str


class ErrorBody(TypedDict):
    """OpenAI's error answer."""

    error: ErrorObject


class ModelObject(TypedDict):
    """A model as `/v1/models` lists it (OpenAI's fields, then lmserve's)."""

    id: str
    object: str
    created: int
    owned_by: str
    root: str
    parent: None
    version: str
    kind: str
    vocab_size: int
    ready: bool
    load_error: NotRequired[str]


class CompletionHead(TypedDict):
    """What every answer of one completion request starts with."""

    id: str
    object: str
    created: int
    model: str


class Usage(TypedDict):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class Completion(CompletionHead):
    """A whole (not streamed) completion."""

    choices: list[ChoiceObject]
    usage: Usage


def error_body(failed: CallFailed) -> ErrorBody:
    """OpenAI's error object for a failed call; `param` is the request field at fault."""
    failure, cause = failed.failure, failed.__cause__
    status = failure.http_status
    param = param_of(cause)
    message = failure.message
    field = getattr(cause, "field", None)
    if param is not None and isinstance(field, str) and message.startswith(field):
        message = param + message[len(field.split("[", 1)[0]) :]
    code = failure.code.name.lower()
    if failure.code is grpc.StatusCode.NOT_FOUND:
        param, code = "model", "model_not_found"
    kind = _ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    if status == 429 and failure.retry_after is None:
        kind = "invalid_request_error"  # over a size limit: retrying cannot help
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(failed: CallFailed) -> JSONResponse:
    headers = {}
    retry_after = failed.failure.retry_after_header()
    if retry_after is not None:
        headers["retry-after"] = retry_after
    call = current_call()  # begun by `calls.call` in this task, even when it refused the call
    if call is not None:
        headers[REQUEST_ID_HEADER] = call.request_id
    return JSONResponse(error_body(failed), failed.failure.http_status, headers)


def _epoch(rfc3339: str) -> int:
    try:
        return int(datetime.fromisoformat(rfc3339).timestamp())
    except ValueError:
        return 0


def model_object(info: pb.ModelInfo) -> ModelObject:
    """A model as OpenAI lists it, with what lmserve knows besides."""
    answer: ModelObject = {
        "id": info.name,
        "object": "model",
        "created": _epoch(info.provenance.created),
        "owned_by": "lmserve",
        "root": info.name,
        "parent": None,
        "version": info.version,
        "kind": pb.ModelKind.Name(info.kind).removeprefix("MODEL_KIND_").lower(),
        "vocab_size": info.vocab_size,
        "ready": info.state == pb.MODEL_STATE_READY,
    }
    if info.load_error:
        answer["load_error"] = info.load_error
    return answer


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused past `limit` bytes (the gRPC port's message size limit)."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            declared = request.headers.get("content-length", "")
            total = int(declared) if declared.isdigit() else size
            raise RequestTooLarge("body", total, limit, "bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def _until_disconnected(request: Request, work: Awaitable[T]) -> T:
    """`work`'s result; cancelled (and Cancelled raised) if the client disconnects first.
    The body is read by now, so the next ASGI message is the disconnect."""

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for pending in (task, watch):
            pending.cancel()
    if not task.done() or task.cancelled():
        with contextlib.suppress(asyncio.CancelledError):
            await task
        raise Cancelled("the client disconnected")
    return task.result()


class _Events(StreamingResponse):
    """Server-sent events from a started generator, closed however the response ends (a
    client that left mid-write, or before the first one, would leave it suspended): closing
    it ends the call and cancels the generations."""

    def __init__(self, first: str, events: AsyncGenerator[str, None], headers: dict[str, str]):
        self._events = events

        async def body() -> AsyncGenerator[str, None]:
            yield first
            async for event in events:
                yield event

        headers = headers | {"cache-control": "no-cache"}
        super().__init__(body(), media_type="text/event-stream", headers=headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._events.aclose()


class CompletionAnswer:
    """One request's envelope (id, time, model) and choices, answered whole or streamed."""

    def __init__(self, body: CompletionRequest, request_id: str, prompts: int) -> None:
        self.body = body
        self.head: CompletionHead = {
            "id": f"cmpl-{request_id}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": body.model,
        }
        logprobs = body.logprobs is not None
        self.choices = [Choice(i, logprobs) for i in range(prompts * body.n)]
        self.prompt_tokens = self.completion_tokens = 0

    def usage(self) -> Usage:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }

    async def deltas(self, steps: CompletionSteps) -> AsyncGenerator[list[ChoiceObject], None]:
        """Each step's choices as deltas, counting usage."""
        async with contextlib.aclosing(steps.iterate()) as each:
            async for step in each:
                out = []
                for index, piece in step:
                    self.prompt_tokens += piece.prompt_tokens
                    self.completion_tokens += piece.completion_tokens
                    out.append(self.choices[index].add(piece))
                yield out

    async def whole(self, steps: CompletionSteps) -> Completion:
        """The answer once every choice finished."""
        await steps.start()
        async with contextlib.aclosing(self.deltas(steps)) as deltas:
            async for _ in deltas:
                pass
        choices = [choice.result() for choice in self.choices]
        return {**self.head, "choices": choices, "usage": self.usage()}

    async def events(
        self, call: contextlib.AsyncExitStack, steps: CompletionSteps
    ) -> AsyncGenerator[str, None]:
        """The SSE stream; `call` (the open `HttpCalls` call) ends with the last choice."""
        with_usage = self.body.stream_options is not None and self.body.stream_options.include_usage
        extra: dict[str, None] = {"usage": None} if with_usage else {}
        try:
            async with call, contextlib.aclosing(self.deltas(steps)) as deltas:
                async for choices in deltas:
                    yield _event({**self.head, "choices": choices, **extra})
        except CallFailed as failed:
            yield _event(error_body(failed))
            yield DONE
            return
        if with_usage:
            yield _event({**self.head, "choices": [], "usage": self.usage()})
        yield DONE


def _event(data: Mapping[str, object]) -> str:
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n"


async def _separator(servicer: LanguageModelServicer, body: CompletionRequest) -> str:
    """What goes between an echoed prompt and its completion: a space, unless the model reads
    characters or a checkpoint's own tokens (then the completion brings its own spacing)."""
    if not body.echo or body.max_tokens == 0:
        return ""
    answer = await servicer.GetModel(pb.GetModelRequest(model=body.model), NoDeadline())
    spaced_by_tokens = (pb.TOKENIZER_KIND_CHARACTER, pb.TOKENIZER_KIND_HUGGINGFACE)
    return "" if answer.model.tokenizer.kind in spaced_by_tokens else " "


def openai_routes(
    servicer: LanguageModelServicer, calls: HttpCalls, *, max_message_bytes: int
) -> list[BaseRoute]:
    """The `/v1` routes."""

    async def list_models(request: Request) -> Response:
        try:
            async with calls.call("Models", request.headers) as call:
                answer = await servicer.ListModels(pb.ListModelsRequest(), NoDeadline())
        except CallFailed as failed:
            return error_response(failed)
        data = [model_object(m) for m in answer.models if m.state == pb.MODEL_STATE_READY]
        return JSONResponse(
            {"object": "list", "data": data}, headers={REQUEST_ID_HEADER: call.info.request_id}
        )

    async def get_model(request: Request) -> Response:
        try:
            async with calls.call("Models", request.headers) as call:
                model = request.path_params["model"]
                answer = await servicer.GetModel(pb.GetModelRequest(model=model), NoDeadline())
        except CallFailed as failed:
            return error_response(failed)
        return JSONResponse(
            model_object(answer.model), headers={REQUEST_ID_HEADER: call.info.request_id}
        )

    async def completions(request: Request) -> Response:
        try:
            async with contextlib.AsyncExitStack() as stack:
                call = await stack.enter_async_context(calls.call("Completions", request.headers))
                headers = {REQUEST_ID_HEADER: call.info.request_id}
                body = parse_completion(await read_body(request, max_message_bytes))
                prompts = body.prompts()
                separator = await _separator(servicer, body)
                steps = CompletionSteps(
                    [
                        prompt_steps(servicer, body, i, prompt, separator)
                        for i, prompt in enumerate(prompts)
                    ]
                )
                completion = CompletionAnswer(body, call.info.request_id, len(prompts))
                if not body.stream:
                    answer = await _until_disconnected(request, completion.whole(steps))
                    return JSONResponse(answer, headers=headers)
                await _until_disconnected(request, steps.start())
                events = completion.events(stack.pop_all(), steps)
                first = await anext(events)  # started: from here on, closing it ends the call
                return _Events(first, events, headers)
        except CallFailed as failed:
            return error_response(failed)

    return [
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/models/{model:path}", get_model, methods=["GET"]),
        Route("/v1/completions", completions, methods=["POST"]),
    ]
