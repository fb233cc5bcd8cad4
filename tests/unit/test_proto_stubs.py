"""The committed protobuf/gRPC stubs must be what `make proto` generates from the .proto today."""

from __future__ import annotations

import filecmp
import shutil
from pathlib import Path

import pytest
from grpc_tools import protoc

PROTO_ROOT = Path(__file__).resolve().parents[2] / "proto"
PACKAGE = Path("lmserve") / "v1"
GENERATED = ("lm_service_pb2.py", "lm_service_pb2_grpc.py", "lm_service_pb2.pyi")


def test_committed_stubs_match_a_fresh_generation(tmp_path: Path) -> None:
    (tmp_path / PACKAGE).mkdir(parents=True)
    shutil.copy(PROTO_ROOT / PACKAGE / "lm_service.proto", tmp_path / PACKAGE)
    status = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{tmp_path}",
            f"--python_out={tmp_path}",
            f"--grpc_python_out={tmp_path}",
            f"--pyi_out={tmp_path}",
            str(tmp_path / PACKAGE / "lm_service.proto"),
        ]
    )
    assert status == 0
    stale = [
        name
        for name in GENERATED
        if not filecmp.cmp(tmp_path / PACKAGE / name, PROTO_ROOT / PACKAGE / name, shallow=False)
    ]
    assert not stale, f"stubs out of date, run `make proto`: {stale}"


@pytest.mark.parametrize(
    "rpc",
    [
        "ListModels",
        "GetModel",
        "Score",
        "Perplexity",
        "CorpusPerplexity",
        "Generate",
        "BeamSearch",
        "Rerank",
        "Complete",
    ],
)
def test_service_defines_every_rpc_of_the_contract(rpc: str) -> None:
    from lmserve.v1 import lm_service_pb2

    service = lm_service_pb2.DESCRIPTOR.services_by_name["LanguageModelService"]
    method = service.methods_by_name[rpc]
    # Google's API design: one request and one response message per RPC, named after it.
    assert method.input_type.name == f"{rpc}Request"
    assert method.output_type.name == f"{rpc}Response"


def test_every_enum_starts_with_unspecified() -> None:
    from lmserve.v1 import lm_service_pb2

    for enum in lm_service_pb2.DESCRIPTOR.enum_types_by_name.values():
        zero = enum.values_by_number[0].name
        assert zero.endswith("_UNSPECIFIED"), f"{enum.name} starts with {zero}"
