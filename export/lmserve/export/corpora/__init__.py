"""Corpora that ship with lmserve, so that the default models can be built on any machine."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

KJV_TOKEN_PATTERN = r"[a-z]+(?:'[a-z]+)*"
"""The rule the KJV corpus was tokenized with (after lowercasing)."""


def kjv_split(split: str) -> Path:
    """Path of the KJV `train`, `valid` or `test` split."""
    if split not in ("train", "valid", "test"):
        raise ValueError(f"unknown KJV split {split!r}")
    return Path(str(files(__package__).joinpath("kjv", f"{split}.txt")))
