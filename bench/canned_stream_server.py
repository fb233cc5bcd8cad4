"""A gRPC server whose Generate streams prebuilt token messages: the transport's floor.

    python bench/canned_stream_server.py PORT [--period SECONDS]

It answers `lmserve.v1.LanguageModelService/Generate` with `stopping.max_new_tokens` messages of
one token each, serialized once at start, then a message with `finished`: no model, no
sampling, no detokenizing and no protobuf building per message. What a Generate stream costs
here, per message, is what grpcio itself costs the server and the client, the least any
server built on it can pay (`bench_generate_bound.py`). With `--period`, each message waits that
long after the previous one: a stream at the pace of a model step, to run beside one.
`Score` answers at once with an empty response: a small request's own floor beside those
streams (`bench_soak_floor.py`). With `--serving`, Score's request is parsed and the call goes
through lmserve's serving interceptor (request id, deadline, metrics, error mapping): what the
front's transport layer costs before any model work (`bench_score_floor.py`).
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator

import grpc
from grpc import aio

from lmserve.v1 import lm_service_pb2 as pb

METHOD = "Generate"
SCORE_METHOD = "Score"
SERVICE = "lmserve.v1.LanguageModelService"


def _token_message() -> bytes:
    """A one-token message as the real server writes it (word, id, index, log-prob)."""
    token = pb.GeneratedToken(sample_index=0, index=17, token_id=4242, text=" water", log_prob=-5.2)
    return pb.GenerateResponse(tokens=[token]).SerializeToString()


def _finished_message(tokens: int) -> bytes:
    finished = pb.GenerationFinished(
        sample_index=0,
        reason=pb.FINISH_REASON_LENGTH,
        text="canned",
        usage=pb.Usage(generated_tokens=tokens),
    )
    return pb.GenerateResponse(finished=finished).SerializeToString()


async def serve(port: int, period: float = 0.0, serving: bool = False) -> None:
    token = _token_message()

    async def generate(request: bytes, context: aio.ServicerContext) -> AsyncIterator[bytes]:
        tokens = pb.GenerateRequest.FromString(request).stopping.max_new_tokens
        for _ in range(tokens):
            if period:
                await asyncio.sleep(period)
            yield token
        yield _finished_message(tokens)

    async def score(request: bytes, context: aio.ServicerContext) -> bytes:
        return b""

    handler = grpc.method_handlers_generic_handler(
        SERVICE,
        {  # bytes in, bytes out
            METHOD: grpc.unary_stream_rpc_method_handler(generate),
            SCORE_METHOD: grpc.unary_unary_rpc_method_handler(
                score, request_deserializer=pb.ScoreRequest.FromString if serving else None
            ),
        },
    )
    server = aio.server(interceptors=_serving_interceptors() if serving else None)
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


def _serving_interceptors() -> list[aio.ServerInterceptor]:
    """lmserve's serving interceptor, as the server installs it (its own metrics registry)."""
    from prometheus_client import CollectorRegistry

    from lmserve.server.front.api.interceptors import ServingInterceptor
    from lmserve.server.metrics import Metrics

    return [ServingInterceptor(Metrics(CollectorRegistry()))]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("port", type=int)
    parser.add_argument("--period", type=float, default=0.0, help="seconds between messages")
    parser.add_argument(
        "--serving", action="store_true", help="parse Score requests, lmserve's interceptor"
    )
    args = parser.parse_args()
    asyncio.run(serve(args.port, args.period, args.serving))
