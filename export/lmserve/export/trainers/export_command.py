"""`lmserve export-rnn`: a train-rnn checkpoint -> a model folder (ONNX or TorchScript).

The exported model is checked against PyTorch eager before the folder appears (rnn/parity.py);
the manifest records the architecture, tokenizer, checksums and the measured perplexities.
A `--cell transformer` checkpoint goes to lmserve.export.hf's ONNX export with past key values
instead (transformer_folder.py), checked against transformers' own forward.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from lmserve.export.quantize import (
    TORCHSCRIPT_NOT_QUANTIZED,
    add_quantize_flags,
    quantize_from_args,
)

if TYPE_CHECKING:
    from torch import nn

    from lmserve.export.trainers.loop import Scorer
    from lmserve.server.manifest import TokenizerSpec


class Measurable(Protocol):
    """What measured_metrics reads of a checkpoint, recurrent or transformer."""

    @property
    def path(self) -> Path: ...
    @property
    def model(self) -> nn.Module: ...
    @property
    def data(self) -> dict[str, Any]: ...
    @property
    def tokenizer(self) -> TokenizerSpec: ...


HELP = "Export a train-rnn checkpoint as a model folder (ONNX or TorchScript), parity-checked."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", type=Path, help="checkpoint-best.pt of lmserve train-rnn")
    parser.add_argument("model_dir", type=Path, help="the model folder to write")
    parser.add_argument("--name", help="model name (default: the folder's name)")
    parser.add_argument("--format", choices=["onnx", "torchscript"], default="onnx")
    parser.add_argument("--description", default="")
    parser.add_argument("--opset", type=int, default=17, help="ONNX opset (17 or newer)")
    parser.add_argument(
        "--test", type=Path, help="test text: measure the per-word test perplexity now"
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="replace MODEL_DIR if it is a model folder"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    add_quantize_flags(parser)


def run(args: argparse.Namespace) -> int:
    import torch

    from lmserve.export.parity import ParityError
    from lmserve.export.rnn.folder import CheckpointError, load_checkpoint, write_model_folder
    from lmserve.export.trainers.transformer import is_transformer_checkpoint

    torch.set_num_threads(args.threads)

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    if args.quantize is not None and args.format != "onnx":
        log(f"lmserve export-rnn: {TORCHSCRIPT_NOT_QUANTIZED}")
        return 2
    if is_transformer_checkpoint(args.checkpoint):
        return _export_transformer(args, log)
    try:
        checkpoint = load_checkpoint(args.checkpoint)
        metrics = measured_metrics(checkpoint, test=args.test, log=log)
        result = write_model_folder(
            checkpoint,
            args.model_dir,
            fmt=args.format,
            name=args.name,
            description=args.description,
            metrics=metrics,
            opset=args.opset,
            overwrite=args.overwrite,
            log=log,
            quantize=quantize_from_args(args),
        )
    except (CheckpointError, ParityError, FileExistsError, ValueError) as exc:
        log(f"lmserve export-rnn: {exc}")
        return 1
    summary = {
        "model_dir": str(result.folder),
        "format": args.format,
        "files": result.sizes,
        "export_seconds": round(result.write_seconds, 2),
        "parity_seconds": round(result.check_seconds, 2),
        "parity_max_abs_diff": result.parity.max_abs_diff,
        "metrics": result.manifest.provenance.metrics,
    }
    if result.manifest.quantization is not None:
        summary["quantization"] = result.manifest.quantization.model_dump(mode="json")
    print(json.dumps(summary, indent=2))
    return 0


def _export_transformer(args: argparse.Namespace, log: Callable[[str], None]) -> int:
    from lmserve.export.trainers import transformer
    from lmserve.export.trainers.transformer_folder import export_model_folder

    if args.format != "onnx":
        log("lmserve export-rnn: a transformer exports to ONNX only: drop --format")
        return 2
    try:
        checkpoint = transformer.load_checkpoint(args.checkpoint)
        metrics = measured_metrics(checkpoint, test=args.test, log=log, scorer=transformer.evaluate)
        parity = export_model_folder(
            checkpoint,
            args.model_dir,
            name=args.name,
            description=args.description,
            metrics=metrics,
            overwrite=args.overwrite,
            log=log,
            quantize=quantize_from_args(args),
        )
    except (FileExistsError, ValueError) as exc:  # the hf export's ParityError included
        log(f"lmserve export-rnn: {exc}")
        return 1
    print(json.dumps({"model_dir": str(args.model_dir), "parity": str(parity), **metrics}))
    return 0


def measured_metrics(
    checkpoint: Measurable,
    *,
    test: Path | None = None,
    log: Callable[[str], None] = print,
    scorer: Scorer | None = None,
) -> dict[str, float]:
    """The provenance metrics: per-word perplexities (natural log, one `</s>` a line), epochs,
    parameters, training minutes.

    The checkpoint's validation perplexity is per token; `valid_counts` (tokens and words, saved
    by train-rnn) converts it exactly. A `report.json` beside the checkpoint supplies the test
    perplexity when its validation figure is this checkpoint's; `test` measures it afresh, with
    `scorer` (the recurrent models' evaluate by default).
    """
    from lmserve.export.rnn.data import count_words, make_codec, split_encoded
    from lmserve.export.trainers.recurrent import evaluate

    data, model = checkpoint.data, checkpoint.model
    history = data.get("history") or []
    metrics: dict[str, float] = {
        "parameters": sum(p.numel() for p in model.parameters()),
        "epochs": data.get("epoch", len(history)),
    }
    if history:
        metrics["train_minutes"] = round(sum(r.get("seconds", 0.0) for r in history) / 60, 1)
    token_ppl = data.get("valid_ppl")
    counts = data.get("valid_counts")
    if token_ppl is not None:
        if counts:
            # exp(-logprob / words) from exp(-logprob / tokens): same total log-probability.
            metrics["valid_perplexity"] = math.exp(
                math.log(token_ppl) * counts["tokens"] / counts["words"]
            )
        elif checkpoint.tokenizer.kind == "word":
            metrics["valid_perplexity"] = token_ppl  # a word is a token, `</s>` included
        if checkpoint.tokenizer.kind != "word":
            metrics["valid_token_perplexity"] = token_ppl
    report_path = checkpoint.path.parent / "report.json"
    if report_path.is_file() and "valid_perplexity" in metrics:
        report = json.loads(report_path.read_text())
        if math.isclose(
            report.get("valid_perplexity", -1), metrics["valid_perplexity"], rel_tol=1e-6
        ):
            for key in ("test_perplexity", "test_token_perplexity", "train_minutes"):
                if key in report:
                    metrics[key] = report[key]
    if test is not None:
        with test.open(encoding="utf-8") as f:
            lines = list(f)
        codec = make_codec(checkpoint.tokenizer, data["vocab"], data.get("tokenizer_json"))
        score: Scorer = evaluate if scorer is None else scorer
        result = score(model, split_encoded(codec.encode_texts(lines)), 64)
        metrics["test_perplexity"] = math.exp(
            -result.log_prob / count_words(lines, checkpoint.tokenizer)
        )
        if checkpoint.tokenizer.kind != "word":
            metrics["test_token_perplexity"] = result.perplexity
        log(f"test perplexity {metrics['test_perplexity']:.2f} per word")
    return metrics
