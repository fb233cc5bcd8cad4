"""The engine worker: one process per served model, running its `EngineCore`.

    main(FD)   # in a fork of `worker.forkserver` (`front.workers.launch` asks for one)

FD is its end of a socketpair; the first frame on it is `protocol.Start` (its `WorkerSpec`).
It loads its model (and a mixture's components) from the model folders, answers `Ready` (or
`Failed` with the load error), then serves the front over its socket until the front says
`Stop` or goes away. Messages are the typed frames of `shared.protocol`, dispatched by type.

What it answers is built here, where it is computed: a Generate stream's messages and a Score's
response go to the front as protobuf wire bytes (`worker.replies`), which the front writes to
the call as they are. A scheduler hand-over is ONE `Events` frame for every stream.

Its own event loop runs the engine's async parts (scoring queue, beam searches, autocomplete
sessions); a reader thread takes the front's frames off the socket, and every thread that has
something to say (the loop, the generation scheduler) sends it under one lock with a blocking
`sendall`, which releases the GIL while the kernel copies.

It outlives no front: the front's end of the socket closes when the front exits for any
reason (SIGKILL included), the reader sees end-of-file and the worker exits at once. SIGINT and
SIGTERM are ignored: a Ctrl-C or a signal to the whole process group reaches the front, which
drains through its workers and then stops them.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import pickle
import signal
import socket
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np
import setproctitle

from lmserve.server.decoding.bias import BiasMatch
from lmserve.server.errors import DeadlineExceeded, LmServeError
from lmserve.server.logging_setup import log_failure, setup_logging
from lmserve.server.long_lived import freeze_long_lived
from lmserve.server.registry.repository import LoadOptions, ModelEntry, ModelState, load_entry
from lmserve.server.shared import protocol as p
from lmserve.server.shared.stats import EngineStats
from lmserve.server.worker.core import EngineCore
from lmserve.server.worker.generation.delivery import Items, Poster
from lmserve.server.worker.generation.sequence import (
    Event,
    GenerationRequest,
    GenerationStream,
)
from lmserve.server.worker.limits import EngineLimits
from lmserve.server.worker.replies.generate import rendered

log = logging.getLogger(__name__)
# Numbers the fronts' connections: Fuse streams are keyed by connection and the front's id.
_SERVERS = itertools.count(1)


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
    # Where the other front processes (`fronts: N`) connect; empty: only the first front.
    listen_address: str = ""


class _Sender:
    """Frames to the front from any thread, one whole frame at a time."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._lock = threading.Lock()

    def send(self, message: msgspec.Struct) -> None:
        data = p.encode(message)
        with self._lock:
            try:
                self._sock.sendall(data)
            except OSError:  # the front is gone: the reader sees it and ends the process
                pass


class _WireStream(GenerationStream):
    """A worker's side of one Generate stream: its events become GenerateResponse bytes for the
    front that opened it (`server`) under `sid`, and that front's reports of what its handler
    took drive the scheduler's backpressure."""

    def __init__(
        self,
        request: GenerationRequest,
        samples: int,
        sid: int,
        server: _WorkerServer,
    ) -> None:
        self.sid = sid
        self.server = server
        self._waker: Callable[[], None] | None = None
        super().__init__(request, samples)

    @property
    def waker(self) -> Callable[[], None] | None:
        return self._waker

    @waker.setter
    def waker(self, value: Callable[[], None] | None) -> None:
        # Parking sets it (the stream is parked), release clears it: the front reports every
        # take while parked, so the stream resumes as soon as its reader caught up.
        if (value is None) != (self._waker is None):
            self.server.sender.send(p.Parked(self.sid, value is not None))
        self._waker = value

    def chunk(self, item: list[Event] | BaseException) -> p.StreamChunk:
        """Scheduler thread: the hand-over as the front receives it; counts ended samples."""
        if isinstance(item, BaseException):
            self._unfinished = 0
            return p.StreamChunk(self.sid, [], 0, 0, False, True, p.ErrorInfo.of(item))
        try:
            serialized = rendered(
                item, self.server.words, self.request.params, self.request.deadline
            )
        except DeadlineExceeded as exc:
            self._unfinished = 0
            return p.StreamChunk(self.sid, [], 0, 0, False, True, p.ErrorInfo.of(exc))
        self._unfinished -= serialized.finished
        last = self._unfinished <= 0
        return p.StreamChunk(
            self.sid,
            serialized.messages,
            serialized.events,
            serialized.finished,
            serialized.open_tail,
            last,
        )

    def took(self, taken: int) -> None:
        """The front's handler has taken `taken` events (called on the worker's loop)."""
        self.taken = taken
        waker = self._waker
        if waker is not None and self.unread < self.resume_below:
            waker()


