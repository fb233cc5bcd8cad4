"""Argument types the training commands share: a bad value is refused by argparse with the
flag's name, before any corpus is read (`lmserve train-ngram --token-pattern '('` used to end in
a traceback after reading it)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path


def regex(text: str) -> str:
    """A regular expression that compiles."""
    try:
        re.compile(text)
    except re.error as exc:
        raise argparse.ArgumentTypeError(f"not a regular expression: {exc}") from None
    return text


def existing_file(text: str) -> Path:
    """A file that exists and can be read."""
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"no such file: {text}")
    return path


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be greater than 0, got {value}")
    return value
