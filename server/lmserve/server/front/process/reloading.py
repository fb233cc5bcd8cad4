"""Hot reload of the model repository: rescan, swap the served models, publish health.

    reloader = Reloader(models, health, metrics, RepositoryScanner(root, options))
    report = await reloader.reload()          # SIGHUP, or every `reload_poll_seconds`

The rescan (reading manifests, loading new and changed models) and the building of the new
`ServedModel`s run off the event loop, so requests keep being answered meanwhile; one reload
runs at a time. The swap itself is atomic per name (`ServedModels.swap`): calls already holding
the old model finish on it, new calls get the new one. Each change counts in
`lmserve_model_reloads_total{model,result}`; a model that failed to load anew keeps its old
version serving, and the error goes to the log and the `failed` result.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from lmserve.server.front.api.health import HealthServicer, publish_health
from lmserve.server.front.models.served_models import ServedModels
from lmserve.server.long_lived import freeze_long_lived
from lmserve.server.metrics import Metrics
from lmserve.server.registry.repository import ModelState
from lmserve.server.registry.rescan import RepositoryScanner, RescanResult

log = logging.getLogger(__name__)


class Reloader:
    """Rescans the repository and serves what it holds now (see the module doc)."""

    def __init__(
        self,
        models: ServedModels,
        health: HealthServicer,
        metrics: Metrics,
        scanner: RepositoryScanner,
    ) -> None:
        self.models = models
        self.health = health
        self.metrics = metrics
        self.scanner = scanner
        self._lock = asyncio.Lock()

    async def reload(self) -> RescanResult:
        """One rescan and swap; a reload asked for while one runs waits and runs after it."""
        async with self._lock:
            result = await asyncio.to_thread(self._rescan_and_swap)
            await publish_health(self.health, self.models.entries())
            if result.changed:
                freeze_long_lived()
            self._record(result)
            return result

    def _rescan_and_swap(self) -> RescanResult:
        result = self.scanner.rescan(self.models.repository)
        if result.changed or self.models.failed_engines():
            self.models.swap(result.repository)
        return result

    def _record(self, result: RescanResult) -> None:
        counts = (
            ("added", result.added),
            ("replaced", result.replaced),
            ("removed", result.removed),
            ("failed", list(result.failed)),
        )
        for outcome, names in counts:
            for name in names:
                self.metrics.model_reloads.labels(model=name, result=outcome).inc()
        for name in result.removed:
            with contextlib.suppress(KeyError):  # a model that never loaded has none
                self.metrics.model_load_seconds.remove(name)
        entries = result.repository.entries()
        for entry in entries:
            if entry.state is ModelState.READY:
                self.metrics.model_load_seconds.labels(model=entry.name).set(entry.load_seconds)
        for state in ModelState:
            self.metrics.models.labels(state=state.value).set(
                sum(e.state is state for e in entries)
            )
        if result.changed:
            log.info(
                "reload: added %s, replaced %s, removed %s, failed %s",
                result.added or "-",
                result.replaced or "-",
                result.removed or "-",
                sorted(result.failed) or "-",
            )

    async def poll(self, seconds: float) -> None:
        """Reloads every `seconds` until cancelled; a failing rescan is logged, never fatal."""
        while True:
            await asyncio.sleep(seconds)
            try:
                await self.reload()
            except Exception:
                log.exception("repository reload failed")
