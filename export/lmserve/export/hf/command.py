"""`lmserve import-hf`: a local Hugging Face causal-LM checkpoint -> a served transformer folder.

    lmserve import-hf ./my-gpt2 models/my-gpt2

Reads config.json, the weights (model.safetensors or pytorch_model.bin) and tokenizer.json;
nothing is downloaded. Writes model.onnx (past key values, optimum's layout) as ONNX Runtime's
transformer optimizer rewrites it (fused layer norms and GELU; `--no-optimize` keeps the graph
as exported), config.json, tokenizer.json and model.yaml, after checking the rewritten graph
against transformers' own forward (within `lmserve.export.parity.PARITY_NATS`, 1e-4 nats a
token). A folder `optimum-cli export onnx` wrote is served as it is: put it in the model
repository, no import needed (`lmserve optimize` writes an optimized copy of one).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lmserve.export.quantize import add_quantize_flags

HELP = "Import a local Hugging Face causal LM (GPT-2, Llama) as a transformer model folder."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint_dir", type=Path, help="config.json, weights, tokenizer.json")
    parser.add_argument("model_dir", type=Path, help="the model folder to write")
    parser.add_argument("--name", help="model name (default: the folder's name)")
    parser.add_argument(
        "--overwrite", action="store_true", help="replace MODEL_DIR if it is a model folder"
    )
    parser.add_argument(
        "--no-optimize",
        dest="optimize",
        action="store_false",
        help="write the graph as exported, without ONNX Runtime's transformer fusions",
    )
    parser.add_argument(
        "--optimum-layout",
        dest="shared_cache",
        action="store_false",
        help="write optimum's graph layout (its cache copied at every token) instead of the "
        "shared-buffer graph GPT-2 and Llama get by default",
    )
    add_quantize_flags(parser)


def run(args: argparse.Namespace) -> int:
    from lmserve.export.hf.checkpoint import CheckpointError
    from lmserve.export.hf.importer import export_checkpoint
    from lmserve.export.parity import ParityError
    from lmserve.export.quantize import QuantizationError, quantize_from_args
    from lmserve.export.served_folder import check_writable
    from lmserve.server.manifest import read_manifest

    out: Path = args.model_dir
    try:
        quantize = quantize_from_args(args)
        check_writable(out, overwrite=args.overwrite)  # before the checkpoint is read
        parity = export_checkpoint(
            args.checkpoint_dir,
            out,
            name=args.name,
            overwrite=args.overwrite,
            quantize=quantize,
            optimize=args.optimize,
            shared_cache=args.shared_cache,
        )
    except (CheckpointError, ParityError, FileExistsError, QuantizationError) as exc:
        print(f"import-hf: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:  # the quantize flags
        print(f"import-hf: {exc}", file=sys.stderr)
        return 1
    summary: dict[str, object] = {"model_dir": str(out), "parity": parity.__dict__}
    written = read_manifest(out)
    if written.optimization is not None:
        summary["optimization"] = written.optimization.model_dump(mode="json")
    quantization = written.quantization
    if quantization is not None:
        summary["quantization"] = quantization.model_dump(mode="json")
    print(json.dumps(summary))
    return 0
