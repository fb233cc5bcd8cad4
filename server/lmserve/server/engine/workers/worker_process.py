"""The engine worker: one process per served model, running its `EngineCore`.

    python -m lmserve.server.engine.workers.worker_process FD   # `supervisor` starts it

FD is its end of a socketpair; the first frame on it is its `WorkerSpec`. It loads its model
(and a mixture's components) from the model folders, answers READY (or FAILED with the load
error), then serves the front over its socket until the front says STOP
or goes away. Its own event loop runs the engine's async parts (scoring queue, beam searches,
autocomplete sessions); a reader thread takes the front's frames off the socket, and every
thread that has something to say (the loop, the generation scheduler) sends it under one lock
with a blocking `sendall`, which releases the GIL while the kernel copies. The generation
scheduler's hand-over of a step is ONE frame for every stream (`WirePoster`).

It outlives no front: the front's end of the socket closes when the front exits for any
reason (SIGKILL included), the reader sees end-of-file and the worker exits at once. SIGINT and
SIGTERM are ignored: a Ctrl-C or a signal to the whole process group reaches the front, which
drains through its workers and then stops them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import setproctitle

from lmserve.server.engine.core import EngineCore
from lmserve.server.engine.generation.delivery import Items, Poster
from lmserve.server.engine.generation.sequence import (
    FinishEvent,
    GenerationRequest,
    GenerationStream,
)
from lmserve.server.engine.limits import EngineLimits
from lmserve.server.engine.stats import EngineStats
from lmserve.server.engine.workers.wire import (
    Kind,
    frame,
    pack_events,
    picklable_error,
    recv_frame,
)
from lmserve.server.logging_setup import setup_logging
from lmserve.server.long_lived import freeze_long_lived
from lmserve.server.registry.repository import LoadOptions, ModelEntry, ModelState, load_entry

log = logging.getLogger(__name__)

# The calls the front may make (`Kind.CALL`): EngineCore's async methods, and "metrics" (a
# snapshot of the engine's `EngineStats`: plain data, exported to Prometheus in the front).
_CALLS = frozenset({"score", "prefix_totals", "beam_search", "complete", "metrics"})


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker needs to serve one model: its folders (a mixture's components first,
    the model last), how to load them, and the limits its engine keeps."""

    name: str
    folders: tuple[Path, ...]
    load_options: LoadOptions
    limits: EngineLimits
    niceness: int = 0
    log_level: str = "INFO"
    log_format: str = "text"


