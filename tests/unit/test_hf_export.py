"""Hugging Face checkpoints to ONNX with past key values (issue #32's first part): tiny GPT-2
and Llama models built here from configs with seeded random weights (nothing is downloaded),
exported, and checked against transformers' own forward."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from lmserve.export.hf.checkpoint import CheckpointError, cache_shape, read_checkpoint
from lmserve.export.hf.graph import past_names, present_names
from lmserve.export.hf.importer import GRAPH, export_checkpoint, sample_ids
from lmserve.export.hf.parity import PARITY_NATS, check_parity

VOCAB = 300
CORPUS = [
    "In the beginning God created the heaven and the earth.",
    "And the earth was without form, and void; and darkness was upon the face of the deep.",
    "And God said, Let there be light: and there was light.",
]


def _byte_level_tokenizer() -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    return tokenizer


def _gpt2() -> Any:
    return GPT2LMHeadModel(
        GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=4)
    )


def _llama() -> Any:
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,  # grouped-query attention
        max_position_embeddings=64,
    )
    return LlamaForCausalLM(config)


BUILDERS = {"gpt2": _gpt2, "llama": _llama}


def _checkpoint(folder: Path, build: str, seed: int = 0) -> Path:
    torch.manual_seed(seed)
    BUILDERS[build]().save_pretrained(folder)
    _byte_level_tokenizer().save(str(folder / "tokenizer.json"))
    return folder


@pytest.mark.parametrize("build", sorted(BUILDERS))
def test_the_graph_equals_transformers_in_one_pass_through_the_cache_and_padded(
    tmp_path: Path, build: str
) -> None:
    folder = _checkpoint(tmp_path / "checkpoint", build)
    out = tmp_path / "out"
    export_checkpoint(folder, out)  # refuses a graph more than PARITY_NATS from transformers
    assert {p.name for p in out.iterdir()} == {GRAPH, "tokenizer.json", "config.json"}
    session = ort.InferenceSession(str(out / GRAPH), providers=["CPUExecutionProvider"])
    layers = read_checkpoint(folder).cache.layers
    assert [i.name for i in session.get_inputs()] == [
        "input_ids",
        "attention_mask",
        "position_ids",
        *past_names(layers),
    ]
    assert [o.name for o in session.get_outputs()] == ["logits", *present_names(layers)]


def test_the_cache_shape_follows_grouped_query_attention(tmp_path: Path) -> None:
    cache = read_checkpoint(_checkpoint(tmp_path, "llama")).cache
    assert (cache.layers, cache.kv_heads, cache.head_dim, cache.max_positions) == (2, 2, 8, 64)
    assert cache.bytes_per_position() == 2 * 2 * 2 * 8 * 4


def test_parity_catches_a_graph_of_other_weights(tmp_path: Path) -> None:
    """The check can fail: a graph exported from other weights is far from the model."""
    ours = _checkpoint(tmp_path / "ours", "gpt2", seed=0)
    other = _checkpoint(tmp_path / "other", "gpt2", seed=1)
    export_checkpoint(other, tmp_path / "other-out")
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
