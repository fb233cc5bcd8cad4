"""The engine workers of a server: one per served model, started together, tracked while live.

pool = WorkerPool(WorkerSettings.from_settings(settings), limits, metrics, loop, on_health)
models = ServedModels(repository, limits, metrics, engines=pool)   # a WorkerEngine each
pool.engine_stats()          # every live worker's engine stats, asked for now (/metrics)
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Sequence

from lmserve.server.front.models.served_model import ModelEngine
from lmserve.server.front.workers.directory import WorkerDirectory
from lmserve.server.front.workers.launch import (
    ModelLoadFailed,
    WorkerSettings,
    WorkerStartError,
    handshake,
    launch,
    model_folders,
)
from lmserve.server.front.workers.supervisor import WorkerEngine
from lmserve.server.metrics import Metrics
from lmserve.server.registry.repository import ModelEntry
from lmserve.server.shared.stats import EngineStats
from lmserve.server.worker.limits import EngineLimits
from lmserve.server.worker.process import WorkerSpec

log = logging.getLogger(__name__)


class WorkerPool:
    """Starts a worker per model (`ServedModels`' engine factory) and knows the live ones."""

    def __init__(
        self,
        settings: WorkerSettings,
        limits: EngineLimits,
        metrics: Metrics | None,
        loop: asyncio.AbstractEventLoop,
        on_health: Callable[[str, bool], None] | None = None,
        directory: WorkerDirectory | None = None,
    ) -> None:
        self.settings = settings
        self.limits = limits
        self.metrics = metrics
        self.loop = loop
        self._on_health = on_health
        self._live: dict[int, WorkerEngine] = {}
        # With several fronts: where each model's worker can be reached by the others.
        self.directory = directory

    def __call__(self, entries: Sequence[ModelEntry]) -> list[ModelEngine]:
        """Starts one worker per entry, all at once, and waits until each is READY or failed
        (blocking: call off the event loop). A worker that fails to start is supervised like
        one that died: restarted with backoff, then failed."""
        assert not self.on_loop_thread(), "starting workers blocks: call it off the loop"
        engines = [WorkerEngine(self._spec(entry), self) for entry in entries]
        launched = [launch(engine.spec) for engine in engines]
        for engine, started in zip(engines, launched, strict=True):
            try:
                handshake(started, self.settings.start_timeout_seconds)
            except ModelLoadFailed as exc:  # a broken file: restarting cannot help
                log.error("model %s failed to load in its engine worker: %s", engine.name, exc)
                self.on_loop(functools.partial(engine.load_failed, str(exc)))
                continue
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
            # A model whose work is lookups (n-gram) answers in microseconds and mostly waits
            # to be scheduled: it runs at the front's priority; neural workers, whose passes
            # and steps fill the cores, below it.
            niceness=s.niceness if entry.neural else 0,
            log_level=s.log_level,
            log_format=s.log_format,
            listen_address=(
                "" if self.directory is None else self.directory.new_address(entry.name)
            ),
        )

    def _track(self, engine: WorkerEngine) -> None:
        self._live[id(engine)] = engine
        if self.metrics is not None:
            name = engine.name
            self.metrics.worker_rss.labels(model=name).set_function(engine.rss_bytes)
            self.metrics.worker_restarts.labels(model=name)

    def published(self, engine: WorkerEngine, address: str) -> None:
        """A worker is READY at `address`: the other fronts connect there from now on."""
        if self.directory is not None and address:
            self.directory.publish(engine.name, address)

    def load_failed(self, engine: WorkerEngine, reason: str) -> None:
        if self.directory is not None:
            self.directory.publish_failure(engine.name, reason)

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

    def engine_stats(self) -> list[EngineStats]:
        """Every live worker's engine stats, asked for now (a scrape's collector)."""
        stats = [engine.engine_stats() for engine in self.engines()]
        return [s for s in stats if s is not None]

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
