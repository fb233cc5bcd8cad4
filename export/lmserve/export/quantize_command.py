"""`lmserve quantize`: a served ONNX model folder -> an int8 copy beside it, its cost measured.

    lmserve quantize models/kjv-lstm models/kjv-lstm-int8 --held-out kjv/test.txt

For a folder whose source is gone (a committed model, a colleague's folder): the float files
are checked against their manifest's checksums, copied, then quantized and measured exactly as
`--quantize int8` on an export does (`lmserve.export.quantize`), and the copy is written as
every export writes (`write_served_folder`: staged, verified, moved into place whole).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lmserve.export.quantize import (
    TORCHSCRIPT_NOT_QUANTIZED,
    QuantizationError,
    add_quantize_flags,
    quantize_from_args,
)

HELP = "Quantize a served ONNX model folder to int8 (a new folder), its cost measured."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", type=Path, help="the float model folder (ONNX graphs)")
    parser.add_argument("model_dir", type=Path, help="the int8 model folder to write")
    parser.add_argument("--name", help="model name (default: the new folder's name)")
    parser.add_argument(
        "--overwrite", action="store_true", help="replace MODEL_DIR if it is a model folder"
    )
    add_quantize_flags(parser)
    parser.set_defaults(quantize="int8")


def run(args: argparse.Namespace) -> int:
    from lmserve.export.served_folder import Files, copy_listed_files, write_served_folder
    from lmserve.server.errors import ManifestError
    from lmserve.server.manifest import ModelManifest, read_manifest, verify_files

    try:
        source: Path = args.source
        manifest = read_manifest(source)
        verify_files(source, manifest)
        if manifest.quantization is not None:
            raise QuantizationError(f"{source} is quantized already")
        if manifest.format != "onnx":
            raise QuantizationError(TORCHSCRIPT_NOT_QUANTIZED)
        quantize = quantize_from_args(args)

        def write(staging: Path) -> Files:
            return copy_listed_files(source, manifest, staging)

        def check(staging: Path) -> None:
            verify_files(staging, manifest)  # the float files, as their manifest lists them

        def describe(staging: Path, files: Files, parity: None) -> ModelManifest:
            name = args.name or args.model_dir.name
            return manifest.model_copy(update={"name": name})

        written = write_served_folder(
            args.model_dir,
            write=write,
            check=check,
            manifest=describe,
            overwrite=args.overwrite,
            quantize=quantize,
        )
    except (ManifestError, FileExistsError, ValueError) as exc:  # QuantizationError included
        print(f"lmserve quantize: {exc}", file=sys.stderr)
        return 1
    quantization = written.manifest.quantization
    assert quantization is not None
    summary = {
        "model_dir": str(written.folder),
        "files": written.sizes,
        "quantization": quantization.model_dump(mode="json"),
    }
    print(json.dumps(summary, indent=2))
    return 0
