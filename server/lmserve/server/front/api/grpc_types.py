"""The gRPC stubs' generic types as the interceptors and handlers here use them: one alias each,
for any method's request and response (a protobuf message, or the wire bytes a worker built).
Only the type checker sees the type arguments: grpc's runtime classes are not generic."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias

import grpc
from google.protobuf.message import Message
from grpc import aio

Wire: TypeAlias = Message | bytes

if TYPE_CHECKING:
    MethodHandler: TypeAlias = grpc.RpcMethodHandler[Wire, Wire]
    Interceptor: TypeAlias = aio.ServerInterceptor[Wire, Wire]
    Context: TypeAlias = aio.ServicerContext[Wire, Wire]
else:
    MethodHandler = grpc.RpcMethodHandler
    Interceptor = aio.ServerInterceptor
    Context = aio.ServicerContext
