"""gRPC-Web on the HTTP port, tested with a real client: Connect-ES (`@connectrpc/connect-node`'s
gRPC-Web transport, the code generated from our .proto by protoc-gen-es) in Node. Its Score
totals and seeded Generate tokens equal the gRPC port's, and an unknown model is NOT_FOUND.

Node comes with the machine; the client's packages install from `tests/clients/node`'s lock
file (`npm ci`) when they are not there yet: without them the test fails, it never skips."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from lmserve.server.front.process.app import BackgroundServer
from lmserve.v1 import lm_service_pb2 as pb
from lmserve.v1 import lm_service_pb2_grpc

CLIENT = Path(__file__).resolve().parents[1] / "clients" / "node"
PROTO = Path(__file__).resolve().parents[2] / "proto"


@pytest.fixture(scope="module")
def node_client() -> Path:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.fail("node and npm are needed for the gRPC-Web client test")
    if not (CLIENT / "node_modules" / "@connectrpc" / "connect-node").is_dir():
        subprocess.run(
            [npm, "ci", "--silent", "--no-audit", "--no-fund"], cwd=CLIENT, check=True, timeout=600
        )
    generated = CLIENT / "gen"
    generated.mkdir(exist_ok=True)
    subprocess.run(
        [
            sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTO}",
            f"--plugin=protoc-gen-es={CLIENT / 'node_modules' / '.bin' / 'protoc-gen-es'}",
            f"--es_out={generated}", "--es_opt=target=js,import_extension=js",
            str(PROTO / "lmserve" / "v1" / "lm_service.proto"),
        ],
        check=True,
        timeout=120,
    )  # fmt: skip
    return CLIENT / "grpc_web_call.mjs"


def test_connect_es_over_grpc_web_answers_as_grpc(
    server: BackgroundServer,
    stub: lm_service_pb2_grpc.LanguageModelServiceStub,
    node_client: Path,
) -> None:
    run = subprocess.run(
        ["node", str(node_client), f"http://127.0.0.1:{server.http_port}", "kjv3"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    answer = json.loads(run.stdout.strip().splitlines()[-1])
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
