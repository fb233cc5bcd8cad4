"""Server reflection, v1 and v1alpha: `grpcurl` and other tools ask v1 first nowadays.

    enable_reflection(server, [SERVICE_NAME, "grpc.health.v1.Health"])

grpcio-reflection 1.85 ships only `grpc.reflection.v1alpha`. The v1 protocol is the same
messages under a new package (field numbers unchanged), so v1 is served by the v1alpha servicer
under the v1 method name, with the v1alpha message classes on the wire. One limit: a v1 client
asking for the file that defines `grpc.reflection.v1.ServerReflection` itself gets NOT_FOUND in
the response (the v1 descriptor is not in the pool); listing and every other service resolve.
"""

from __future__ import annotations

from collections.abc import Iterable

import grpc
from grpc import aio
from grpc_reflection.v1alpha import reflection, reflection_pb2
from grpc_reflection.v1alpha._async import ReflectionServicer

V1_SERVICE_NAME = "grpc.reflection.v1.ServerReflection"
V1ALPHA_SERVICE_NAME = reflection.SERVICE_NAME

__all__ = ["V1ALPHA_SERVICE_NAME", "V1_SERVICE_NAME", "enable_reflection"]


def enable_reflection(server: aio.Server, service_names: Iterable[str]) -> None:
    """Registers reflection v1alpha and v1 on `server`, listing `service_names` and both
    reflection services."""
    names = (*service_names, V1_SERVICE_NAME, V1ALPHA_SERVICE_NAME)
    servicer = ReflectionServicer(names)
    reflection.enable_server_reflection(names, server)
    handler = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
    )
    generic = grpc.method_handlers_generic_handler(
        V1_SERVICE_NAME, {"ServerReflectionInfo": handler}
    )
    server.add_generic_rpc_handlers((generic,))
