"""ListModels, GetModel, health per model and reflection, against a real server."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)
from integration_data import BROKEN_MODELS, READY_MODELS, SERVICE

from lmserve.v1 import lm_service_pb2 as pb
from lmserve.v1 import lm_service_pb2_grpc


def test_list_models_includes_failed_ones_sorted(
    stub: lm_service_pb2_grpc.LanguageModelServiceStub,
) -> None:
    models = stub.ListModels(pb.ListModelsRequest()).models
    names = [m.name for m in models]
    assert names == sorted(READY_MODELS + BROKEN_MODELS)
    states = {m.name: m.state for m in models}
    assert all(states[n] == pb.MODEL_STATE_READY for n in READY_MODELS)
    assert all(states[n] == pb.MODEL_STATE_FAILED for n in BROKEN_MODELS)
    assert all(not m.load_error for m in models if m.state == pb.MODEL_STATE_READY)


def test_get_model_reports_everything(stub: lm_service_pb2_grpc.LanguageModelServiceStub) -> None:
    info = stub.GetModel(pb.GetModelRequest(model="kjv3")).model
    assert (info.name, info.state, info.kind) == ("kjv3", pb.MODEL_STATE_READY, pb.MODEL_KIND_NGRAM)
    assert info.format == pb.MODEL_FORMAT_NGRAM_BINARY
    assert info.order == 3
    assert info.vocab_size > 12_000
    assert info.tokenizer.kind == pb.TOKENIZER_KIND_WORD and info.tokenizer.lowercase
    assert "[a-z]+" in info.tokenizer.description
    tokens = info.special_tokens
    assert (tokens.bos, tokens.eos, tokens.unk) == ("<s>", "</s>", "<unk>")
    assert min(tokens.bos_id, tokens.eos_id, tokens.unk_id) >= 0 and tokens.pad_id == -1
    caps = info.capabilities
    assert caps.score and caps.perplexity and caps.generate and caps.beam_search
    assert caps.rerank and caps.complete and caps.next_token_distribution
    assert info.provenance.trained_by == "tests"
    assert info.provenance.metrics["test_perplexity"] == pytest.approx(12.5)
    assert info.description == "kjv3 for the integration tests"

    storage = info.ngram_storage
    assert storage.layout == "probing" and len(storage.ngram_counts) == 3
    assert storage.ngram_counts[0] == info.vocab_size and min(storage.ngram_counts) > 0
    assert 18 < storage.bytes_per_ngram < 24  # KenLM's probing footprint: 24 and 18 bytes
    assert storage.max_prob_error == storage.max_token_error == 0.0

    arpa = stub.GetModel(pb.GetModelRequest(model="test-arpa")).model
    assert (arpa.format, arpa.order, arpa.state) == (pb.MODEL_FORMAT_ARPA, 5, pb.MODEL_STATE_READY)
    assert not arpa.HasField("ngram_storage")  # compiled from ARPA text: no binary to describe


@pytest.mark.parametrize(
    ("name", "file_name", "reason"),
    [
        ("bad-checksum", "model.lmbin", "sha256"),
        ("missing-file", "model.lmbin", "missing"),
        ("malformed-arpa", "model.arpa", ""),
        ("invalid-manifest", "model.yaml", "kind"),
        ("neural", "neural", "architecture needs cell"),
    ],
)
def test_failed_models_say_which_file_and_why(
    stub: lm_service_pb2_grpc.LanguageModelServiceStub, name: str, file_name: str, reason: str
) -> None:
    info = stub.GetModel(pb.GetModelRequest(model=name)).model
    assert info.state == pb.MODEL_STATE_FAILED
    assert file_name in info.load_error and reason in info.load_error
    assert not info.capabilities.score


def test_health_overall_and_per_model(channel: grpc.Channel) -> None:
    health = health_pb2_grpc.HealthStub(channel)

    def status(service: str) -> int:
        return health.Check(health_pb2.HealthCheckRequest(service=service)).status

    serving, not_serving = (
        health_pb2.HealthCheckResponse.SERVING,
        health_pb2.HealthCheckResponse.NOT_SERVING,
    )
    assert status("") == serving
    assert status(SERVICE) == serving
    for name in READY_MODELS:
        assert status(f"{SERVICE}/{name}") == serving
    for name in BROKEN_MODELS:
        assert status(f"{SERVICE}/{name}") == not_serving
    with pytest.raises(grpc.RpcError) as err:
        status(f"{SERVICE}/no-such-model")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_reflection_lists_the_services(channel: grpc.Channel) -> None:
    database = ProtoReflectionDescriptorDatabase(channel)
    services = set(database.get_services())
    assert {
        SERVICE,
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
    } <= services
    descriptor = database.FindFileContainingSymbol(SERVICE)
    assert descriptor.package == "lmserve.v1"
