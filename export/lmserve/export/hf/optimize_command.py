"""`lmserve optimize`: a transformer folder served as exported -> an optimized copy beside it.

    lmserve optimize models/my-optimum-gpt2 models/my-gpt2-fused [--quantize int8]

For a folder whose graph did not go through `import-hf`'s optimization: one `optimum-cli export
onnx --task text-generation-with-past` wrote (no model.yaml), or one `import-hf --no-optimize`
wrote. Its graph is rewritten by ONNX Runtime's transformer optimizer (`hf.optimize`, as
`import-hf` does by default) and checked against the graph it came from, the source graph
being the reference (no checkpoint is needed): seeded token ids read in one pass, in two
chunks through the cache and left-padded, within `PARITY_NATS` (`hf.parity`). The copy is
written as every export writes (`write_served_folder`: staged, verified, moved into place
whole) with a model.yaml that records what was fused; `--quantize int8` quantizes the optimized
graph afterwards, its cost measured against it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from lmserve.export.quantize import add_quantize_flags

HELP = "Optimize a transformer folder's graph with ONNX Runtime's fusions (a new folder)."
# Token ids read by the parity check: seeded, so a run is repeatable.
_SEED = 38
_LENGTHS = (13, 7, 2)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "source", type=Path, help="the transformer folder (an optimum export or a model folder)"
    )
    parser.add_argument("model_dir", type=Path, help="the optimized model folder to write")
    parser.add_argument("--name", help="model name (default: the new folder's name)")
    parser.add_argument(
        "--overwrite", action="store_true", help="replace MODEL_DIR if it is a model folder"
    )
    add_quantize_flags(parser)


class _GraphReference:
    """The source graph answering as `hf.parity.check_parity` asks a transformers model to:
    whole texts read in one pass, fed as that check feeds a graph (`hf.parity.run_graph`); its
    log-probabilities stand for the logits (log_softmax leaves them as they are)."""

    def __init__(self, session: Any, cache: Any) -> None:
        self.session, self.cache = session, cache

    def __call__(self, ids: Any) -> SimpleNamespace:
        import numpy as np
        import torch

        from lmserve.export.hf.parity import run_graph

        tokens = ids.numpy()
        log_probs, _ = run_graph(self.session, self.cache, tokens, np.ones_like(tokens))
        return SimpleNamespace(logits=torch.from_numpy(log_probs))


def _source_manifest(source: Path) -> Any:
    """The folder's manifest (checked against its files), or the one its optimum export
    implies; refused unless it is a float transformer served as exported."""
    from lmserve.export.hf.optimize import OptimizationError
    from lmserve.server.families.hf_folder import is_optimum_folder, optimum_manifest
    from lmserve.server.manifest import find_manifest, read_manifest, verify_files

    if find_manifest(source) is not None:
        manifest = read_manifest(source)
        verify_files(source, manifest)
    elif is_optimum_folder(source):
        manifest = optimum_manifest(source)
    else:
        raise OptimizationError(
            f"{source} is neither a model folder nor an optimum export "
            "(model.onnx, config.json and tokenizer.json)"
        )
    if manifest.kind != "transformer" or manifest.format != "onnx":
        raise OptimizationError(f"{source} is a {manifest.kind} model: transformers only")
    if manifest.optimization is not None:
        raise OptimizationError(f"{source} is optimized already")
    if manifest.quantization is not None:
        raise OptimizationError(
            f"{source} is quantized: optimize its float folder, with --quantize int8 here"
        )
    return manifest


def run(args: argparse.Namespace) -> int:
    import numpy as np
    import onnxruntime as ort  # type: ignore[import-untyped,unused-ignore]

    from lmserve.export.hf.optimize import optimize_graph
    from lmserve.export.hf.parity import Parity, check_parity
    from lmserve.export.quantize import quantize_from_args
    from lmserve.export.served_folder import (
        Files,
        check_writable,
        copy_listed_files,
        write_served_folder,
    )
    from lmserve.server.backends.transformer import CacheShape
    from lmserve.server.errors import ManifestError, ModelLoadError
    from lmserve.server.manifest import GraphOptimization, ModelManifest, read_json_object

    source: Path = args.source
    try:
        quantize = quantize_from_args(args)
        check_writable(args.model_dir, overwrite=args.overwrite)
        manifest = _source_manifest(source)
        graph = manifest.files["graph"].path
        config = read_json_object(manifest.file_path(source, "config"))
        cache = CacheShape.from_config(config, str(source / manifest.files["config"].path))
        vocab = int(manifest.architecture.get("vocab_size") or config.get("vocab_size") or 2)
        rng = np.random.default_rng(_SEED)
        texts = [rng.integers(0, vocab, n).tolist() for n in _LENGTHS if n <= cache.max_positions]
        optimized: list[GraphOptimization] = []

        def write(staging: Path) -> Files:
            files = copy_listed_files(source, manifest, staging)
            fused = optimize_graph(staging / graph, config)
            if fused is None:
                raise ValueError(f"{source}: ONNX Runtime's optimizer found nothing to fuse")
            optimized[:] = [fused]
            return files

        def check(staging: Path) -> Parity:
            cpu = ["CPUExecutionProvider"]
            reference = _GraphReference(
                ort.InferenceSession(str(source / graph), providers=cpu), cache
            )
            session = ort.InferenceSession(str(staging / graph), providers=cpu)
            return check_parity(reference, session, cache, texts).require()

        def describe(staging: Path, files: Files, parity: Parity) -> ModelManifest:
            figures = {f"optimized_{k}": v for k, v in parity.as_provenance().items()}
            provenance = manifest.provenance.model_copy(
                update={"parity": {**manifest.provenance.parity, **figures}}
            )
            return manifest.model_copy(
                update={
                    "name": args.name or args.model_dir.name,
                    "provenance": provenance,
                    "optimization": optimized[0],
                }
            )

        written = write_served_folder(
            args.model_dir,
            write=write,
            check=check,
            manifest=describe,
            overwrite=args.overwrite,
            quantize=quantize,
        )
    except (ManifestError, ModelLoadError, FileExistsError, ValueError) as exc:
        # ParityError, OptimizationError and QuantizationError are ValueErrors
        print(f"lmserve optimize: {exc}", file=sys.stderr)
        return 1
    summary: dict[str, Any] = {
        "model_dir": str(written.folder),
        "parity": written.parity.__dict__,
        "optimization": written.manifest.optimization.model_dump(mode="json")
        if written.manifest.optimization
        else None,
    }
    if written.manifest.quantization is not None:
        summary["quantization"] = written.manifest.quantization.model_dump(mode="json")
    print(json.dumps(summary))
    return 0
