"""The front's end of one engine worker's socket: calls, streams, and what a death means.

    connection = WorkerConnection(name, on_lost)                  # an asyncio.Protocol
    reply = await connection.call(lambda rid: ScoreCall(rid, work, deadline), BatchScoresReply)
    stream = connection.open_stream(request)                      # fed by `Events` frames

Everything here runs on the front's event loop: frames arrive through `data_received` (no
thread, no extra wake-up), are cut and decoded into `shared.protocol` types by
`protocol.FrameReader`, and are dispatched by type. One `Events` frame carries a scheduler
hand-over for every stream: each stream's chunk (its GenerateResponse bytes, built by the
worker) goes to that stream's queue, where the gRPC handler takes the bytes and writes them as
they are. When the worker goes away, every call and stream in flight fails with
ModelUnavailable (UNAVAILABLE: the client's retry policy resends idempotent calls) and
`on_lost` tells the supervisor.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

import msgspec

from lmserve.server.errors import ModelUnavailable
from lmserve.server.shared import protocol as p
from lmserve.server.worker.generation.sequence import (
    GenerationRequest,
    GenerationStream,
)

log = logging.getLogger(__name__)

R = TypeVar("R", bound=p.Reply)


class WorkerStream(GenerationStream):
    """A Generate stream whose scheduler (and message building) is in a worker: its chunks
    arrive as GenerateResponse bytes; cancelling tells the worker, and what the handler takes
    is reported back for the worker's backpressure."""

    def __init__(self, request: GenerationRequest, connection: WorkerConnection, sid: int) -> None:
        super().__init__(request, request.params.n)
        self._connection = connection
        self.sid = sid
        self._chunks: deque[p.StreamChunk | BaseException] = deque()
        # Reports are sent every `_report_every` events taken, and after every take while the
        # worker has the stream parked (so it resumes as soon as the reader caught up).
        limit = connection.max_unread_events
        self._report_every = max(1, limit // 4)
        self._reported = 0
        self.parked = False

    def cancel(self) -> None:
        if not self.cancelled:
            self.cancelled = True
            self._connection.cancel_stream(self.sid)

    def on_taken(self) -> None:
        if self.parked or self.taken - self._reported >= self._report_every:
            self._reported = self.taken
            self._connection.notify(p.Taken(self.sid, self.taken))

    def deliver(self, chunk: p.StreamChunk | BaseException) -> None:
        """A chunk from the worker (on the loop)."""
        self._chunks.append(chunk)
        self._arrived.set()

    async def messages(self) -> AsyncIterator[list[bytes]]:
        """The stream's messages as the worker built them. Chunks that piled up while the
        handler was busy go out together; an open last message (no sample ended in it) takes
        the next chunk's first message into it, by concatenating their bytes (protobuf merges
        them: the tokens append)."""
        chunks = self._chunks
        try:
            while self._unfinished > 0:
                if not chunks:
                    self._arrived.clear()
                    await self._arrived.wait()
                    continue
                out: list[bytes] = []
                open_tail = False
                taken = 0
                while chunks:
                    chunk = chunks[0]
                    if isinstance(chunk, BaseException):
                        if out:
                            break  # what came before it first
                        chunks.popleft()
                        raise chunk
                    chunks.popleft()
                    if chunk.error is not None:
                        if out:
                            chunks.appendleft(chunk.error.error())
                            break
                        self._unfinished = 0
                        raise chunk.error.error()
                    messages = chunk.messages
                    if open_tail and out and messages:
                        out[-1] += messages[0]
                        out.extend(messages[1:])
                    else:
                        out.extend(messages)
                    open_tail = chunk.open_tail if messages else open_tail
                    taken += chunk.events
                    self._unfinished -= chunk.finished
                    if chunk.last:
                        self._unfinished = 0
                self.taken += taken
                self.on_taken()
                if out:
                    yield out
        finally:
            if self._unfinished > 0:  # the consumer left early (client gone, error)
                self.cancel()


class WorkerConnection(asyncio.Protocol):
    """One worker's socket, as seen from the front's event loop (see the module doc)."""

    def __init__(
        self,
        name: str,
        on_lost: Callable[[WorkerConnection], None],
        *,
        max_unread_events: int,
    ) -> None:
        self.name = name
        self.max_unread_events = max_unread_events
        self._on_lost = on_lost
        self._reader = p.FrameReader(p.TO_FRONT)
        self._transport: asyncio.Transport | None = None
        self._ids = itertools.count(1)
        self._calls: dict[int, asyncio.Future[p.Reply]] = {}
        self._streams: dict[int, WorkerStream] = {}
        self.lost = False
        # Why the worker went away, for the errors of what was in flight (the supervisor
        # fills in the exit status once it knows it).
        self.lost_reason = "its engine worker stopped"

    # -- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        for message in self._reader.feed(data):
            self._dispatch(message)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._on_lost(self)  # sets lost_reason from the exit status where it can
        error = ModelUnavailable(
            f"model {self.name!r}: {self.lost_reason} during the request; "
            "retry: it is being restarted"
        )
        calls, self._calls = self._calls, {}
        for future in calls.values():
            if not future.done():
                future.set_exception(error)
        streams, self._streams = self._streams, {}
        for stream in streams.values():
            stream.deliver(error)

    # -- the front's side ------------------------------------------------------------------------

    def send(self, message: msgspec.Struct) -> None:
        transport = self._transport
        if transport is None or self.lost or transport.is_closing():
            raise ModelUnavailable(
                f"model {self.name!r}: {self.lost_reason}; retry: it is being restarted"
            )
        transport.write(p.encode(message))

    def notify(self, message: msgspec.Struct) -> None:
        """`send` for what needs no answer and is moot once the worker is gone (cancels,
        backpressure reports): never raises, so it is safe in `finally` blocks."""
        if not self.lost:
            with contextlib.suppress(ModelUnavailable):
                self.send(message)

    async def call(self, make: Callable[[int], p.Call], reply: type[R]) -> R:
        """Sends the call `make(rid)` and returns the worker's reply, of the `protocol.Reply`
        type `reply` the call is answered with; an `ErrorReply` is raised here as the error it
        carries. A caller that leaves (cancelled) cancels the worker's task too."""
        rid = next(self._ids)
        future: asyncio.Future[p.Reply] = asyncio.get_running_loop().create_future()
        message = make(rid)
        self.send(message)
        self._calls[rid] = future
        try:
            answer = await future
        except asyncio.CancelledError:
            self.notify(p.Cancel(rid))
            raise
        finally:
            self._calls.pop(rid, None)
        if not isinstance(answer, reply):
            raise RuntimeError(
                f"model {self.name!r}: its engine worker answered {type(message).__name__} "
                f"with {type(answer).__name__}, not {reply.__name__}"
            )
        return answer

    def open_stream(self, request: GenerationRequest) -> WorkerStream:
        sid = next(self._ids)
        stream = WorkerStream(request, self, sid)
        self.send(
            p.Generate(sid, request.prompt_ids, request.params, request.deadline, request.arrived)
        )
        self._streams[sid] = stream
        return stream

    def cancel_stream(self, sid: int) -> None:
        if self._streams.pop(sid, None) is not None:
            self.notify(p.StreamCancel(sid))

    def close(self) -> None:
        """Asks the worker to close its engine and exit (it drains nothing more)."""
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.write(p.encode(p.Stop()))

    # -- frames from the worker ----------------------------------------------------------------

    def _dispatch(self, message: p.ToFront) -> None:
        match message:
            case p.Events(chunks):
                streams = self._streams
                for chunk in chunks:
                    stream = streams.pop(chunk.sid, None) if chunk.last else streams.get(chunk.sid)
                    if stream is not None:  # else cancelled meanwhile
                        stream.deliver(chunk)
            case p.ErrorReply(rid, error):
                future = self._calls.get(rid)
                if future is not None and not future.done():
                    future.set_exception(error.error())
            case p.Parked(sid, parked):
                stream = self._streams.get(sid)
                if stream is not None:
                    stream.parked = parked
                    stream.on_taken()  # it may have caught up already
            case p.Ready() | p.Failed():
                log.error("model %s: a second hello from its engine worker", self.name)
            case _:
                future = self._calls.get(message.rid)
                if future is not None and not future.done():
                    future.set_result(message)
