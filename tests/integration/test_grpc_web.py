"""gRPC-Web on the HTTP port, tested with a real client: Connect-ES (`@connectrpc/connect-node`'s
gRPC-Web transport, the code generated from our .proto by protoc-gen-es) in Node. Its Score
totals and seeded Generate tokens equal the gRPC port's, and an unknown model is NOT_FOUND.

Node comes with the machine; the client's packages install from `tests/clients/node`'s lock
file (`npm ci`) when they are not there yet: without them the test fails, it never skips."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from node_clients import node_client, run_node

from lmserve.server.front.process.app import BackgroundServer
from lmserve.v1 import lm_service_pb2 as pb
from lmserve.v1 import lm_service_pb2_grpc


@pytest.fixture(scope="module")
def node_client_script() -> Path:
    return node_client("grpc_web_call.mjs")


def test_connect_es_over_grpc_web_answers_as_grpc(
    server: BackgroundServer,
    stub: lm_service_pb2_grpc.LanguageModelServiceStub,
    node_client_script: Path,
) -> None:
    answer = run_node(node_client_script, f"http://127.0.0.1:{server.http_port}", "kjv3")
    assert "kjv3" in answer["models"]
    grpc_scores = stub.Score(
        pb.ScoreRequest(model="kjv3", texts=["and god said", "the lord is my shepherd"])
    ).results
    assert answer["scores"] == [[r.log_prob, r.token_count] for r in grpc_scores]
    request = pb.GenerateRequest(
        model="kjv3",
        prompt="and god",
        stopping=pb.StoppingCriteria(max_new_tokens=5),
        sampling=pb.SamplingParams(seed=3),
    )
    grpc_tokens = [t.token_id for m in stub.Generate(request) for t in m.tokens]
    assert answer["generated"] == grpc_tokens and grpc_tokens
    assert answer["error"][0] == grpc.StatusCode.NOT_FOUND.value[0]
    assert "not found" in answer["error"][1]
