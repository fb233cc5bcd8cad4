"""Engine worker processes: one per served model, started, watched and restarted from here.

    pool = WorkerPool(WorkerSettings.from_settings(settings), limits, metrics, loop, on_health)
    models = ServedModels(repository, limits, metrics, engines=pool)   # a WorkerEngine each
    pool.metric_families()       # every live worker's metrics, for the front's /metrics

`WorkerEngine` is a model's engine as the front holds it: the same calls as `EngineCore`, each
carried to the worker over its socket (`connection.WorkerConnection`). A worker is a fresh
interpreter (`python -m lmserve.server.engine.workers.worker_process FD`, 0.4 s of imports
before its model loads), never a fork of the front: it inherits none of the front's threads,
sockets or gRPC state, and nothing of the program that embeds the server (multiprocessing's
fork server would import that program's main module into every worker).

Supervision: a worker that dies fails its calls and streams in flight with UNAVAILABLE (the
connection), its model's health goes NOT_SERVING, and a new worker starts after a backoff
(0.5 s, doubling, at most 8 s); once it is READY the model serves again. A worker that dies more
than `max_restarts` times within `restart_window_seconds` marks its model failed, with the
reason in ListModels and GetModel, instead of restarting forever; a reload that brings the model
again starts afresh. The front's death ends every worker (`worker_process`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import Metric

from lmserve.server.decoding.scoring import PreparedScoring
from lmserve.server.engine.autocomplete.edits import CompleteAnswer, CompleteEdit
from lmserve.server.engine.core import PrefixTotals
from lmserve.server.engine.generation.sequence import GenerationRequest, GenerationStream
from lmserve.server.engine.limits import EngineLimits
from lmserve.server.engine.served_model import ModelEngine
from lmserve.server.engine.workers.connection import WorkerConnection
from lmserve.server.engine.workers.wire import Kind, frame, recv_frame
from lmserve.server.engine.workers.worker_process import WorkerSpec
from lmserve.server.errors import ModelUnavailable
from lmserve.server.manifest import ModelKind, find_manifest, read_manifest
from lmserve.server.metrics import Metrics
from lmserve.server.registry.loaders import interpolation_components
from lmserve.server.registry.repository import LoadOptions, ModelEntry
from lmserve.server.settings import Settings

log = logging.getLogger(__name__)

_WORKER_MODULE = "lmserve.server.engine.workers.worker_process"
MIN_BACKOFF_SECONDS = 0.5
MAX_BACKOFF_SECONDS = 8.0


@dataclass(frozen=True)
class WorkerSettings:
    """How workers are started and how often one may die before its model is failed."""

    load_options: LoadOptions = LoadOptions()
    start_timeout_seconds: float = 120.0
    max_restarts: int = 5
    restart_window_seconds: float = 60.0
    niceness: int = 10
    log_level: str = "INFO"
    log_format: str = "text"

    @classmethod
    def from_settings(cls, settings: Settings) -> WorkerSettings:
        return cls(
            load_options=LoadOptions.from_settings(settings),
            start_timeout_seconds=settings.worker_start_timeout_seconds,
            max_restarts=settings.worker_max_restarts,
            restart_window_seconds=settings.worker_restart_window_seconds,
            niceness=settings.worker_niceness,
            log_level=settings.log_level,
            log_format=settings.log_format,
        )


class WorkerStartError(Exception):
    """A worker did not become READY: it failed to load its model, died, or timed out."""


@dataclass
class _Launched:
    process: subprocess.Popen[bytes]
    sock: socket.socket


class WorkerEngine:
    """One model's engine in a worker process (see the module doc); front's event loop only,
    except `start` and `join` (blocking, off the loop) and `metric_families` (any thread)."""

    def __init__(self, spec: WorkerSpec, pool: WorkerPool) -> None:
        self.spec = spec
        self.name = spec.name
        self._pool = pool
        self._process: subprocess.Popen[bytes] | None = None
        self._connection: WorkerConnection | None = None
        self._deaths: deque[float] = deque()
        self._closing = False
        self._restart: asyncio.Task[None] | None = None
        self._families: list[Metric] = []
        self._why = "its engine worker is starting"
        # Why the model stopped serving for good (ServedModels shows it FAILED), else None.
        self.failure: str | None = None
        self.restarts = 0

    @property
    def pid(self) -> int | None:
        process = self._process
        return None if process is None else process.pid

    @property
    def stopped(self) -> bool:
        """`close` was called: the worker was told to stop (or will be, once started)."""
        return self._closing

    @property
    def alive(self) -> bool:
        """The worker process runs (it may still be loading, or stopping)."""
        process = self._process
        return process is not None and process.poll() is None

    # -- ModelEngine ---------------------------------------------------------------------------

    async def score(self, prepared: PreparedScoring, deadline: float | None = None) -> Any:
        return await self._live().call("score", prepared, deadline)

    async def prefix_totals(
        self, ids: Any, offsets: Any, *, eos: bool, deadline: float | None = None
    ) -> PrefixTotals:
        totals: PrefixTotals = await self._live().call("prefix_totals", ids, offsets, eos, deadline)
        return totals

    def generate(self, request: GenerationRequest) -> GenerationStream:
        return self._live().open_stream(request)

    async def beam_search(
        self, prompt_ids: Sequence[int], params: Any, deadline: float | None
    ) -> list[Any]:
        hypotheses: list[Any] = await self._live().call(
            "beam_search", list(prompt_ids), params, deadline
        )
        return hypotheses

    async def complete(self, edit: CompleteEdit) -> CompleteAnswer:
        answer: CompleteAnswer = await self._live().call("complete", edit)
        return answer

    def close(self) -> None:
        """Asks the worker to stop (its engine closes after the pass or step in flight)."""
        self._closing = True
        self._pool.forget(self)
        self._pool.on_loop(self._close_on_loop)

    def join(self, timeout: float) -> None:
        """After `close`: waits for the worker to exit, then kills it (blocking)."""
        process = self._process
        if process is None:
            return
        if _wait(process, timeout) is None:
            log.warning("model %s: engine worker %d did not stop; killing it", self.name, self.pid)
            process.kill()
            _wait(process, 1.0)

    # -- starting ------------------------------------------------------------------------------

    def launch(self) -> _Launched:
        """Starts the worker (blocking, off the loop) and sends it its spec; `handshake` waits
        for it to be READY."""
        front, back = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        for sock in (front, back):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", _WORKER_MODULE, str(back.fileno())],
                pass_fds=[back.fileno()],
                stdin=subprocess.DEVNULL,
            )
        finally:
            back.close()  # the worker has its own copy now
        front.sendall(frame((self.spec,)))
        return _Launched(process, front)

    def handshake(self, launched: _Launched) -> None:
        """Blocks until the worker is READY; WorkerStartError when it failed or timed out."""
        sock = launched.sock
        sock.settimeout(self._pool.settings.start_timeout_seconds)
        try:
            first = recv_frame(sock)
        except TimeoutError:
            launched.process.kill()
            sock.close()
            raise WorkerStartError("its engine worker did not start in time") from None
        except OSError as exc:
            first = None
            log.debug("model %s: handshake failed: %s", self.name, exc)
        if first is None or first[0] != Kind.READY:
            _wait(launched.process, 2.0)
            why = first[1] if first is not None else _exit_description(launched.process)
            sock.close()
            raise WorkerStartError(f"its engine worker failed to start: {why}")
        sock.setblocking(False)

    async def attach(self, launched: _Launched) -> None:
        """Serves through the READY worker from now on (on the loop)."""
        if self._closing:
            launched.sock.close()
            launched.process.kill()
            return
        loop = asyncio.get_running_loop()
        limit = self._pool.limits.generation.max_unread_events
        _, connection = await loop.connect_accepted_socket(
            lambda: WorkerConnection(self.name, self._lost, max_unread_events=limit),
            sock=launched.sock,
        )
        self._process, self._connection = launched.process, connection
        self._why = ""
        log.info("model %s: engine worker %d ready", self.name, launched.process.pid)

    # -- supervision ---------------------------------------------------------------------------

    def _live(self) -> WorkerConnection:
        if self.failure is not None:
            raise ModelUnavailable(f"model {self.name!r} stopped serving: {self.failure}")
        connection = self._connection
        if connection is None or connection.lost:
            raise ModelUnavailable(
                f"model {self.name!r}: {self._why or 'its engine worker is restarting'}; "
                "retry shortly"
            )
        return connection

    def _lost(self, connection: WorkerConnection) -> None:
        """The worker's socket closed (on the loop): restart it, or fail the model."""
        if self._closing or connection is not self._connection:
            connection.lost_reason = "the model is shutting down"
            return
        connection.lost_reason = "its engine worker stopped"
        self._died("its engine worker stopped")

    def _died(self, why: str) -> None:
        self._why = f"its engine worker is restarting ({why})"
        self._pool.health(self.name, False)
        now = time.monotonic()
        deaths = self._deaths
        deaths.append(now)
        window = self._pool.settings.restart_window_seconds
        while deaths and deaths[0] < now - window:
            deaths.popleft()
        if len(deaths) > self._pool.settings.max_restarts:
            self.failure = (
                f"its engine worker died {len(deaths)} times within {window:g} s (last: {why}); "
                "see the server log, then reload the model"
            )
            log.error("model %s: %s", self.name, self.failure)
            return
        backoff = min(MAX_BACKOFF_SECONDS, MIN_BACKOFF_SECONDS * 2 ** (len(deaths) - 1))
        self._restart = asyncio.get_running_loop().create_task(self._restart_after(backoff))

    async def _restart_after(self, backoff: float) -> None:
        process = self._process
        if process is not None:
            await asyncio.to_thread(_wait, process, 2.0)
            log.warning(
                "model %s: engine worker %d %s; restarting in %.1f s",
                self.name,
                process.pid,
                _exit_description(process),
                backoff,
            )
        await asyncio.sleep(backoff)
        if self._closing:
            return
        try:
            launched = await asyncio.to_thread(self.start_blocking)
        except WorkerStartError as exc:
            self._died(str(exc))
            return
        await self.attach(launched)
        if self._closing:
            return
        self.restarts += 1
        self._pool.restarted(self)

    def start_blocking(self) -> _Launched:
        launched = self.launch()
        self.handshake(launched)
        return launched

    def _close_on_loop(self) -> None:
        if self._restart is not None:
            self._restart.cancel()
        if self._connection is not None:
            self._connection.close()

    # -- observability -------------------------------------------------------------------------

    def metric_families(self, timeout: float = 2.0) -> list[Metric]:
        """The worker's metrics now (its last ones when asked on the loop or it is busy)."""
        connection = self._connection
        if connection is None or connection.lost or self._closing:
            return []
        if self._pool.on_loop_thread():
            return self._families
        future = asyncio.run_coroutine_threadsafe(connection.call("metrics"), self._pool.loop)
        try:
            self._families = future.result(timeout)
        except Exception:  # the worker died or is busy: the last ones
            future.cancel()
        return self._families

    def rss_bytes(self) -> float:
        """The worker's resident memory (Linux /proc), NaN when unknown."""
        pid = self.pid
        try:
            with open(f"/proc/{pid}/statm") as statm:
                return float(int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE"))
        except (OSError, ValueError, IndexError):
            return float("nan")


class WorkerPool:
    """Starts a worker per model (`ServedModels`' engine factory) and knows the live ones."""

    def __init__(
        self,
        settings: WorkerSettings,
        limits: EngineLimits,
        metrics: Metrics | None,
        loop: asyncio.AbstractEventLoop,
        on_health: Callable[[str, bool], None] | None = None,
    ) -> None:
        self.settings = settings
        self.limits = limits
        self.metrics = metrics
        self.loop = loop
        self._on_health = on_health
        self._live: dict[int, WorkerEngine] = {}

    def __call__(self, entries: Sequence[ModelEntry]) -> list[ModelEngine]:
        """Starts one worker per entry, all at once, and waits until each is READY or failed
        (blocking: call off the event loop). A worker that fails to start is supervised like
        one that died: restarted with backoff, then failed."""
        assert not self.on_loop_thread(), "starting workers blocks: call it off the loop"
        engines = [WorkerEngine(self._spec(entry), self) for entry in entries]
        launched = [engine.launch() for engine in engines]
        for engine, started in zip(engines, launched, strict=True):
            try:
                engine.handshake(started)
            except WorkerStartError as exc:
                log.error("model %s: %s", engine.name, exc)
                self.on_loop(functools.partial(engine._died, str(exc)))
                continue
            asyncio.run_coroutine_threadsafe(engine.attach(started), self.loop).result()
            self._track(engine)
        return list(engines)

    def _spec(self, entry: ModelEntry) -> WorkerSpec:
        s = self.settings
        return WorkerSpec(
            entry.name,
            model_folders(entry.folder),
            s.load_options,
            self.limits,
            niceness=s.niceness,
            log_level=s.log_level,
            log_format=s.log_format,
        )

    def _track(self, engine: WorkerEngine) -> None:
        self._live[id(engine)] = engine
        if self.metrics is not None:
            name = engine.name
            self.metrics.worker_rss.labels(model=name).set_function(engine.rss_bytes)
            self.metrics.worker_restarts.labels(model=name)

    def forget(self, engine: WorkerEngine) -> None:
        if self._live.pop(id(engine), None) is not None and self.metrics is not None:
            with contextlib.suppress(KeyError):
                self.metrics.worker_rss.remove(engine.name)

    def restarted(self, engine: WorkerEngine) -> None:
        if self.metrics is not None:
            self.metrics.worker_restarts.labels(model=engine.name).inc()
        self._track(engine)
        self.health(engine.name, True)

    def health(self, name: str, serving: bool) -> None:
        if self._on_health is not None:
            self._on_health(name, serving)

    def engines(self) -> list[WorkerEngine]:
        return list(self._live.values())

    def metric_families(self) -> list[Metric]:
        """Every live worker's metrics, collected now."""
        return [family for engine in self.engines() for family in engine.metric_families()]

    def on_loop_thread(self) -> bool:
        try:
            return asyncio.get_running_loop() is self.loop
        except RuntimeError:
            return False

    def on_loop(self, callback: Callable[[], None]) -> None:
        if self.on_loop_thread():
            callback()
        elif not self.loop.is_closed():
            self.loop.call_soon_threadsafe(callback)


def model_folders(folder: Path) -> tuple[Path, ...]:
    """The folders a worker loads for the model in `folder`: a mixture's components (found
    beside it by name, recursively) first, the model last."""
    if read_manifest(folder).kind is not ModelKind.INTERPOLATED:
        return (folder,)
    siblings: dict[str, Path] = {}
    for sibling in sorted(p for p in folder.parent.iterdir() if p.is_dir()):
        if find_manifest(sibling) is not None:
            with contextlib.suppress(Exception):  # a broken sibling is no component
                siblings.setdefault(read_manifest(sibling).name, sibling)
    out: list[Path] = []

    def add(model: Path) -> None:
        manifest = read_manifest(model)
        if manifest.kind is ModelKind.INTERPOLATED:
            for name, _ in interpolation_components(model, manifest):
                if name in siblings:
                    add(siblings[name])
        if model not in out:
            out.append(model)

    add(folder)
    return tuple(out)


def _wait(process: subprocess.Popen[bytes], timeout: float) -> int | None:
    """The exit status within `timeout` s, else None (still running)."""
    try:
        return process.wait(timeout)
    except subprocess.TimeoutExpired:
        return None


def _exit_description(process: subprocess.Popen[bytes]) -> str:
    code = process.poll()
    if code is None:
        return "stopped answering"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
        return f"was killed by signal {-code}"
    return f"exited with status {code}"
