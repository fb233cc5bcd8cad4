"""The front's end of one engine worker's socket: calls, streams, and what a death means.

    connection = WorkerConnection(name, on_lost)           # an asyncio.Protocol
    scores = await connection.call("score", prepared, deadline)
    stream = connection.open_stream(request)               # a GenerationStream, fed by frames

Everything here runs on the front's event loop: frames arrive through `data_received` (no
thread, no extra wake-up) and are cut by `wire.FrameReader`. One `Kind.EVENTS` frame carries a
scheduler step's events for every stream; each goes to its stream's hand-over queue, where the
gRPC handler takes it as it would from an in-process scheduler. When the worker goes away, every
call and stream in flight fails with ModelUnavailable (UNAVAILABLE: the client's retry policy
resends idempotent calls) and `on_lost` tells the supervisor.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable
from typing import Any

from lmserve.server.engine.generation.sequence import (
    GenerationRequest,
    GenerationStream,
)
from lmserve.server.engine.workers.wire import FrameReader, Kind, frame, unpack_events
from lmserve.server.errors import ModelUnavailable

log = logging.getLogger(__name__)


class WorkerStream(GenerationStream):
    """A Generate stream whose scheduler is in a worker: cancelling tells the worker, and
    what the handler takes is reported back for the worker's backpressure."""

    def __init__(self, request: GenerationRequest, connection: WorkerConnection, sid: int) -> None:
        super().__init__(request, request.params.n)
        self._connection = connection
        self.sid = sid
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
            self._connection.notify((Kind.TAKEN, self.sid, self.taken))


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
        self._reader = FrameReader()
        self._transport: asyncio.Transport | None = None
        self._ids = itertools.count(1)
        self._calls: dict[int, asyncio.Future[Any]] = {}
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
            stream._put(error)

    # -- the front's side ------------------------------------------------------------------------

    def send(self, message: tuple[Any, ...]) -> None:
        transport = self._transport
        if transport is None or self.lost or transport.is_closing():
            raise ModelUnavailable(
                f"model {self.name!r}: {self.lost_reason}; retry: it is being restarted"
            )
        transport.write(frame(message))

    def notify(self, message: tuple[Any, ...]) -> None:
        """`send` for what needs no answer and is moot once the worker is gone (cancels,
        backpressure reports): never raises, so it is safe in `finally` blocks."""
        if not self.lost:
            with contextlib.suppress(ModelUnavailable):
                self.send(message)

    async def call(self, method: str, *args: Any) -> Any:
        """`EngineCore.<method>(*args)` in the worker; its exception is raised here. A caller
        that leaves (cancelled) cancels the worker's task too."""
        rid = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.send((Kind.CALL, rid, method, args))
        self._calls[rid] = future
        try:
            return await future
        except asyncio.CancelledError:
            self.notify((Kind.CANCEL, rid))
            raise
        finally:
            self._calls.pop(rid, None)

    def open_stream(self, request: GenerationRequest) -> WorkerStream:
        sid = next(self._ids)
        stream = WorkerStream(request, self, sid)
        self.send((Kind.GENERATE, sid, request))
        self._streams[sid] = stream
        return stream

    def cancel_stream(self, sid: int) -> None:
        if self._streams.pop(sid, None) is not None:
            self.notify((Kind.STREAM_CANCEL, sid))

    def close(self) -> None:
        """Asks the worker to close its engine and exit (it drains nothing more)."""
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.write(frame((Kind.STOP,)))

    # -- frames from the worker ----------------------------------------------------------------

    def _dispatch(self, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == Kind.EVENTS:
            streams = self._streams
            for sid, item, last in message[1]:
                stream = streams.pop(sid, None) if last else streams.get(sid)
                if stream is None:
                    continue  # cancelled meanwhile
                stream._put(item if isinstance(item, BaseException) else unpack_events(item))
        elif kind == Kind.REPLY or kind == Kind.ERROR:
            future = self._calls.get(message[1])
            if future is None or future.done():
                return
            if kind == Kind.REPLY:
                future.set_result(message[2])
            else:
                future.set_exception(message[2])
        elif kind == Kind.PARKED:
            stream = self._streams.get(message[1])
            if stream is not None:
                stream.parked = message[2]
                stream.on_taken()  # it may have caught up already
        else:
            log.error("model %s: unexpected frame %r from its engine worker", self.name, kind)
