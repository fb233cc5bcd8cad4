"""The standard gRPC health check (`grpc.health.v1.Health/Check`) encoded by hand.

The request is one string field and the answer one enum field, so the client calls the method
on the raw channel instead of depending on grpcio-health-checking for two tiny messages.
"""

from __future__ import annotations

from lmserve.client._protowire import WireError, encode_bytes_field, fields

CHECK_METHOD = "/grpc.health.v1.Health/Check"
# grpc.health.v1.HealthCheckResponse.ServingStatus
HEALTH_NAMES = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}


def encode_check(service: str) -> bytes:
    """A serialized HealthCheckRequest for `service` ("" is the whole server)."""
    return encode_bytes_field(1, service.encode("utf-8")) if service else b""


def decode_status(data: bytes) -> int:
    """The `status` of a serialized HealthCheckResponse (0, UNKNOWN, when absent)."""
    status = 0
    try:
        for number, value in fields(data):
            if number == 1 and isinstance(value, int):
                status = value
    except WireError:
        return 0
    return status
