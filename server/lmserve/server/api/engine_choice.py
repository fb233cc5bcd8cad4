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

from lmserve.server.api.health import HealthServicer, set_model_health
from lmserve.server.engine.limits import EngineLimits
from lmserve.server.engine.served_models import EngineFactory, InProcessEngines
from lmserve.server.engine.stats_export import EngineStatsCollector
from lmserve.server.engine.workers.launch import WorkerSettings
from lmserve.server.engine.workers.pool import WorkerPool
from lmserve.server.metrics import Metrics
from lmserve.server.settings import Settings


def choose_engines(
    settings: Settings, limits: EngineLimits, metrics: Metrics, health: HealthServicer
) -> tuple[EngineFactory, WorkerPool | None]:
    """The engine factory for `ServedModels`, and the worker pool when there is one (call on
    the server's event loop)."""
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

    pool = WorkerPool(WorkerSettings.from_settings(settings), limits, metrics, loop, on_health)
    metrics.registry.register(EngineStatsCollector(pool.engine_stats))
    return pool, pool
