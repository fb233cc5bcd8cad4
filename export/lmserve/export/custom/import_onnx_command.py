"""`lmserve import-onnx`: a team's own ONNX graph -> a served model folder, parity-checked.

    lmserve import-onnx gru.onnx models/my-gru --vocab vocab.txt \
        --tokens input_ids --scores logits --state hidden_in:hidden_out:1

Each `--state IN:OUT[:BATCH_AXIS[:NAME]]` pairs a state input with its output (batch axis 1 by
default, as torch's RNN states); shapes and dtypes come from the graph. `--contract FILE` reads
the same as YAML (`ModelContract`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from lmserve.export.custom.command_args import (
    add_common,
    refuse,
    report,
    vocabulary_options,
)
from lmserve.export.custom.contract import ContractError, ModelContract
from lmserve.export.quantize import add_quantize_flags, quantize_from_args

HELP = "Import a team's own ONNX language model (graph as it is) as a model folder."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("graph", type=Path, help="the ONNX file (external data beside it)")
    add_common(parser, "graph")
    parser.add_argument("--tokens", help="the token-id input (default: the non-state input)")
    parser.add_argument("--scores", help="the logits/log-probs output (default: the first other)")
    parser.add_argument(
        "--state",
        action="append",
        default=[],
        metavar="IN:OUT[:BATCH_AXIS[:NAME]]",
        help="a state input and its output, its batch axis (default 1), a name; repeat per state",
    )
    add_quantize_flags(parser)


def _state_pairs(specs: list[str]) -> list[tuple[str, str, int, str | None]]:
    pairs = []
    for spec in specs:
        parts = spec.split(":")
        if not 2 <= len(parts) <= 4 or not parts[0] or not parts[1]:
            raise ContractError(
                "contract", f"--state {spec!r}: expected IN:OUT[:BATCH_AXIS[:NAME]]"
            )
        try:
            axis = int(parts[2]) if len(parts) > 2 and parts[2] else 1
        except ValueError:
            raise ContractError(
                "contract", f"--state {spec!r}: the batch axis is an integer"
            ) from None
        pairs.append((parts[0], parts[1], axis, parts[3] if len(parts) > 3 else None))
    return pairs


def run(args: argparse.Namespace) -> int:
    from lmserve.export.custom.folder import import_onnx
    from lmserve.export.custom.onnx_graphs import contract_from_graph, load_graph

    try:
        if args.contract is not None:
            contract = ModelContract.from_yaml(args.contract)
        else:
            if not args.state:
                raise ContractError(
                    "contract",
                    "name the graph's states: --state IN:OUT[:BATCH_AXIS] (or --contract)",
                )
            contract = contract_from_graph(
                load_graph(args.graph),
                _state_pairs(args.state),
                tokens_input=args.tokens,
                scores_output=args.scores,
                scores="log_probs" if args.log_probs else "logits",
                normalize=args.normalize,
                time_major=args.time_major,
            )
        quantize = quantize_from_args(args)
        result = import_onnx(
            args.graph,
            args.model_dir,
            contract=contract,
            **vocabulary_options(args),
            quantize=quantize,
        )
    except (ContractError, FileExistsError, ValueError) as exc:  # QuantizationError included
        return refuse("import-onnx", exc)
    return report(result)
