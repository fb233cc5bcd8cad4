"""Where a server's models compute: engine worker processes, or threads of the front.

    engines, workers = choose_engines(settings, limits, metrics, health)
    models = ServedModels(repository, limits, metrics, engines)

With `engine_workers` (the default) each model gets a worker process (`engine.workers`), whose
death and restart show in the model's health. Without, the engines run on the front's threads.
Either way their stats reach /metrics through one collector on the front's registry
(`stats_export.EngineStatsCollector`), asked for at each scrape.
"""

from __future__ import annotations

import asyncio

from lmserve.server.front.api.health import HealthServicer, set_model_health
from lmserve.server.front.models.served_models import EngineFactory, InProcessEngines
from lmserve.server.front.process.stats_export import EngineStatsCollector
from lmserve.server.front.workers.directory import WorkerDirectory
from lmserve.server.front.workers.launch import WorkerSettings
from lmserve.server.front.workers.pool import WorkerPool
from lmserve.server.front.workers.remote import RemoteEngines
from lmserve.server.metrics import Metrics
from lmserve.server.settings import Settings
from lmserve.server.worker.limits import EngineLimits


def choose_engines(
    settings: Settings,
    limits: EngineLimits,
    metrics: Metrics,
    health: HealthServicer,
    directory: WorkerDirectory | None = None,
    *,
    remote: bool = False,
) -> tuple[EngineFactory, WorkerPool | None]:
    """The engine factory for `ServedModels`, and the worker pool when this front starts the
    workers (call on the server's event loop). `directory`: where the workers can be reached by
    the other fronts (`fronts: N`); `remote`: this is one of those other fronts, connecting to
    the workers the first front started."""
    if not settings.engine_workers:
        in_process = InProcessEngines(limits)
        metrics.registry.register(EngineStatsCollector(in_process.stats))
        return in_process, None
    loop = asyncio.get_running_loop()
    tasks: set[asyncio.Task[None]] = set()

    def on_health(model: str, serving: bool) -> None:
        task = loop.create_task(set_model_health(health, model, serving))
        tasks.add(task)  # held until done
        task.add_done_callback(tasks.discard)

    if remote:
        assert directory is not None, "another front finds the workers through the directory"
        return RemoteEngines(directory, limits, loop, on_health), None
    pool = WorkerPool(
        WorkerSettings.from_settings(settings), limits, metrics, loop, on_health, directory
    )
    metrics.registry.register(EngineStatsCollector(pool.engine_stats))
    return pool, pool
