"""The served models of a repository, by name: READY ones as `ServedModel`s, failed ones kept.

    models = ServedModels(repository, EngineLimits(), metrics, engines)  # engines: see below
    with models.use("kjv-5gram") as served:     # or "kjv-5gram@3": the manifest's version
        await served.score(...)
    [entry.name for entry in models.entries()]

The registry loads (manifest -> backend -> `ModelEntry`); this map turns each READY entry into
the `ServedModel` that serves it, with the engine that `engines` starts for it: an engine worker
process per model (`workers.WorkerPool`), or an in-process `EngineCore` (`InProcessEngines`,
the default here).
Failed entries stay listed, with their load error; so does a model whose engine worker keeps
dying (`entries()` shows it FAILED with the reason, until a reload replaces it).

Hot reload (`swap`) replaces the map atomically: an unchanged entry keeps its `ServedModel`
(sessions, queues, schedulers), a new or changed one gets a new `ServedModel`. A replaced or
removed `ServedModel` is retired, not closed: requests hold their model through `use()`, which
counts them, and a retired model is closed when its last request leaves (at once when it has
none). Counting, rather than a grace delay, never cuts a long Generate or Complete stream short
and closes an idle old model without waiting.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from lmserve.server.errors import ModelNotFound, ModelUnavailable
from lmserve.server.front.models.served_model import ModelEngine, ServedModel
from lmserve.server.metrics import Metrics
from lmserve.server.registry.repository import ModelEntry, ModelRepository, ModelState
from lmserve.server.shared.stats import EngineStats
from lmserve.server.worker.core import EngineCore
from lmserve.server.worker.limits import EngineLimits


def split_version(model: str) -> tuple[str, str | None]:
    """`name@version` -> (name, version); a plain name has no version."""
    name, at, version = model.partition("@")
    return (name, version) if at else (model, None)


# Starts the engines of some READY entries, in their order (several at once where it can).
EngineFactory = Callable[[Sequence[ModelEntry]], list[ModelEngine]]


class InProcessEngines:
    """Engines on this process's own threads (tests of the engine, `engine_workers: false`).

    One `EngineStats` per model name, shared by the engines a reload starts for it, so its
    counters go on across reloads as one series; `stats` is what the front exports for them
    (`stats_export.EngineStatsCollector`)."""

    def __init__(self, limits: EngineLimits) -> None:
        self.limits = limits
        self._stats: dict[str, EngineStats] = {}

    def __call__(self, entries: Sequence[ModelEntry]) -> list[ModelEngine]:
        return [EngineCore(entry, self.limits, self._stats_of(entry.name)) for entry in entries]

    def _stats_of(self, name: str) -> EngineStats:
        stats = self._stats.get(name)
        if stats is None:
            stats = self._stats[name] = EngineStats(name)
        return stats

    def stats(self) -> list[EngineStats]:
        """Every model's stats so far (any thread: a scrape)."""
        return list(self._stats.values())


