"""Autocomplete sessions: one `Complete` stream kept open while a user types.

    with LmServeClient("localhost:50051") as client, client.complete("kjv-5gram") as s:
        s.type("in the beg")        # -> [Completion("beginning", -0.9), ...]
        s.accept("beginning")       # commits the word; suggestions for the next one
        s.backspace()               # the last word becomes the partial word again

Every edit is one message on the stream and one answer. The session's committed context is
kept here too (from each answer's `appended_tokens` and from rollbacks), so that when the
stream breaks because the server went away (UNAVAILABLE) or cancelled it, the edit is sent
again, once, on a new stream with the whole context: the server (the same one restarted, or
another replica) rebuilds the session and the caller sees an ordinary answer.
"""

from __future__ import annotations

import asyncio
import queue
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Self

import grpc
import grpc.aio

from lmserve.client.completion_types import Completion
from lmserve.client.errors import LmServeClientError, error_for_status, from_rpc_error
from lmserve.v1 import lm_service_pb2 as pb

# The statuses after which an edit is sent again on a new stream: the server is gone (or
# restarting), or it cancelled the stream (shutting down, or shedding it).
RESUMABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED})
_EOF: Any = grpc.aio.EOF  # type: ignore[attr-defined]  # (missing from grpc-stubs)
_LAST_SPACE = re.compile(r"\s(?=\S*$)")


class StreamEnded(Exception):
    """The server closed the stream without an answer or a status: treated as UNAVAILABLE."""


@dataclass(frozen=True)
class _Edit:
    """One message's changes and what the session becomes once it is answered."""

    request: pb.CompleteRequest
    partial: str
    rollback: int = 0
    reset: bool = False


class _Keystrokes:
    """The session as the client sees it and the message each edit sends: no I/O, shared by
    the sync and the asyncio sessions."""

    def __init__(
        self,
        model: str,
        k: int,
        session_id: str | None,
        user_words: Sequence[str] | None = None,
        cache_weight: float | None = None,
    ) -> None:
        self.model = model
        self.k = k
        self.session_id = session_id or ""
        self.context: list[str] = []
        # Finished sentences (each reset moves the context here): the adaptive cache's input,
        # sent with the context when a stream opens so that any replica rebuilds the same cache.
        self.history: list[list[str]] = []
        self.user_words = list(user_words) if user_words is not None else None
        self.cache_weight = cache_weight
        self.partial = ""
        self.sequence = 0
        # Whether `context` is known to be the server's (False while a caller-given session
        # has not been answered yet): only a known context is sent to rebuild a session.
        self.context_known = not session_id

    def _edit(self, partial: str, k: int | None = None, **fields: Any) -> _Edit:
        self.sequence += 1
        rollback = fields.get("rollback_tokens", 0)
        request = pb.CompleteRequest(
            partial_word=partial, k=self.k if k is None else k, sequence=self.sequence, **fields
        )
        return _Edit(request, partial, rollback, bool(fields.get("reset", False)))

    def type(self, text: str) -> _Edit:
        """Typed characters: up to the last whitespace is committed, the rest is the partial."""
        typed = self.partial + text
        last = _LAST_SPACE.search(typed)
        if last is None:
            return self._edit(typed)
        return self._edit(typed[last.end() :], append_text=typed[: last.end()])

    def backspace(self, n: int) -> _Edit:
        """`n` characters deleted: from the partial word, and on an empty one the last
        committed token is rolled back and becomes the partial word (the space is deleted)."""
        partial, rollback = self.partial, 0
        for _ in range(n):
            if partial:
                partial = partial[:-1]
            elif rollback < len(self.context):
                rollback += 1
                partial = self.context[-rollback]
        return self._edit(partial, rollback_tokens=rollback) if rollback else self._edit(partial)

    def suggest(self, partial: str, k: int | None) -> _Edit:
        return self._edit(partial, k)

    def accept(self, word: str) -> _Edit:
        return self._edit("", append_text=word)

    def reset(self) -> _Edit:
        return self._edit("", reset=True)

    def opening(self, edit: _Edit) -> pb.CompleteRequest:
        """The edit as a new stream's first message: model, session and (when known) the
        context before the edit, so that any replica can rebuild the session."""
        request = pb.CompleteRequest()
        request.CopyFrom(edit.request)
        request.model = self.model
        request.session_id = self.session_id
        if self.user_words is not None:
            request.user_words.tokens.extend(self.user_words)
        if self.cache_weight is not None:
            request.cache_weight = self.cache_weight
        if self.context_known:
            request.context.tokens.extend(self.context)
            request.history.SetInParent()
            for sentence in self.history:
                request.history.sentences.add(tokens=sentence)
        return request

    def answered(self, edit: _Edit, response: pb.CompleteResponse) -> list[Completion]:
        """Applies an answered edit to the session and returns its completions."""
        if edit.reset:
            if self.context:
                self.history.append(list(self.context))
            self.context.clear()
        if edit.rollback:
            del self.context[-edit.rollback :]
        self.context.extend(response.appended_tokens)
        self.partial = edit.partial
        self.session_id = response.session_id or self.session_id
        self.context_known = True
        return [Completion(c.word, c.log_prob) for c in response.completions]


def _resumable(exc: BaseException) -> bool:
    if isinstance(exc, StreamEnded):
        return True
    code = getattr(exc, "code", None)
    return isinstance(exc, grpc.RpcError) and callable(code) and code() in RESUMABLE


def _client_error(exc: grpc.RpcError | StreamEnded) -> LmServeClientError:
    if isinstance(exc, StreamEnded):
        return error_for_status(grpc.StatusCode.UNAVAILABLE, str(exc))
    return from_rpc_error(exc)


