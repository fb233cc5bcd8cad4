"""A local Hugging Face checkpoint folder: what must be in it, and which architectures we take.

Every failure names the missing file or the unsupported architecture, so a team can act on it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmserve.server.backends.transformer import CacheShape
from lmserve.server.errors import ModelLoadError

__all__ = ["CacheShape", "Checkpoint", "CheckpointError", "cache_shape", "read_checkpoint"]

# Architectures whose decoders are exported and checked (learned positions; RoPE, RMSNorm and
# grouped-query attention).
SUPPORTED_ARCHITECTURES = ("GPT2LMHeadModel", "LlamaForCausalLM")
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


class CheckpointError(ValueError):
    """The checkpoint folder cannot be imported; the message says what to fix."""


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
    """The cache shape a transformers config implies; CheckpointError names a missing key."""
    try:
        return CacheShape.from_config(config, "config.json")
    except ModelLoadError as error:
        raise CheckpointError(f"config.json: {error.reason}") from None
