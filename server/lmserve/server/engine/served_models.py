"""The served models of a repository, by name: READY ones as `ServedModel`s, failed ones kept.

    models = ServedModels(repository, EngineLimits(), metrics)
    served = models.ready("kjv-5gram")     # ModelNotFound / ModelUnavailable otherwise
    [entry.name for entry in models.entries()]

The registry loads (manifest -> backend -> `ModelEntry`); this map turns each READY entry into
the `ServedModel` that serves it. Failed entries stay listed, with their load error.
"""

from __future__ import annotations

from lmserve.server.engine.limits import EngineLimits
from lmserve.server.engine.served_model import ServedModel
from lmserve.server.errors import ModelUnavailable
from lmserve.server.metrics import Metrics
from lmserve.server.registry.repository import ModelEntry, ModelRepository, ModelState


class ServedModels:
    """Names to served models; the API layer's only way to a model."""

    def __init__(
        self, repository: ModelRepository, limits: EngineLimits, metrics: Metrics | None = None
    ) -> None:
        self.repository = repository
        self.limits = limits
        self._served = {
            entry.name: ServedModel(entry, limits, metrics)
            for entry in repository.entries()
            if entry.state is ModelState.READY
        }

    def entries(self) -> list[ModelEntry]:
        """Every model of the repository, READY or not, sorted by name."""
        return self.repository.entries()

    def names(self) -> list[str]:
        return self.repository.names()

    def __contains__(self, name: object) -> bool:
        return name in self.repository

    def entry(self, name: str) -> ModelEntry:
        return self.repository.get(name)

    def ready(self, name: str) -> ServedModel:
        """The model if it serves; ModelNotFound or ModelUnavailable (with its load error)."""
        served = self._served.get(name)
        if served is not None:
            return served
        entry = self.repository.get(name)  # ModelNotFound when absent
        raise ModelUnavailable(f"model {name!r} failed to load: {entry.load_error}")

    def served(self) -> list[ServedModel]:
        return list(self._served.values())

    def close(self) -> None:
        """Stops every model's threads without waiting behind model work."""
        for served in self._served.values():
            served.close()