class WirePoster(Poster):
    """Hands every stream's messages of one scheduler iteration to the fronts that opened
    them: one `Events` frame per front, and forgets the streams that ended."""

    def __init__(self) -> None:
        super().__init__(courier=False, name="")

    def post(self, items: Items) -> None:
        if not items:
            return
        by_front: dict[_WorkerServer, list[p.StreamChunk]] = {}
        for stream, item in items:
            server: _WorkerServer = stream.server  # type: ignore[attr-defined]
            chunk = stream.chunk(item)  # type: ignore[attr-defined]
            if chunk.last:
                server.streams.pop(chunk.sid, None)
            by_front.setdefault(server, []).append(chunk)
        for server, chunks in by_front.items():
            server.sender.send(p.Events(chunks))


class _WorkerServer:
    """Dispatches the front's messages to the engine by their type, on the worker's loop."""

    def __init__(
        self,
        core: EngineCore,
        sender: _Sender,
        loop: asyncio.AbstractEventLoop,
        stopped: asyncio.Event,
    ) -> None:
        self.core = core
        self.sender = sender
        self.loop = loop
        self.calls: dict[int, asyncio.Task[None]] = {}
        # This front's open streams by its ids; the poster drops the finished ones.
        self.streams: dict[int, _WireStream] = {}
        self.stopped = stopped
        self.words = core.token_texts
        # This front's open Fuse streams: its id for each -> the rid of its call in flight.
        self.fusions: dict[int, int | None] = {}
        self._serial = next(_SERVERS)

    def close(self) -> None:
        """This front went away (another front's connection closed): its work stops."""
        for task in list(self.calls.values()):
            task.cancel()
        streams, self.streams = self.streams, {}
        for stream in streams.values():
            stream.cancel()
        for session in list(self.fusions):
            self._close_fusion(session)

    def _fusion_key(self, session: int) -> tuple[int, int]:
        """The engine's key of this front's stream `session` (each front numbers its own)."""
        return (self._serial, session)

    def _close_fusion(self, session: int) -> None:
        """A Fuse stream ended: its call in flight (even one not started) is cancelled, so it
        never reopens the session, and its states are released."""
        rid = self.fusions.pop(session, None)
        call = None if rid is None else self.calls.get(rid)
        if call is not None:
            call.cancel()
        self.core.fuse_close(self._fusion_key(session))

    def dispatch(self, message: p.ToWorker) -> None:
        match message:
            case p.Taken(sid, taken):
                stream = self.streams.get(sid)
                if stream is not None:
                    stream.took(taken)
            case p.Generate():
                self._generate(message)
            case p.StreamCancel(sid):
                cancelled = self.streams.pop(sid, None)
                if cancelled is not None:
                    cancelled.cancel()
            case p.Cancel(rid):
                call = self.calls.get(rid)
                if call is not None:
                    call.cancel()
            case p.FuseClose(session):
                self._close_fusion(session)
            case p.Stop():
                self.stopped.set()
            case p.Start():  # only ever a connection's first frame (`main`)
                raise RuntimeError("a Start frame after the worker started")
            case _:
                rid = message.rid
                if isinstance(message, p.FuseCall):
                    self.fusions[message.session] = rid
                self.calls[rid] = self.loop.create_task(self._call(rid, message))

    async def _call(self, rid: int, message: p.Call) -> None:
        try:
            reply = await self._answer(rid, message)
        except asyncio.CancelledError:
            return  # the front's caller left: nobody reads an answer
        except Exception as exc:
            if not isinstance(exc, LmServeError):  # a fault: its traceback stays in this log
                log_failure(log, f"{type(message).__name__} on {self.core.name}", exc)
            self.sender.send(p.ErrorReply(rid, p.ErrorInfo.of(exc)))
        else:
            self.sender.send(reply)
        finally:
            self.calls.pop(rid, None)

    async def _answer(self, rid: int, message: p.Call) -> p.Reply:
        core = self.core
        match message:
            case p.ScoreResponseCall(_, work, model, bias, deadline):
                prepared = p.prepared_of(work)
                matches = None if bias is None else [BiasMatch(b.boost, b.phrases) for b in bias]
                response = await core.score_response(prepared, model, matches, deadline)
                return p.ScoreReply(rid, response)
            case p.ScoreCall(_, work, deadline):
                return p.batch_scores_reply(rid, await core.score(p.prepared_of(work), deadline))
            case p.PrefixTotalsCall(_, ids, offsets, eos, deadline):
                totals = await core.prefix_totals(
                    ids.of_type(np.int32), offsets.of_type(np.int64), eos=eos, deadline=deadline
                )
                return p.PrefixTotalsReply(rid, p.Array.of(totals.totals), totals.computed)
            case p.BeamSearchCall(_, prompt_ids, params, deadline):
                found = await core.beam_search(prompt_ids, params, deadline)
                return p.BeamSearchReply(rid, list(found))
            case p.RescoreLatticesCall(_, lattices, params, deadline):
                results = await core.rescore_lattices(lattices, params, deadline)
                return p.RescoreLatticesReply(rid, results)
            case p.CompleteCall(_, edit):
                return p.CompleteReply(rid, await core.complete(edit))
            case p.FuseCall(_, session, step):
                answer = await core.fuse(self._fusion_key(session), step)
                return p.FuseReply.of(rid, answer)
            case p.MetricsCall():
                return p.MetricsReply(rid, pickle.dumps(core.stats.snapshot(), protocol=5))
        raise RuntimeError(f"no engine call {type(message).__name__}")

    def _generate(self, message: p.Generate) -> None:
        sender, sid = self.sender, message.sid
        request = GenerationRequest(
            message.prompt_ids, message.params, message.deadline, message.arrived
        )

        def make_stream(request: GenerationRequest, samples: int) -> GenerationStream:
            stream = _WireStream(request, samples, sid, self)
            self.streams[sid] = stream
            return stream

        try:
            self.core.generate(request, make_stream)
        except Exception as exc:  # Overloaded: the stream fails before its first token
            self.streams.pop(sid, None)
            error = p.ErrorInfo.of(exc)
            sender.send(p.Events([p.StreamChunk(sid, [], 0, 0, False, True, error)]))


