"""`lmserve models [NAME]`: list the server's models, or describe one."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from dataclasses import fields, is_dataclass
from typing import TYPE_CHECKING, Any

from lmserve.client.commands._common import add_connection_arguments, with_client

if TYPE_CHECKING:
    from lmserve.client import LmServeClient, ModelInfo

HELP = "List the models of a running server (or describe one)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", nargs="?", help="describe only this model")
    parser.add_argument(
        "--json", action="store_true", help="print JSON lines (one model per line), not a table"
    )
    add_connection_arguments(parser)


def _plain(value: Any) -> Any:
    """Dataclasses, mappings and sets as JSON-ready dicts, dicts and sorted lists."""
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, frozenset | set):
        return sorted(value)
    return value


def _as_json(info: ModelInfo) -> dict[str, Any]:
    data: dict[str, Any] = _plain(info)
    return data


def _size(info: ModelInfo) -> str:
    if info.kind == "ngram":
        return f"order {info.order}"
    return f"{info.num_layers}x{info.hidden_size}" if info.num_layers else "-"


def _describe(info: ModelInfo) -> str:
    lines = [
        f"name:          {info.name} (version {info.version})",
        f"kind:          {info.kind}, format {info.format}, {_size(info)}",
        f"state:         {info.state}" + (f" ({info.load_error})" if info.load_error else ""),
        f"vocabulary:    {info.vocab_size} tokens, tokenizer {info.tokenizer.kind}"
        + (" (lowercased)" if info.tokenizer.lowercase else ""),
        f"capabilities:  {', '.join(sorted(info.capabilities)) or '-'}",
    ]
    if info.description:
        lines.append(f"description:   {info.description}")
    for key, value in sorted(info.provenance.metrics.items()):
        lines.append(f"metric:        {key} = {value:g}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    def body(client: LmServeClient) -> int:
        if args.name:
            info = client.get_model(args.name)
            print(json.dumps(_as_json(info)) if args.json else _describe(info))
            return 0
        models = client.list_models()
        if args.json:
            for m in models:
                print(json.dumps(_as_json(m)))
            return 0
        rows = [("NAME", "KIND", "SIZE", "VOCAB", "STATE")]
        rows += [(m.name, m.kind, _size(m), str(m.vocab_size), m.state) for m in models]
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for row in rows:
            print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        for m in models:
            if m.load_error:
                print(f"{m.name}: {m.load_error}")
        return 0

    return with_client("models", args, body)
