"""`WorkerEngine`: a model's engine as the front holds it, its worker watched and restarted.

    engine = WorkerEngine(spec, pool)        # `pool.WorkerPool` makes one per model
    scores = await engine.score(prepared, deadline)        # the same calls as `EngineCore`

Each call is carried to the worker over its socket (`connection.WorkerConnection`); the worker
is started by `launch`.

Supervision: a worker that dies fails its calls and streams in flight with UNAVAILABLE (the
connection), its model's health goes NOT_SERVING, and a new worker starts after a backoff
(0.5 s, doubling, at most 8 s); once it is READY the model serves again. A worker that dies more
than `max_restarts` times within `restart_window_seconds` marks its model failed, with the
reason in ListModels and GetModel, instead of restarting forever; a reload (SIGHUP) starts it
afresh. The front's death ends every worker (`worker_process`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

from lmserve.server.errors import ModelUnavailable
from lmserve.server.front.workers.calls import EngineCalls
from lmserve.server.front.workers.connection import WorkerConnection
from lmserve.server.front.workers.launch import (
    Launched,
    ModelLoadFailed,
    Process,
    WorkerSettings,
    WorkerStartError,
    exit_description,
    handshake,
    launch,
    wait_exit,
)
from lmserve.server.shared import protocol as p
from lmserve.server.shared.stats import EngineStats
from lmserve.server.worker.limits import EngineLimits
from lmserve.server.worker.process import WorkerSpec

log = logging.getLogger(__name__)

MIN_BACKOFF_SECONDS = 0.5
MAX_BACKOFF_SECONDS = 8.0


class WorkerHost(Protocol):
    """What a `WorkerEngine` asks of whoever keeps it (`pool.WorkerPool`): declared here, so
    that the pool imports the supervisor and never the reverse."""

    settings: WorkerSettings
    limits: EngineLimits
    loop: asyncio.AbstractEventLoop

    def published(self, engine: WorkerEngine, address: str) -> None: ...
    def load_failed(self, engine: WorkerEngine, reason: str) -> None: ...
    def forget(self, engine: WorkerEngine) -> None: ...
    def restarted(self, engine: WorkerEngine) -> None: ...
    def health(self, name: str, serving: bool) -> None: ...
    def on_loop_thread(self) -> bool: ...
    def on_loop(self, callback: Callable[[], None]) -> None: ...


class WorkerEngine(EngineCalls):
    """One model's engine in a worker process (see the module doc); front's event loop only,
    except `start` and `join` (blocking, off the loop) and `engine_stats` (any thread)."""

    def __init__(self, spec: WorkerSpec, pool: WorkerHost) -> None:
        self.spec = spec
        self.name = spec.name
        self._pool = pool
        self._process: Process | None = None
        self._connection: WorkerConnection | None = None
        self._deaths: deque[float] = deque()
        self._closing = False
        self._restart: asyncio.Task[None] | None = None
        self._stats: EngineStats | None = None
        self._why = "its engine worker is starting"
        # Why the model stopped serving for good (ServedModels shows it FAILED), else None;
        # `load_error` when the worker could not load it.
        self.failure: str | None = None
        self.load_error: str | None = None

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
        if wait_exit(process, timeout) is None:
            log.warning("model %s: engine worker %d did not stop; killing it", self.name, self.pid)
            process.kill()
            wait_exit(process, 1.0)

    # -- starting ------------------------------------------------------------------------------

    async def attach(self, launched: Launched) -> None:
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
        self._pool.published(self, launched.address)
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

    def load_failed(self, reason: str) -> None:
        """The worker could not load the model (a broken file): the model is FAILED with the
        load error until a reload; health NOT_SERVING (on the loop)."""
        self.failure = self.load_error = reason
        self._why = reason
        self._pool.load_failed(self, reason)
        self._pool.health(self.name, False)

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
            await asyncio.to_thread(wait_exit, process, 2.0)
            log.warning(
                "model %s: engine worker %d %s; restarting in %.1f s",
                self.name,
                process.pid,
                exit_description(process),
                backoff,
            )
        await asyncio.sleep(backoff)
        if self._closing:
            return
        try:
            launched = await asyncio.to_thread(self.start_blocking)
        except ModelLoadFailed as exc:
            self.load_failed(str(exc))
            return
        except WorkerStartError as exc:
            self._died(str(exc))
            return
        await self.attach(launched)
        if self._closing:
            return
        self._pool.restarted(self)

    def start_blocking(self) -> Launched:
        """Starts a worker and waits until it is READY (blocking, off the loop)."""
        launched = launch(self.spec)
        handshake(launched, self._pool.settings.start_timeout_seconds)
        return launched

    def _close_on_loop(self) -> None:
        if self._restart is not None:
            self._restart.cancel()
        if self._connection is not None:
            self._connection.close()

    # -- observability -------------------------------------------------------------------------

    def engine_stats(self, timeout: float = 2.0) -> EngineStats | None:
        """The worker's engine stats now (its last ones when asked on the loop or it is busy;
        None while it has no live worker)."""
        connection = self._connection
        if connection is None or connection.lost or self._closing:
            return None
        if self._pool.on_loop_thread():
            return self._stats
        future = asyncio.run_coroutine_threadsafe(
            connection.call(p.MetricsCall, p.MetricsReply), self._pool.loop
        )
        try:
            # Pickled: `EngineStats` with its histograms (see `shared.protocol`).
            self._stats = pickle.loads(future.result(timeout).stats)
        except Exception:  # the worker died or is busy: the last ones
            future.cancel()
        return self._stats

    def rss_bytes(self) -> float:
        """The worker's resident memory (Linux /proc), NaN when unknown."""
        pid = self.pid
        try:
            with open(f"/proc/{pid}/statm") as statm:
                return float(int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE"))
        except (OSError, ValueError, IndexError):
            return float("nan")
