"""A second, plaintext gRPC port that serves only `grpc.health.v1.Health`, for probes.

    server, port = await start_health_server(health, "0.0.0.0:8081")
    ...
    await server.stop(0)

Why: Kubernetes' native gRPC probes (and most load-balancer health checks) speak plaintext
and carry no token, so with TLS or mTLS on the main port they cannot reach its health service.
This port shares the main server's HealthServicer, so what it answers is exactly what the main
port answers (NOT_SERVING during the shutdown notice included). It has no auth on purpose: it
serves nothing but serving status (Check, Watch, List), no model RPCs and no reflection, so
there is nothing on it to protect beyond what a TCP connect to the main port already reveals.
"""

from __future__ import annotations

from grpc import aio
from grpc_health.v1 import health_pb2_grpc

from lmserve.server.front.api.health import HealthServicer

__all__ = ["start_health_server"]


async def start_health_server(health: HealthServicer, address: str) -> tuple[aio.Server, int]:
    """Binds `address` (plaintext) and starts serving `health` there; returns the server and
    its bound port. A failed bind is a one-line OSError that names the address."""
    # SO_REUSEPORT off, as on the main port: a second server on a taken port must fail, not
    # share the probes silently.
    server = aio.server(options=[("grpc.so_reuseport", 0)])
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    try:
        port = server.add_insecure_port(address)
    except RuntimeError as exc:  # gRPC's "Failed to bind to address ..."
        raise OSError(f"cannot bind {address} (health): {exc}") from None
    if port == 0:
        raise OSError(f"cannot bind {address} (health)")
    await server.start()
    return server, port
