"""gRPC health (`grpc.health.v1`): the service overall and one entry per model.

    health = HealthServicer(); await publish_health(health, models.entries())

"" and `lmserve.v1.LanguageModelService` are SERVING when at least one model serves;
`lmserve.v1.LanguageModelService/<model>` is SERVING or NOT_SERVING per model. `List` (added
to grpc.health.v1 after grpcio's servicer was written) answers every service and its status.
"""

from __future__ import annotations

from collections.abc import Sequence

from grpc_health.v1 import health_pb2
from grpc_health.v1._async import HealthServicer as _GrpcHealthServicer

from lmserve.server.front.api.grpc_types import Context
from lmserve.server.registry.repository import ModelEntry, ModelState

SERVICE_NAME = "lmserve.v1.LanguageModelService"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING

__all__ = ["SERVICE_NAME", "HealthServicer", "model_service_name", "publish_health"]


# grpcio-health-checking ships no type hints: its servicer, the base class here, is untyped.
class HealthServicer(_GrpcHealthServicer):  # type: ignore[misc]
    """grpcio's asyncio health servicer with `List` (its own raises NotImplementedError)."""

    def serving(self, service: str = "") -> bool:
        """Whether `service` is SERVING now (the HTTP front's /healthz asks)."""
        return bool(self._server_status.get(service) == SERVING)

    async def List(
        self, request: health_pb2.HealthListRequest, context: Context
    ) -> health_pb2.HealthListResponse:
        response = health_pb2.HealthListResponse()
        for service, status in sorted(self._server_status.items()):
            response.statuses[service].status = status
        return response


def model_service_name(model: str) -> str:
    return f"{SERVICE_NAME}/{model}"


async def publish_health(health: HealthServicer, entries: Sequence[ModelEntry]) -> None:
    """Sets every status from the models' current state; models no longer listed (a reload
    removed them) go NOT_SERVING."""
    names = {model_service_name(e.name) for e in entries}
    prefix = model_service_name("")
    for service in list(health._server_status):
        if service.startswith(prefix) and service not in names:
            await health.set(service, NOT_SERVING)
    overall = SERVING if any(e.state is ModelState.READY for e in entries) else NOT_SERVING
    await health.set("", overall)
    await health.set(SERVICE_NAME, overall)
    for entry in entries:
        status = SERVING if entry.state is ModelState.READY else NOT_SERVING
        await health.set(model_service_name(entry.name), status)


async def set_model_health(health: HealthServicer, model: str, serving: bool) -> None:
    """One model's status (its engine worker died, or is serving again)."""
    await health.set(model_service_name(model), SERVING if serving else NOT_SERVING)
