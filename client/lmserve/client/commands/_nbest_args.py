"""Arguments `rerank` and `rerank-tune` share: the n-best input and the combination's weights."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

from lmserve.client.commands._common import positive_int

if TYPE_CHECKING:
    from lmserve.client.rerank_types import NBestList

LENGTH_UNITS = ("words", "tokens", "characters")


def weight(value: str) -> tuple[str, float]:
    """`acoustic=0.5` -> ("acoustic", 0.5)."""
    name, sep, number = value.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=WEIGHT, got {value!r}")
    try:
        return name, float(number)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{name}: weight must be a number, got {number!r}"
        ) from None


def add_input_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="the model's name")
    parser.add_argument(
        "--weight",
        type=weight,
        action="append",
        default=[],
        metavar="NAME=W",
        help="weight of one of the lists' own scores (default 1 for each); repeatable",
    )
    parser.add_argument(
        "--length-unit",
        choices=LENGTH_UNITS,
        default="words",
        help="what the length bonus counts (default words)",
    )
    parser.add_argument("--no-bos", action="store_true", help="do not start from <s>")
    parser.add_argument("--no-eos", action="store_true", help="do not score </s>")
    parser.add_argument(
        "--batch-lists",
        type=positive_int,
        default=32,
        metavar="N",
        help="n-best lists per streamed request (default 32)",
    )


def read_lists(paths: list[str], fmt: str, file_list: bool) -> Iterator[NBestList]:
    """The lists of `paths`: JSON-lines files (`-`: stdin), or SRILM files, one list each
    (with `file_list`, each path names a file listing them)."""
    from lmserve.client import nbest

    if fmt == "srilm":
        files = [f for p in paths for f in nbest.read_file_list(p)] if file_list else paths
        yield from nbest.read_srilm_files(files)
        return
    for path in paths:
        if path == "-":
            yield from nbest.read_jsonl(sys.stdin)
            continue
        with nbest.open_nbest(path) as stream:
            yield from nbest.read_jsonl(stream, path)


def batched(lists: Iterator[NBestList], size: int) -> Iterator[list[NBestList]]:
    batch: list[NBestList] = []
    for item in lists:
        batch.append(item)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch
