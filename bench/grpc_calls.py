"""Raw gRPC calls the server benchmarks share: stubs over one channel, and timed calls.

The benchmarks use the generated stubs directly (no client library), with message limits as
large as the server's, so what they time is the server and grpcio.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

MESSAGE_BYTES = 64 * 1024 * 1024  # the server's default max_message_bytes
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MESSAGE_BYTES),
]


@dataclass
class Stubs:
    """The service and health stubs over one channel (close it with `close()`)."""

    channel: Any
    lm: Any
    health: Any

    @classmethod
    def open(cls, target: str) -> Stubs:
        import grpc
        from grpc_health.v1 import health_pb2_grpc

        from lmserve.v1 import lm_service_pb2_grpc

        channel = grpc.insecure_channel(target, options=CHANNEL_OPTIONS)
        return cls(
            channel,
            lm_service_pb2_grpc.LanguageModelServiceStub(channel),
            health_pb2_grpc.HealthStub(channel),
        )

    def close(self) -> None:
        self.channel.close()


def score_request(model: str, texts: list[str]) -> Any:
    from lmserve.v1 import lm_service_pb2 as pb

    return pb.ScoreRequest(model=model, texts=texts)


def health_request(service: str = "") -> Any:
    from grpc_health.v1 import health_pb2

    return health_pb2.HealthCheckRequest(service=service)


def list_models_request() -> Any:
    from lmserve.v1 import lm_service_pb2 as pb

    return pb.ListModelsRequest()


@dataclass
class Latencies:
    """Seconds per successful call, and the failures' status names."""

    seconds: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def call(self, fn: Callable[[], Any]) -> None:
        import grpc

        start = time.perf_counter()
        try:
            fn()
        except grpc.RpcError as exc:
            self.errors.append(str(exc.code()))
            return
        self.seconds.append(time.perf_counter() - start)
