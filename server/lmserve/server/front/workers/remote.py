"""Engines of another front's workers (`fronts: N`): the other fronts connect to them.

    engines = RemoteEngines(WorkerDirectory(path), limits, loop)   # a ServedModels factory
    models = ServedModels(repository, limits, metrics, engines)

The first front starts and supervises the workers (`pool`, `supervisor`); another front only
connects to each model's worker at the address the directory gives, with the same calls
(`EngineCalls`). When that connection closes (the worker died, a reload replaced it), calls in
flight fail UNAVAILABLE as they do on the first front, and this front reconnects, reading the
address again, with a backoff (0.2 s doubling to 2 s) until it is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Sequence

from lmserve.server.errors import ModelUnavailable
from lmserve.server.front.models.served_model import ModelEngine
from lmserve.server.front.workers.calls import EngineCalls
from lmserve.server.front.workers.connection import WorkerConnection
from lmserve.server.front.workers.directory import WorkerDirectory
from lmserve.server.registry.repository import ModelEntry
from lmserve.server.shared.protocol import tune_socket
from lmserve.server.worker.limits import EngineLimits

log = logging.getLogger(__name__)

MIN_RETRY_SECONDS = 0.2
MAX_RETRY_SECONDS = 2.0


class RemoteWorkerEngine(EngineCalls):
    """A model's engine in a worker another front supervises (see the module doc)."""

    failure: str | None = None
    load_error: str | None = None

    def __init__(
        self,
        name: str,
        directory: WorkerDirectory,
        limits: EngineLimits,
        loop: asyncio.AbstractEventLoop,
        on_health: Callable[[str, bool], None] | None = None,
    ) -> None:
        self.name = name
        self._directory = directory
        self._limits = limits
        self._loop = loop
        self._on_health = on_health
        self._connection: WorkerConnection | None = None
        self._closing = False
        self._task: asyncio.Task[None] | None = None
        self.connected = asyncio.Event()

    def start(self) -> None:
        """Connects (and keeps reconnecting) from the loop."""
        self._task = self._loop.create_task(self._keep_connected())

    async def _keep_connected(self) -> None:
        delay = MIN_RETRY_SECONDS
        while not self._closing:
            failure = self._directory.failure(self.name)
            if failure is not None:  # the first front's worker could not load the model
                self.failure = self.load_error = failure
                self.connected.set()
                self._health(False)
                return
            address = self._directory.address(self.name)
            if address:
                # Made before connecting: a worker gone at once sets this very event.
                gone = asyncio.Event()
                try:
                    transport, connection = await self._loop.create_unix_connection(
                        functools.partial(
                            WorkerConnection,
                            self.name,
                            _setting(gone),
                            max_unread_events=self._limits.generation.max_unread_events,
                        ),
                        address,
                    )
                except OSError as exc:
                    log.debug("model %s: worker at %r not reachable: %s", self.name, address, exc)
                else:
                    tune_socket(transport.get_extra_info("socket"))
                    self._connection = connection
                    self.connected.set()
                    self._health(True)
                    delay = MIN_RETRY_SECONDS
                    await gone.wait()
                    self.connected.clear()
                    self._health(False)
                    continue
            await asyncio.sleep(delay)
            delay = min(MAX_RETRY_SECONDS, delay * 2)

    def _health(self, serving: bool) -> None:
        if self._on_health is not None:
            self._on_health(self.name, serving)

    def _live(self) -> WorkerConnection:
        connection = self._connection
        if connection is None or connection.lost:
            raise ModelUnavailable(
                f"model {self.name!r}: its engine worker is restarting; retry shortly"
            )
        return connection

    def close(self) -> None:
        self._closing = True
        self._loop.call_soon_threadsafe(self._close_on_loop)

    def _close_on_loop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        connection = self._connection
        if connection is not None and connection._transport is not None:
            connection._transport.close()

    def join(self, timeout: float) -> None:
        """The worker belongs to the first front: nothing to wait for here."""


class RemoteEngines:
    """`ServedModels`' engine factory on a front that does not start workers."""

    def __init__(
        self,
        directory: WorkerDirectory,
        limits: EngineLimits,
        loop: asyncio.AbstractEventLoop,
        on_health: Callable[[str, bool], None] | None = None,
        connect_timeout: float = 30.0,
    ) -> None:
        self.directory = directory
        self.limits = limits
        self.loop = loop
        self._on_health = on_health
        self._connect_timeout = connect_timeout

    def __call__(self, entries: Sequence[ModelEntry]) -> list[ModelEngine]:
        """One engine per entry, each connected (or given up waiting for) before it returns
        (blocking: call off the loop)."""
        engines = [
            RemoteWorkerEngine(e.name, self.directory, self.limits, self.loop, self._on_health)
            for e in entries
        ]

        async def connect_all() -> None:
            for engine in engines:
                engine.start()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    asyncio.gather(*(e.connected.wait() for e in engines)), self._connect_timeout
                )

        asyncio.run_coroutine_threadsafe(connect_all(), self.loop).result()
        return list(engines)


def _setting(event: asyncio.Event) -> Callable[[WorkerConnection], None]:
    """A connection's on_lost that sets `event`."""
    return lambda _connection: event.set()