class _Sender:
    """Frames to the front from any thread, one whole frame at a time."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._lock = threading.Lock()

    def send(self, message: tuple[Any, ...]) -> None:
        data = frame(message)
        with self._lock:
            try:
                self._sock.sendall(data)
            except OSError:  # the front is gone: the reader sees it and ends the process
                pass


class _WireStream(GenerationStream):
    """A worker's side of one Generate stream: its events go to the front under `sid`, and
    the front's reports of what its handler took drive the scheduler's backpressure."""

    def __init__(self, request: GenerationRequest, samples: int, sid: int, sender: _Sender) -> None:
        self.sid = sid
        self._sender = sender
        self._waker: Any = None
        super().__init__(request, samples)

    @property
    def waker(self) -> Any:
        return self._waker

    @waker.setter
    def waker(self, value: Any) -> None:
        # Parking sets it (the stream is parked), release clears it: the front reports every
        # take while parked, so the stream resumes as soon as its reader caught up.
        if (value is None) != (self._waker is None):
            self._sender.send((Kind.PARKED, self.sid, value is not None))
        self._waker = value

    def finished_by(self, item: list[Any] | BaseException) -> bool:
        """Scheduler thread: counts the samples that ended in a hand-over; True once all did."""
        if isinstance(item, BaseException):
            self._unfinished = 0
        else:
            self._unfinished -= sum(isinstance(e, FinishEvent) for e in item)
        return self._unfinished <= 0

    def took(self, taken: int) -> None:
        """The front's handler has taken `taken` events (called on the worker's loop)."""
        self.taken = taken
        waker = self._waker
        if waker is not None and self.unread < self.resume_below:
            waker()


class WirePoster(Poster):
    """Hands every stream's events of one scheduler iteration to the front as one frame, and
    forgets the streams whose samples all ended (`streams`: the worker's, by id)."""

    def __init__(self, sender: _Sender, streams: dict[int, _WireStream]) -> None:
        super().__init__(courier=False, name="")
        self._sender = sender
        self._streams = streams

    def post(self, items: Items) -> None:
        if not items:
            return
        handed: list[tuple[int, Any, bool]] = []
        for stream, item in items:
            sid = stream.sid  # type: ignore[attr-defined]
            done = stream.finished_by(item)  # type: ignore[attr-defined]
            if done:
                self._streams.pop(sid, None)
            if isinstance(item, BaseException):
                handed.append((sid, picklable_error(item), True))
            else:
                handed.append((sid, pack_events(item), done))
        self._sender.send((Kind.EVENTS, handed))


class _WorkerServer:
    """Dispatches the front's messages to the engine, on the worker's event loop."""

    def __init__(
        self,
        core: EngineCore,
        sender: _Sender,
        loop: asyncio.AbstractEventLoop,
        streams: dict[int, _WireStream],
    ) -> None:
        self.core = core
        self.sender = sender
        self.loop = loop
        self.calls: dict[int, asyncio.Task[None]] = {}
        self.streams = streams  # open streams by id; the poster drops the finished ones
        self.stopped = asyncio.Event()

    def dispatch(self, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == Kind.CALL:
            _, rid, method, args = message
            task = self.loop.create_task(self._call(rid, method, args))
            self.calls[rid] = task
        elif kind == Kind.TAKEN:
            _, sid, taken = message
            stream = self.streams.get(sid)
            if stream is not None:
                stream.took(taken)
        elif kind == Kind.GENERATE:
            self._generate(*message[1:])
        elif kind == Kind.STREAM_CANCEL:
            stream = self.streams.pop(message[1], None)
            if stream is not None:
                stream.cancel()
        elif kind == Kind.CANCEL:
            call = self.calls.get(message[1])
            if call is not None:
                call.cancel()
        elif kind == Kind.STOP:
            self.stopped.set()

    async def _call(self, rid: int, method: str, args: tuple[Any, ...]) -> None:
        try:
            if method not in _CALLS:
                raise RuntimeError(f"no engine call {method!r}")
            if method == "metrics":
                result: Any = self.core.stats.snapshot()
            elif method == "prefix_totals":
                ids, offsets, eos, deadline = args
                result = await self.core.prefix_totals(ids, offsets, eos=eos, deadline=deadline)
            else:
                result = await getattr(self.core, method)(*args)
        except asyncio.CancelledError:
            return  # the front's caller left: nobody reads an answer
        except Exception as exc:
            self.sender.send((Kind.ERROR, rid, picklable_error(exc)))
        else:
            self.sender.send((Kind.REPLY, rid, result))
        finally:
            self.calls.pop(rid, None)

    def _generate(self, sid: int, request: GenerationRequest) -> None:
        sender = self.sender

        def make_stream(request: GenerationRequest, samples: int) -> GenerationStream:
            stream = _WireStream(request, samples, sid, sender)
            self.streams[sid] = stream
            return stream

        try:
            self.core.generate(request, make_stream)
        except Exception as exc:  # Overloaded: the stream fails before its first token
            self.streams.pop(sid, None)
            sender.send((Kind.EVENTS, [(sid, picklable_error(exc), True)]))


def _load(spec: WorkerSpec) -> ModelEntry:
    loaded: dict[str, ModelEntry] = {}
    entry: ModelEntry | None = None
    for folder in spec.folders:
        entry = load_entry(folder, spec.load_options, loaded)
        loaded[entry.name] = entry
    assert entry is not None
    return entry


def _read_front(sock: socket.socket, server: _WorkerServer) -> None:
    """The reader thread: the front's frames onto the loop; end-of-file ends the process."""
    loop = server.loop
    while True:
        try:
            message = recv_frame(sock)
        except OSError:
            message = None
        if message is None:  # the front exited (or closed us): no worker outlives it
            os._exit(0)
        loop.call_soon_threadsafe(server.dispatch, message)


def main(fd: int) -> None:
    """The worker process's entry point (see the module doc)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sock = socket.socket(fileno=fd)
    sock.setblocking(True)
    first = recv_frame(sock)
    if first is None:  # the front went away before it said what to serve
        os._exit(0)
    run_worker(first[0], sock)


def run_worker(spec: WorkerSpec, sock: socket.socket) -> None:
    """Loads the model and serves the front until STOP or end-of-file."""
    setproctitle.setproctitle(f"lmserve: engine {spec.name}")  # what `ps` shows
    if spec.niceness:
        os.nice(spec.niceness)  # the front first when both want the cores
    setup_logging(spec.log_level, spec.log_format)
    sender = _Sender(sock)
    entry = _load(spec)
    if entry.state is not ModelState.READY:
        sender.send((Kind.FAILED, entry.load_error))
        os._exit(1)
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    streams: dict[int, _WireStream] = {}
    core = EngineCore(
        entry, spec.limits, EngineStats(entry.name), poster=WirePoster(sender, streams)
    )
    server = _WorkerServer(core, sender, loop, streams)
    threading.Thread(target=_read_front, args=(sock, server), daemon=True).start()
    freeze_long_lived()  # the model is loaded: full collections need not walk it
    sender.send((Kind.READY, os.getpid()))
    loop.run_until_complete(server.stopped.wait())
    core.close()
    core.join(5.0)
    os._exit(0)


if __name__ == "__main__":
    main(int(sys.argv[1]))
