"""`--bias FILE` and `--bias-boost B`: a phrase list for contextual biasing (rerank).

A bias file holds one phrase per line, optionally followed by a TAB and its own boost in nats
(`Nebuchadnezzar<TAB>4.0`); blank lines and lines starting with `#` are skipped. Phrases
without a boost get `--bias-boost`.
"""

from __future__ import annotations

import argparse
from typing import Any

# Nats added per matched phrase when neither the file nor the flag says (see the README's
# biasing figures: the boost chosen for kjv-5gram, 8 for kjv-lstm, with lm_weight 0.75).
DEFAULT_BIAS_BOOST = 6.0

BiasEntries = list[tuple[str, float | None]]


def bias_file(path: str) -> BiasEntries:
    """The phrases of a bias file, each with its boost or None (argparse `type`)."""
    try:
        with open(path, encoding="utf-8") as stream:
            lines = stream.read().splitlines()
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot read {path}: {exc.strerror}") from None
    entries: BiasEntries = []
    for number, line in enumerate(lines, start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        phrase, tab, boost = line.partition("\t")
        if not tab:
            entries.append((phrase.strip(), None))
            continue
        try:
            entries.append((phrase.strip(), float(boost)))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{path}:{number}: the boost after the TAB must be a number, got {boost!r}"
            ) from None
    if not entries:
        raise argparse.ArgumentTypeError(f"{path} holds no phrases")
    return entries


def add_bias_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--bias",
        type=bias_file,
        metavar="FILE",
        help="phrases to boost, one per line (optionally PHRASE<TAB>BOOST); names, terms",
    )
    parser.add_argument(
        "--bias-boost",
        type=float,
        default=DEFAULT_BIAS_BOOST,
        metavar="B",
        help=f"nats added per matched phrase without its own boost (default {DEFAULT_BIAS_BOOST})",
    )


def bias_arguments(args: argparse.Namespace) -> dict[str, Any]:
    """The client's `bias` / `bias_boost` keyword arguments (empty without --bias)."""
    if args.bias is None:
        return {}
    return {"bias": args.bias, "bias_boost": args.bias_boost}
