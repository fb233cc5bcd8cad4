"""Hostile requests against a real server: huge echoed values, bytes that are not a message,
texts over `max_text_bytes`; health `List` and reflection v1 on a real server."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import grpc
import pytest
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2

from lmserve.server.front.api.health import SERVICE_NAME, HealthServicer
from lmserve.server.front.api.reflection import V1_SERVICE_NAME, enable_reflection
from lmserve.server.front.process.app import BackgroundServer
from lmserve.v1 import lm_service_pb2 as pb
from lmserve.v1 import lm_service_pb2_grpc

Stub = lm_service_pb2_grpc.LanguageModelServiceStub
SCORE = "/lmserve.v1.LanguageModelService/Score"
# A field number / wire type the message does not have, then a length that runs past the end.
CORRUPT = b"\x0a\xff\xff\xff\xff\x0f"
LIMIT = 1024 * 1024
STOP = pb.StoppingCriteria(max_new_tokens=1)


def _error(call: object) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        if callable(call):
            result = call()
            if isinstance(result, Iterator):
                list(result)
    return caught.value


@pytest.mark.parametrize("rpc", ["GetModel", "Score"])
def test_a_16kb_model_name_gets_not_found_with_a_short_message(stub: Stub, rpc: str) -> None:
    name = "m" * 16 * 1024
    if rpc == "GetModel":
        error = _error(lambda: stub.GetModel(pb.GetModelRequest(model=name)))
    else:
        error = _error(lambda: stub.Score(pb.ScoreRequest(model=name, texts=["a"])))
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert len(error.details()) < 1000
    assert "mmm…" in error.details() and "available: " in error.details()


def test_long_values_in_invalid_argument_messages_are_cut(stub: Stub) -> None:
    hypothesis = pb.Hypothesis(text="a", scores={"k" * 20_000: float("nan")})
    request = pb.RerankRequest(model="test", lists=[pb.NBestList(hypotheses=[hypothesis])])
    error = _error(lambda: stub.Rerank(request))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert len(error.details()) < 1200 and "kkk…" in error.details()


def test_undecodable_request_is_invalid_argument(channel: grpc.Channel) -> None:
    raw = channel.unary_unary(SCORE, request_serializer=None, response_deserializer=None)
    error = _error(lambda: raw(CORRUPT, timeout=5))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a valid lmserve.v1.ScoreRequest message" in error.details()


def test_undecodable_stream_message_is_invalid_argument(channel: grpc.Channel) -> None:
    good = pb.ScoreRequest(model="test", texts=["a little"]).SerializeToString()
    raw = channel.stream_stream(
        "/lmserve.v1.LanguageModelService/ScoreStream",
        request_serializer=None,
        response_deserializer=None,
    )
    call = raw(iter([good, CORRUPT]), timeout=5)
    answers = []
    with pytest.raises(grpc.RpcError) as caught:
        for answer in call:
            answers.append(answer)
    assert len(answers) == 1
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a valid lmserve.v1.ScoreRequest message" in caught.value.details()


def _big(n: int = LIMIT + 1) -> str:
    return "a" * n


@pytest.mark.parametrize(
    ("field", "call"),
    [
        ("texts[3]", lambda s: s.Score(pb.ScoreRequest(model="test", texts=["a"] * 3 + [_big()]))),
        ("texts[0]", lambda s: s.Perplexity(pb.PerplexityRequest(model="test", texts=[_big()]))),
        (
            "prompt",
            lambda s: list(
                s.Generate(pb.GenerateRequest(model="test", prompt=_big(), stopping=STOP))
            ),
        ),
        (
            "prompt",
            lambda s: s.BeamSearch(
                pb.BeamSearchRequest(model="test", prompt=_big(), beam_width=2, max_length=2)
            ),
        ),
        (
            "lists[0].hypotheses[1].text",
            lambda s: s.Rerank(
                pb.RerankRequest(
                    model="test",
                    lists=[
                        pb.NBestList(
                            hypotheses=[pb.Hypothesis(text="a"), pb.Hypothesis(text=_big())]
                        )
                    ],
                )
            ),
        ),
        (
            "append_text",
            lambda s: list(
                s.Complete(iter([pb.CompleteRequest(model="test", append_text=_big(), k=1)]))
            ),
        ),
    ],
)
def test_texts_over_max_text_bytes_are_refused_naming_the_field(
    stub: Stub, field: str, call: object
) -> None:
    assert callable(call)
    error = _error(lambda: call(stub))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"{field}: has {LIMIT + 1} bytes, more than the limit of {LIMIT}" in error.details()


def test_multibyte_text_is_measured_in_utf8_bytes(stub: Stub) -> None:
    text = "é" * (LIMIT // 2 + 1)  # fewer characters than the limit, more bytes
    error = _error(lambda: stub.Score(pb.ScoreRequest(model="test", texts=[text])))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"texts[0]: has {LIMIT + 2} bytes" in error.details()
    # At the limit exactly, the text is scored (one long word: an OOV).
    ok = stub.Score(pb.ScoreRequest(model="test", texts=[_big(LIMIT)]))
    assert len(ok.results) == 1


def test_health_list_answers_every_service(server: BackgroundServer) -> None:
    with grpc.insecure_channel(server.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        statuses = health.List(health_pb2.HealthListRequest(), timeout=5).statuses
    serving = health_pb2.HealthCheckResponse.SERVING
    not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
    assert statuses[""].status == serving and statuses[SERVICE_NAME].status == serving
    assert statuses[f"{SERVICE_NAME}/test"].status == serving
    assert statuses[f"{SERVICE_NAME}/bad-checksum"].status == not_serving


async def _reflect(path: str, port: int) -> list[str]:
    async with aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.stream_stream(
            path,
            request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
            response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
        )
        requests = [
            reflection_pb2.ServerReflectionRequest(list_services=""),
            reflection_pb2.ServerReflectionRequest(file_containing_symbol=SERVICE_NAME),
        ]
        answers = [answer async for answer in call(iter(requests), timeout=5)]
    listed = [s.name for s in answers[0].list_services_response.service]
    files = answers[1].file_descriptor_response.file_descriptor_proto
    assert files, answers[1]
    return listed


def test_reflection_serves_v1_and_v1alpha() -> None:
    async def run() -> None:
        server = aio.server()
        health = HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health, server)
        lm_service_pb2_grpc.add_LanguageModelServiceServicer_to_server(
            lm_service_pb2_grpc.LanguageModelServiceServicer(), server
        )
        enable_reflection(server, [SERVICE_NAME, "grpc.health.v1.Health"])
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            for version in ("v1", "v1alpha"):
                path = f"/grpc.reflection.{version}.ServerReflection/ServerReflectionInfo"
                listed = await _reflect(path, port)
                assert SERVICE_NAME in listed and V1_SERVICE_NAME in listed
                assert "grpc.reflection.v1alpha.ServerReflection" in listed
            health_stub = health_pb2_grpc.HealthStub(aio.insecure_channel(f"127.0.0.1:{port}"))
            listed_health = await health_stub.List(health_pb2.HealthListRequest(), timeout=5)
            assert listed_health.statuses[""].status == health_pb2.HealthCheckResponse.SERVING
        finally:
            await server.stop(None)

    asyncio.run(run())