def _load(spec: WorkerSpec) -> ModelEntry:
    loaded: dict[str, ModelEntry] = {}
    entry: ModelEntry | None = None
    for folder in spec.folders:
        entry = load_entry(folder, spec.load_options, loaded)
        loaded[entry.name] = entry
    assert entry is not None
    return entry


def _read_front(sock: socket.socket, server: _WorkerServer, *, primary: bool) -> None:
    """A reader thread: one front's frames onto the loop. The first front's end-of-file ends
    the process (no worker outlives its front); another front's closes its connection."""
    loop = server.loop
    decode = p.decoder(p.TO_WORKER)
    while True:
        try:
            message = p.recv_frame(sock, decode)
        except OSError:
            message = None
        if message is None:
            if primary:
                os._exit(0)
            loop.call_soon_threadsafe(server.close)
            sock.close()
            return
        loop.call_soon_threadsafe(server.dispatch, message)


def _serve(
    sock: socket.socket,
    core: EngineCore,
    loop: asyncio.AbstractEventLoop,
    stopped: asyncio.Event,
    *,
    primary: bool,
) -> _WorkerServer:
    """Serves one front's connection (its own calls and streams) on a reader thread."""
    server = _WorkerServer(core, _Sender(sock), loop, stopped)
    name = "lmserve-front-reader" if primary else "lmserve-extra-front-reader"
    threading.Thread(
        target=_read_front, args=(sock, server), kwargs={"primary": primary}, name=name,
        daemon=True,
    ).start()  # fmt: skip
    return server


def _accept_fronts(
    listener: socket.socket,
    core: EngineCore,
    loop: asyncio.AbstractEventLoop,
    stopped: asyncio.Event,
) -> None:
    """The other fronts (`fronts: N`) connect here; each gets its own connection."""
    while True:
        try:
            sock, _ = listener.accept()
        except OSError:
            return
        sock.setblocking(True)
        p.tune_socket(sock)
        _serve(sock, core, loop, stopped, primary=False)


def _listen(address: str) -> socket.socket | None:
    """The socket other fronts connect to (a Linux abstract address: nothing on disk)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(address)
    except OSError as exc:
        log.error("cannot listen for other fronts on %r: %s", address, exc)
        listener.close()
        return None
    listener.listen(16)
    return listener


def main(fd: int) -> None:
    """The worker process's entry point (see the module doc)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sock = socket.socket(fileno=fd)
    sock.setblocking(True)
    first = p.recv_frame(sock, p.decoder(p.TO_WORKER))
    if not isinstance(first, p.Start):  # the front went away before it said what to serve
        os._exit(0)
    # Run as `python -m`, this module is `__main__`: the spec unpickles as the class of the
    # module under its own name (pickle imports it), so that is the class to check it against.
    from lmserve.server.worker.process import WorkerSpec as Spec

    run_worker(first.worker_spec(Spec), sock)


def run_worker(spec: WorkerSpec, sock: socket.socket) -> None:
    """Loads the model and serves the fronts until Stop or the first front's end-of-file."""
    setproctitle.setproctitle(f"lmserve: engine {spec.name}")  # what `ps` shows
    if spec.niceness:
        os.nice(spec.niceness)  # the front first when both want the cores
    setup_logging(spec.log_level, spec.log_format)
    entry = _load(spec)
    if entry.state is not ModelState.READY:
        _Sender(sock).send(p.Failed(entry.load_error))
        os._exit(1)
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    stopped = asyncio.Event()
    core = EngineCore(entry, spec.limits, EngineStats(entry.name), poster=WirePoster())
    first = _serve(sock, core, loop, stopped, primary=True)
    address = ""
    if spec.listen_address:
        listener = _listen(spec.listen_address)
        if listener is not None:
            address = spec.listen_address
            threading.Thread(
                target=_accept_fronts, args=(listener, core, loop, stopped), daemon=True
            ).start()
    # The model is loaded: full collections need not walk it (nor what the fork server froze).
    freeze_long_lived(thaw=False)
    first.sender.send(p.Ready(os.getpid(), address))
    loop.run_until_complete(stopped.wait())
    core.close()
    core.join(5.0)
    os._exit(0)


if __name__ == "__main__":
    main(int(sys.argv[1]))
