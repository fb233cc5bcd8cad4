"""What `lmserve import-onnx` and `lmserve import-torchscript` share: the vocabulary, tokenizer
and folder flags, the contract's flags, and how a refusal is printed (one line, exit 1)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from lmserve.export.custom.contract import BATCH, ContractError, ModelContract, StateSpec


def add_common(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("model_dir", type=Path, help="the model folder to write")
    parser.add_argument(
        "--vocab",
        type=Path,
        required=True,
        help="vocab.txt (one token a line, id = line index) or a tokenizer.json (BPE)",
    )
    parser.add_argument(
        "--contract",
        type=Path,
        help=f"a YAML file describing the {what}'s states and scores (ModelContract); "
        "the flags below describe it otherwise",
    )
    parser.add_argument(
        "--log-probs",
        action="store_true",
        help="the scores output holds natural-log probabilities (default: logits)",
    )
    parser.add_argument(
        "--normalize",
        action="store_true",
        help="apply log_softmax to scores declared --log-probs that are not normalised",
    )
    parser.add_argument(
        "--time-major", action="store_true", help="tokens are [time, batch] (and scores too)"
    )
    parser.add_argument("--kind", choices=["rnn", "lstm", "gru", "ffnn"], default="rnn")
    parser.add_argument("--name", help="model name (default: the folder's name)")
    parser.add_argument("--description", default="")
    parser.add_argument("--tokenizer", choices=["word", "character"], default="word")
    parser.add_argument("--lowercase", action="store_true", help="lowercase texts first")
    parser.add_argument("--token-pattern", help="words are the matches of this regex")
    parser.add_argument("--bos", default="<s>", help="the model's start token")
    parser.add_argument("--eos", default="</s>", help="the model's end token")
    parser.add_argument("--unk", default="<unk>", help="the model's unknown-word token")
    parser.add_argument(
        "--overwrite", action="store_true", help="replace MODEL_DIR if it is a model folder"
    )


def vocabulary_options(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "vocab": args.vocab,
        "tokenizer": args.tokenizer,  # a tokenizer.json vocabulary is BPE whatever this says
        "lowercase": args.lowercase,
        "pattern": args.token_pattern,
        "bos": args.bos,
        "eos": args.eos,
        "unk": args.unk,
        "kind": args.kind,
        "name": args.name,
        "description": args.description,
        "overwrite": args.overwrite,
    }


def parse_shape(text: str) -> tuple[int | str, ...]:
    """'batch,2,64' -> ('batch', 2, 64)."""
    out: list[int | str] = []
    for part in text.split(","):
        part = part.strip()
        if part == BATCH:
            out.append(BATCH)
        else:
            try:
                out.append(int(part))
            except ValueError:
                raise ContractError(
                    "contract", f"shape {text!r}: each size is an integer or 'batch'"
                ) from None
    return tuple(out)


def torch_states(specs: list[str]) -> tuple[StateSpec, ...]:
    """--state NAME:SHAPE[:DTYPE] (TorchScript: states are positional, in this order)."""
    states = []
    for spec in specs:
        parts = spec.split(":")
        if len(parts) not in (2, 3):
            raise ContractError(
                "contract", f"--state {spec!r}: expected NAME:SHAPE[:DTYPE], e.g. h:batch,2,64"
            )
        dtype = parts[2] if len(parts) == 3 else "float32"
        try:
            states.append(StateSpec(name=parts[0], shape=parse_shape(parts[1]), dtype=dtype))  # type: ignore[arg-type]
        except ValueError as exc:
            raise ContractError("contract", f"--state {spec!r}: {exc}") from exc
    return tuple(states)


def contract_from_flags(args: argparse.Namespace, states: tuple[StateSpec, ...]) -> ModelContract:
    if args.contract is not None:
        return ModelContract.from_yaml(args.contract)
    if not states:
        raise ContractError("contract", "describe the states: --state ... or --contract FILE")
    return ModelContract(
        states=states,
        scores="log_probs" if args.log_probs else "logits",
        normalize=args.normalize,
        time_major=args.time_major,
    )


def report(result: Any) -> int:
    """The folder's summary as JSON on stdout."""
    summary = {
        "model_dir": str(result.folder),
        "name": result.manifest.name,
        "format": result.manifest.format,
        "source": result.manifest.provenance.source,
        "parity": result.manifest.provenance.parity,
        "states": result.manifest.architecture["states"],
    }
    if result.manifest.quantization is not None:
        summary["quantization"] = result.manifest.quantization.model_dump(mode="json")
    print(json.dumps(summary, indent=2))
    return 0


def refuse(command: str, exc: Exception) -> int:
    print(f"lmserve {command}: {exc}", file=sys.stderr)
    return 1