class ServedModels:
    """Names to served models; the API layer's only way to a model."""

    def __init__(
        self,
        repository: ModelRepository,
        limits: EngineLimits,
        metrics: Metrics | None = None,
        engines: EngineFactory | None = None,
    ) -> None:
        self.repository = repository
        self.limits = limits
        self._metrics = metrics
        self._engines = engines or InProcessEngines(limits)
        self._lock = threading.RLock()
        self._users: dict[ServedModel, int] = {}
        self._retired: set[ServedModel] = set()
        # The models `close` stopped, for `join` to wait on.
        self._closing: list[ServedModel] = []
        self._closed = False
        ready = [e for e in repository.entries() if e.state is ModelState.READY]
        self._served = {served.name: served for served in self._serve(ready)}

    def _serve(self, entries: Sequence[ModelEntry]) -> list[ServedModel]:
        engines = self._engines(entries)
        return [
            ServedModel(entry, self.limits, self._metrics, engine)
            for entry, engine in zip(entries, engines, strict=True)
        ]

    def entries(self) -> list[ModelEntry]:
        """Every model of the repository, READY or not, sorted by name; a READY model whose
        engine failed for good shows FAILED, with the reason."""
        return [self._shown(entry) for entry in self.repository.entries()]

    def _shown(self, entry: ModelEntry) -> ModelEntry:
        served = self._served.get(entry.name)
        failure = served.engine.failure if served is not None else None
        if failure is None or entry.state is not ModelState.READY:
            return entry
        return dataclasses.replace(entry, state=ModelState.FAILED, load_error=failure)

    def names(self) -> list[str]:
        return self.repository.names()

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.base_name(name) in self.repository

    def base_name(self, model: str) -> str:
        """The model's name without `@version` (an exact name with `@` stays as it is)."""
        return model if model in self.repository else split_version(model)[0]

    def entry(self, model: str) -> ModelEntry:
        """The entry of `name` or `name@version` (ModelNotFound for another version), as
        `entries()` shows it."""
        return self._shown(self._entry(model))

    def _entry(self, model: str) -> ModelEntry:
        repository = self.repository
        if model in repository:
            return repository.get(model)
        name, version = split_version(model)
        entry = repository.get(name)  # ModelNotFound when absent
        if version is not None:
            served = entry.manifest.version if entry.manifest else None
            if version != served:
                raise ModelNotFound(
                    model, [f"{name}@{served}"] if served is not None else repository.names()
                )
        return entry

    def ready(self, model: str) -> ServedModel:
        """The model if it serves; ModelNotFound or ModelUnavailable (with its load error).
        Calls that await work on it should hold it through `use()` instead."""
        with self._lock:  # the repository and the map of one swap, never of two
            entry = self._entry(model)
            served = self._served.get(entry.name)
        if served is not None:
            failure = served.engine.failure
            if failure is None:
                return served
            if served.engine.load_error is not None:  # its worker could not load it
                raise ModelUnavailable(f"model {entry.name!r} failed to load: {failure}")
            raise ModelUnavailable(f"model {entry.name!r} stopped serving: {failure}")
        raise ModelUnavailable(f"model {entry.name!r} failed to load: {entry.load_error}")

    @contextmanager
    def use(self, model: str) -> Iterator[ServedModel]:
        """The model, held for the block: a reload closes it only after the block ends."""
        with self._lock:
            served = self.ready(model)
            self._users[served] = self._users.get(served, 0) + 1
        try:
            yield served
        finally:
            self._release(served)

    def _release(self, served: ServedModel) -> None:
        with self._lock:
            left = self._users[served] - 1
            if left:
                self._users[served] = left
                return
            del self._users[served]
            closing = served in self._retired
            self._retired.discard(served)
        if closing:
            served.close()

    def in_use(self, served: ServedModel) -> int:
        """Requests holding `served` right now."""
        with self._lock:
            return self._users.get(served, 0)

    def swap(self, repository: ModelRepository) -> list[ServedModel]:
        """Serves `repository` from now on (blocking: new models build their indexes here).
        Entries kept from the current repository keep their `ServedModel`; the others are
        retired and closed when their last request ends. Returns the retired ones."""
        current = dict(self._served)
        served: dict[str, ServedModel] = {}
        fresh: list[ModelEntry] = []
        for entry in repository.entries():
            if entry.state is not ModelState.READY:
                continue
            old = current.get(entry.name)
            if old is not None and old.entry is entry and old.engine.failure is None:
                served[entry.name] = old
            else:
                fresh.append(entry)
        # New engines start (a worker each, loading its model) before any old one stops.
        for model in self._serve(fresh):
            served[model.name] = model
        kept = {id(s) for s in served.values()}
        retired = [s for s in current.values() if id(s) not in kept]
        idle = []
        with self._lock:
            if self._closed:  # the server stopped while the reload loaded: serve nothing new
                for model in [s for s in served.values() if s not in current.values()]:
                    model.close()
                return []
            self._served = served
            self.repository = repository
            for old in retired:
                if self._users.get(old):
                    self._retired.add(old)
                else:
                    idle.append(old)
        for old in idle:
            old.close()
        return retired

    def failed_engines(self) -> list[str]:
        """Models whose engine stopped for good (a worker that kept dying): a reload starts
        them afresh even when their folders did not change."""
        return [name for name, s in self._served.items() if s.engine.failure is not None]

    def served(self) -> list[ServedModel]:
        return list(self._served.values())

    def close(self) -> None:
        """Stops every model's threads (retired ones too) without waiting behind model work."""
        with self._lock:
            self._closed = True
            models = [*self._served.values(), *self._retired]
            self._retired.clear()
        for served in models:
            served.close()
        self._closing = models

    def join(self, timeout: float) -> None:
        """After `close`: waits (at most `timeout` s in all) for every model's work in flight."""
        deadline = time.monotonic() + timeout
        for served in self._closing:
            served.join(max(0.0, deadline - time.monotonic()))
