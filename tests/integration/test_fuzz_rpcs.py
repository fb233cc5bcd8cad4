"""Generated requests over every RPC against the real server: each gets OK or a documented
status (never INTERNAL or UNKNOWN), and the server still serves afterwards.

Derandomized, a few hundred examples (bench/fuzz_rpcs.py runs ten thousand)."""

from __future__ import annotations

import grpc
from fuzz_requests import ALLOWED, Call, rpc_calls, send
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings

from lmserve.server.front.process.app import BackgroundServer
from lmserve.v1 import lm_service_pb2 as pb
from lmserve.v1 import lm_service_pb2_grpc

EXAMPLES = 300


def test_fuzzed_requests_get_documented_statuses(
    server: BackgroundServer,
    channel: grpc.Channel,
    stub: lm_service_pb2_grpc.LanguageModelServiceStub,
) -> None:
    seen: dict[str, set[str]] = {}

    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(call=rpc_calls())
    def check(call: Call) -> None:
        code = send(stub, call)
        seen.setdefault(call.rpc, set()).add(code.name)
        assert code in ALLOWED, f"{call.rpc} answered {code.name}"

    check()
    assert len(seen) == 12, seen  # every RPC was exercised
    assert any("OK" in codes for codes in seen.values())
    health = health_pb2_grpc.HealthStub(channel)
    status = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status
    assert status == health_pb2.HealthCheckResponse.SERVING
    answer = stub.Score(pb.ScoreRequest(model="test", texts=["a little"]), timeout=5)
    assert len(answer.results) == 1
