"""Hugging Face checkpoints to ONNX with past key values (issue #32's first part): tiny GPT-2
and Llama models built here from configs with seeded random weights (nothing is downloaded),
exported, and checked against transformers' own forward."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hf_models import BUILDERS, VOCAB, checkpoint
from tokenizers import Tokenizer
from transformers import GPT2LMHeadModel, LlamaForCausalLM

from lmserve.export.hf.checkpoint import CheckpointError, cache_shape, read_checkpoint
from lmserve.export.hf.fused_parity import check_fused_parity
from lmserve.export.hf.importer import export_checkpoint, sample_ids
from lmserve.export.hf.parity import check_parity
from lmserve.export.parity import PARITY_NATS
from lmserve.server.backends.transformer import past_names, present_names
from lmserve.server.families.hf_folder import GRAPH
from lmserve.server.manifest import read_manifest


def _checkpoint(folder: Path, build: str, seed: int = 0) -> Path:
    return checkpoint(folder, build, seed)


@pytest.mark.parametrize("build", sorted(BUILDERS))
def test_the_graph_equals_transformers_in_one_pass_through_the_cache_and_padded(
    tmp_path: Path, build: str
) -> None:
    folder = _checkpoint(tmp_path / "checkpoint", build)
    out = tmp_path / "out"
    # refuses a graph more than PARITY_NATS from transformers
    export_checkpoint(folder, out, shared_cache=False)
    assert {p.name for p in out.iterdir()} == {GRAPH, "tokenizer.json", "config.json", "model.yaml"}
    session = ort.InferenceSession(str(out / GRAPH), providers=["CPUExecutionProvider"])
    layers = read_checkpoint(folder).cache.layers
    assert [i.name for i in session.get_inputs()] == [
        "input_ids",
        "attention_mask",
        "position_ids",
        *past_names(layers),
    ]
    assert [o.name for o in session.get_outputs()] == ["logits", *present_names(layers)]


@pytest.mark.parametrize("build", sorted(BUILDERS))
def test_the_shared_buffer_graph_is_the_default_and_marked(tmp_path: Path, build: str) -> None:
    folder = _checkpoint(tmp_path / "checkpoint", build)
    out = tmp_path / "out"
    export_checkpoint(folder, out)  # checked as the server reads it (fused_parity)
    assert read_manifest(out).architecture["kv_cache"] == "shared_buffer"
    session = ort.InferenceSession(str(out / GRAPH), providers=["CPUExecutionProvider"])
    layers = read_checkpoint(folder).cache.layers
    ops = {n.op_type for n in onnx.load(str(out / GRAPH)).graph.node}
    assert "GroupQueryAttention" in ops and "Attention" not in ops
    # the tiny Llama's head size (8) turns its rotary embedding outside the op: positions
    positions = ["position_ids"]
    assert [i.name for i in session.get_inputs()] == [
        "input_ids",
        *positions,
        "seqlens_k",
        "total_sequence_length",
        *past_names(layers),
    ]
    assert [o.name for o in session.get_outputs()] == ["logits", *present_names(layers)]


def test_fused_parity_catches_a_graph_of_other_weights(tmp_path: Path) -> None:
    ours = _checkpoint(tmp_path / "ours", "llama", seed=0)
    other = _checkpoint(tmp_path / "other", "llama", seed=1)
    export_checkpoint(other, tmp_path / "other-out")
    checkpoint = read_checkpoint(ours)
    model = LlamaForCausalLM.from_pretrained(ours).eval()
    graph = tmp_path / "other-out" / GRAPH
    parity = check_fused_parity(model, graph, checkpoint.cache, sample_ids(checkpoint))
    assert parity.worst > 100 * PARITY_NATS


def test_the_cache_shape_follows_grouped_query_attention(tmp_path: Path) -> None:
    cache = read_checkpoint(_checkpoint(tmp_path, "llama")).cache
    assert (cache.layers, cache.kv_heads, cache.head_dim, cache.max_positions) == (2, 2, 8, 64)
    assert cache.bytes_per_position() == 2 * 2 * 2 * 8 * 4


def test_parity_catches_a_graph_of_other_weights(tmp_path: Path) -> None:
    """The check can fail: a graph exported from other weights is far from the model."""
    ours = _checkpoint(tmp_path / "ours", "gpt2", seed=0)
    other = _checkpoint(tmp_path / "other", "gpt2", seed=1)
    export_checkpoint(other, tmp_path / "other-out", shared_cache=False)
    session = ort.InferenceSession(str(tmp_path / "other-out" / GRAPH))
    checkpoint = read_checkpoint(ours)
    model = GPT2LMHeadModel.from_pretrained(ours).eval()
    parity = check_parity(model, session, checkpoint.cache, sample_ids(checkpoint))
    assert parity.worst > 100 * PARITY_NATS


def test_sample_ids_are_the_tokenizers(tmp_path: Path) -> None:
    checkpoint = read_checkpoint(_checkpoint(tmp_path, "gpt2"))
    ids = sample_ids(checkpoint, ("Let there be light",))
    tokenizer = Tokenizer.from_file(str(checkpoint.tokenizer_file))
    assert tokenizer.decode(ids[0]) == "Let there be light"
    assert np.max(ids[0]) < VOCAB


@pytest.mark.parametrize(
    ("remove", "named"),
    [
        ("tokenizer.json", "tokenizer.json is missing"),
        ("config.json", "config.json is missing"),
        ("model.safetensors", "no weights (model.safetensors or pytorch_model.bin)"),
    ],
)
def test_a_missing_file_is_named(tmp_path: Path, remove: str, named: str) -> None:
    folder = _checkpoint(tmp_path, "gpt2")
    (folder / remove).unlink()
    with pytest.raises(CheckpointError, match=named.replace("(", r"\(").replace(")", r"\)")):
        read_checkpoint(folder)


def test_an_unsupported_architecture_names_the_supported_ones(tmp_path: Path) -> None:
    folder = _checkpoint(tmp_path, "gpt2")
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = ["MambaForCausalLM"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        CheckpointError, match="MambaForCausalLM.*GPT2LMHeadModel, LlamaForCausalLM"
    ):
        read_checkpoint(folder)


def test_a_config_without_the_layer_count_names_the_keys(tmp_path: Path) -> None:
    folder = _checkpoint(tmp_path, "gpt2")
    config = json.loads((folder / "config.json").read_text())
    del config["n_layer"]
    with pytest.raises(CheckpointError, match="num_hidden_layers or n_layer"):
        cache_shape(config)
