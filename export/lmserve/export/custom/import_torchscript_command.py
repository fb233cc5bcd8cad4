"""`lmserve import-torchscript`: a team's TorchScript file -> a served model folder.

    lmserve import-torchscript lm.pt models/my-lm --vocab vocab.txt \
        --state h:2,batch,64 --state c:2,batch,64

The module's `forward(tokens, *states)` is called as it is; `--state NAME:SHAPE[:DTYPE]` lists
its states in argument order (`batch` where the batch goes), or `--contract FILE` as YAML.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from lmserve.export.custom.command_args import (
    add_common,
    contract_from_flags,
    refuse,
    report,
    torch_states,
    vocabulary_options,
)
from lmserve.export.custom.contract import ContractError
from lmserve.export.quantize import TORCHSCRIPT_NOT_QUANTIZED

HELP = "Import a team's own TorchScript language model (torch.jit.save) as a model folder."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("script", type=Path, help="the TorchScript file (torch.jit.save)")
    add_common(parser, "module")
    parser.add_argument(
        "--state",
        action="append",
        default=[],
        metavar="NAME:SHAPE[:DTYPE]",
        help="a state in forward's argument order, e.g. h:batch,2,64 (dtype float32 or int64)",
    )
    parser.add_argument(
        "--states-as-tuple",
        action="store_true",
        help="forward takes its states as one tuple: forward(tokens, (h, c))",
    )
    parser.add_argument(
        "--quantize",
        choices=["int8"],
        help="refused: int8 needs ONNX graphs (bring the model as ONNX: import-onnx --quantize)",
    )


def run(args: argparse.Namespace) -> int:
    from lmserve.export.custom.folder import import_torchscript

    if args.quantize is not None:
        return refuse("import-torchscript", ValueError(TORCHSCRIPT_NOT_QUANTIZED))
    try:
        contract = contract_from_flags(args, torch_states(args.state))
        if args.states_as_tuple:
            contract = contract.model_copy(update={"states_as_tuple": True})
        result = import_torchscript(
            args.script, args.model_dir, contract=contract, **vocabulary_options(args)
        )
    except (ContractError, FileExistsError) as exc:
        return refuse("import-torchscript", exc)
    return report(result)
