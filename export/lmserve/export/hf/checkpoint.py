"""A local Hugging Face checkpoint folder: what must be in it, and which architectures we take.

Every failure names the missing file or the unsupported architecture, so a team can act on it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Architectures whose decoders are exported and checked (learned positions; RoPE, RMSNorm and
# grouped-query attention).
SUPPORTED_ARCHITECTURES = ("GPT2LMHeadModel", "LlamaForCausalLM")
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


class CheckpointError(ValueError):
    """The checkpoint folder cannot be imported; the message says what to fix."""


@dataclass(frozen=True)
class CacheShape:
    """The key/value cache of one decoder: per layer a key and a value of
    [batch, kv_heads, positions, head_dim]."""

    layers: int
    kv_heads: int
    head_dim: int
    max_positions: int

    def bytes_per_position(self, itemsize: int = 4) -> int:
        """Cache bytes one stream adds per token it has read (keys and values, every layer)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * itemsize


@dataclass(frozen=True)
class Checkpoint:
    """A checked checkpoint folder: its config and the files the import copies."""

    folder: Path
    config: dict[str, Any]
    architecture: str
    tokenizer_file: Path

    @property
    def cache(self) -> CacheShape:
        return cache_shape(self.config)


def read_checkpoint(folder: Path) -> Checkpoint:
    """The checkpoint in `folder`, or a CheckpointError naming what is missing or unsupported."""
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: not a folder (a local checkpoint; nothing is downloaded)")
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise CheckpointError(f"{folder}: config.json is missing")
    if not any((folder / name).is_file() for name in WEIGHT_FILES):
        raise CheckpointError(f"{folder}: no weights ({' or '.join(WEIGHT_FILES)})")
    tokenizer_file = folder / "tokenizer.json"
    if not tokenizer_file.is_file():
        raise CheckpointError(
            f"{folder}: tokenizer.json is missing (save the tokenizer with "
            "tokenizer.save_pretrained; a slow tokenizer's vocab files are not read)"
        )
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{config_file}: not JSON ({error})") from None
    architectures = config.get("architectures") or []
    supported = [name for name in architectures if name in SUPPORTED_ARCHITECTURES]
    if not supported:
        raise CheckpointError(
            f"{config_file}: architecture {architectures or 'unstated'} is not supported; "
            f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    return Checkpoint(folder, config, supported[0], tokenizer_file)


def cache_shape(config: dict[str, Any]) -> CacheShape:
    """The cache shape a transformers config implies (GPT-2's names or Llama's)."""
    layers = config.get("num_hidden_layers", config.get("n_layer"))
    heads = config.get("num_attention_heads", config.get("n_head"))
    hidden = config.get("hidden_size", config.get("n_embd"))
    positions = config.get("max_position_embeddings", config.get("n_positions"))
    if not all(isinstance(v, int) for v in (layers, heads, hidden, positions)):
        raise CheckpointError("config.json does not state layers, heads, width and positions")
    assert isinstance(layers, int) and isinstance(heads, int) and isinstance(hidden, int)
    assert isinstance(positions, int)
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or hidden // heads
    return CacheShape(layers, int(kv_heads), int(head_dim), positions)