class _SyncStream:
    """One Complete call: requests through a queue that gRPC's thread drains, answers read
    in order."""

    _END = object()

    def __init__(self, method: Callable[..., Any]) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._call = method(iter(self._queue.get, self._END))
        self._answers: Iterator[pb.CompleteResponse] = iter(self._call)

    def ask(self, request: pb.CompleteRequest) -> pb.CompleteResponse:
        """Sends `request`; its answer (older answers, if any, passed over)."""
        self._queue.put(request)
        for response in self._answers:
            if response.sequence >= request.sequence:
                return response
        raise StreamEnded("the server ended the Complete stream")

    def close(self) -> None:
        self._queue.put(self._END)
        self._call.cancel()


class _Session:
    """What the sync and asyncio sessions share: the session as the client keeps it
    (`_Keystrokes`) and its read-only views."""

    def __init__(
        self,
        method: Callable[..., Any],
        model: str,
        *,
        k: int = 3,
        session_id: str | None = None,
        user_words: Sequence[str] | None = None,
        cache_weight: float | None = None,
    ) -> None:
        self._method = method
        self._keys = _Keystrokes(model, k, session_id, user_words, cache_weight)

    @property
    def session_id(self) -> str:
        """The server's id of the session ("" until the first answer when none was given)."""
        return self._keys.session_id

    @property
    def context(self) -> tuple[str, ...]:
        """The committed tokens, as the model tokenized them."""
        return tuple(self._keys.context)

    @property
    def history(self) -> tuple[tuple[str, ...], ...]:
        """The finished sentences (one per `reset`), as the model tokenized them."""
        return tuple(tuple(s) for s in self._keys.history)

    @property
    def partial(self) -> str:
        """The word being typed."""
        return self._keys.partial


class CompletionSession(_Session):
    """A user typing into one autocomplete session; see the module docstring.

    Every method sends one message and returns the answer's completions, best first. Not
    thread-safe: one session per typist."""

    _stream: _SyncStream | None = None

    def _send(self, edit: _Edit) -> list[Completion]:
        try:
            response = self._ask(edit)
        except (grpc.RpcError, StreamEnded) as exc:
            self._drop_stream()
            if not _resumable(exc):
                raise _client_error(exc) from None
            try:  # once, on a new stream, with the whole context
                response = self._ask(edit)
            except (grpc.RpcError, StreamEnded) as again:
                self._drop_stream()
                raise _client_error(again) from None
        return self._keys.answered(edit, response)

    def _ask(self, edit: _Edit) -> pb.CompleteResponse:
        if self._stream is None:
            self._stream = _SyncStream(self._method)
            return self._stream.ask(self._keys.opening(edit))
        return self._stream.ask(edit.request)

    def _drop_stream(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    def type(self, text: str) -> list[Completion]:
        """Characters typed: whatever ends in whitespace is committed, the rest is the partial
        word the completions start with."""
        return self._send(self._keys.type(text))

    def backspace(self, n: int = 1) -> list[Completion]:
        """`n` characters deleted; past the partial word, whole committed tokens come back."""
        return self._send(self._keys.backspace(n))

    def suggest(self, partial: str, k: int | None = None) -> list[Completion]:
        """The completions of `partial` (replacing the partial word), `k` of them this once."""
        return self._send(self._keys.suggest(partial, k))

    def accept(self, word: str) -> list[Completion]:
        """Commits `word` (a completion, say) and clears the partial word."""
        return self._send(self._keys.accept(word))

    def reset(self) -> list[Completion]:
        """Back to the start of a sentence: empty context, empty partial word."""
        return self._send(self._keys.reset())

    def close(self) -> None:
        """Ends the stream; the server keeps the session for a while (resumable by id)."""
        self._drop_stream()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class AsyncCompletionSession(_Session):
    """`CompletionSession` for asyncio: the same methods, awaited."""

    _call: Any = None

    async def _ask(self, edit: _Edit) -> pb.CompleteResponse:
        if self._call is None:
            self._call = self._method()
            request = self._keys.opening(edit)
        else:
            request = edit.request
        try:
            await self._call.write(request)
        except (grpc.RpcError, asyncio.InvalidStateError) as exc:
            # Answers (and the server's verdicts) come on read: a write fails when the call or
            # its connection is already gone (grpc.aio says INTERNAL when the server left).
            raise StreamEnded(f"the Complete stream broke: {exc}") from None
        while True:
            response = await self._call.read()
            if response is _EOF:
                raise StreamEnded("the server ended the Complete stream")
            if response.sequence >= request.sequence:
                return response

    def _drop_call(self) -> None:
        if self._call is not None:
            self._call.cancel()
            self._call = None

    async def _send(self, edit: _Edit) -> list[Completion]:
        try:
            response = await self._ask(edit)
        except (grpc.RpcError, StreamEnded) as exc:
            self._drop_call()
            if not _resumable(exc):
                raise _client_error(exc) from None
            try:
                response = await self._ask(edit)
            except (grpc.RpcError, StreamEnded) as again:
                self._drop_call()
                raise _client_error(again) from None
        return self._keys.answered(edit, response)

    async def type(self, text: str) -> list[Completion]:
        return await self._send(self._keys.type(text))

    async def backspace(self, n: int = 1) -> list[Completion]:
        return await self._send(self._keys.backspace(n))

    async def suggest(self, partial: str, k: int | None = None) -> list[Completion]:
        return await self._send(self._keys.suggest(partial, k))

    async def accept(self, word: str) -> list[Completion]:
        return await self._send(self._keys.accept(word))

    async def reset(self) -> list[Completion]:
        return await self._send(self._keys.reset())

    async def close(self) -> None:
        if self._call is not None:
            await self._call.done_writing()
        self._drop_call()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
