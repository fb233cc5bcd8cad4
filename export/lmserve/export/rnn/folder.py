"""A checkpoint of `lmserve train-rnn` -> a self-describing model folder the server loads.

    MODEL_DIR/
      model.yaml      kind (cell), format, tokenizer, special tokens, architecture, provenance,
                      every file with its sha256
      vocab.txt       one token a line, id = line index (escaped for char/BPE: see text/char.py)
      tokenizer.json  BPE models only (Hugging Face `tokenizers`)
      step.onnx score.onnx weights.bin   (--format onnx)   or   model.ts   (--format torchscript)

The folder is written by `write_served_folder`: staged beside MODEL_DIR and renamed into place
only after the exported model has passed the parity check, so a failed export never leaves a
half-written model behind.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from lmserve.export.parity import ParityReport
from lmserve.export.quantize import TORCHSCRIPT_NOT_QUANTIZED, Quantize
from lmserve.export.rnn.model import RecurrentLMConfig
from lmserve.export.rnn.nets import NeuralLM, build_model
from lmserve.export.rnn.parity import OnnxRunner, TorchScriptRunner, check_parity
from lmserve.export.served_folder import Files, ServedFolder, write_served_folder
from lmserve.server.manifest import (
    FileEntry,
    ModelFormat,
    ModelKind,
    ModelManifest,
    Provenance,
    TokenizerKind,
    TokenizerSpec,
)
from lmserve.server.text.char import write_vocab_file

ExportFormat = Literal["onnx", "torchscript"]
VOCAB_FILE = "vocab.txt"
TOKENIZER_FILE = "tokenizer.json"
REQUIRED_KEYS = ("model_config", "state_dict", "vocab", "tokenizer")


class CheckpointError(ValueError):
    """The file is not a usable train-rnn checkpoint; the message says why."""


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    model: NeuralLM
    data: dict[str, Any]

    @property
    def tokenizer(self) -> TokenizerSpec:
        return TokenizerSpec.model_validate(self.data["tokenizer"])


def load_checkpoint(path: Path) -> Checkpoint:
    """Loads and checks a checkpoint; raises CheckpointError with the reason if it is unusable."""
    import torch

    if not path.is_file():
        raise CheckpointError(f"{path}: no such file")
    try:
        # weights_only: a checkpoint holds tensors and plain Python values, so loading one can
        # not run code; a file that needs more is not ours.
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for a truncated or foreign file
        raise CheckpointError(f"{path}: not a readable checkpoint ({exc})") from exc
    if not isinstance(data, dict) or (missing := [k for k in REQUIRED_KEYS if k not in data]):
        raise CheckpointError(f"{path}: not a train-rnn checkpoint (missing {missing})")
    try:
        config = RecurrentLMConfig(**data["model_config"])
        model = build_model(config)
        model.load_state_dict(data["state_dict"])
        TokenizerSpec.model_validate(data["tokenizer"])
    except Exception as exc:  # pydantic ValidationError, load_state_dict's RuntimeError
        raise CheckpointError(f"{path}: inconsistent checkpoint: {exc}") from exc
    if len(data["vocab"]) != config.vocab_size:
        raise CheckpointError(
            f"{path}: vocabulary has {len(data['vocab'])} entries, the model {config.vocab_size}"
        )
    if data["tokenizer"].get("kind") == TokenizerKind.BPE and "tokenizer_json" not in data:
        raise CheckpointError(f"{path}: BPE checkpoint without its tokenizer_json")
    model.eval()
    return Checkpoint(path, model, data)


def architecture(config: RecurrentLMConfig, fmt: ExportFormat, opset: int) -> dict[str, Any]:
    from lmserve.export.rnn.to_onnx import io_names

    arch: dict[str, Any] = {
        "cell": config.cell,
        "vocab_size": config.vocab_size,
        "embedding_size": config.embedding_size,
        "hidden_size": config.hidden_size,
        "num_layers": config.num_layers,
        "tie_weights": config.tie_weights,
        "dropout": config.dropout,
        "state_names": list(config.state_names),
        "state_shape": "[num_layers, batch, hidden_size]",
    }
    if config.cell == "ffnn":
        arch.update(
            order=config.order,
            state_shape="[1, batch, order - 1] int64: the last order - 1 token ids",
        )
    if fmt == "onnx":
        arch["opset"] = opset
        arch.update(io_names(config.cell))
    else:
        # Method signatures of model.ts; `c` is an empty tensor for RNN/GRU/FFNN.
        h = config.state_names[0]
        arch.update(
            step_inputs=["tokens", h, "c"],
            step_outputs=["log_probs", f"{h}_out", "c_out"],
            score_inputs=["tokens", "targets", h, "c"],
            score_outputs=["token_log_probs", f"{h}_out", "c_out"],
        )
    return arch


def write_model_folder(
    checkpoint: Checkpoint,
    model_dir: Path,
    *,
    fmt: ExportFormat = "onnx",
    name: str | None = None,
    description: str = "",
    metrics: dict[str, float] | None = None,
    opset: int | None = None,
    overwrite: bool = False,
    log: Callable[[str], None] = lambda _: None,
    quantize: Quantize | None = None,
) -> ServedFolder[ParityReport]:
    """Exports, checks parity with PyTorch eager, writes the manifest, verifies it, then moves
    the folder in place (`write_served_folder`); with `quantize`, the ONNX graphs are then
    quantized and measured (`lmserve.export.quantize`)."""
    from lmserve.export.rnn.to_onnx import OPSET, export_onnx
    from lmserve.export.rnn.to_torchscript import export_torchscript

    if quantize is not None and fmt != "onnx":
        raise ValueError(TORCHSCRIPT_NOT_QUANTIZED)
    opset = opset or OPSET
    model, data, spec = checkpoint.model, checkpoint.data, checkpoint.tokenizer
    kind = TokenizerKind(spec.kind)
    if kind == TokenizerKind.BPE:
        spec = spec.model_copy(update={"file": "tokenizer"})

    def write(staging: Path) -> Files:
        # Word models list words as they are; character/BPE tokens are escaped (text/char.py).
        write_vocab_file(staging / VOCAB_FILE, data["vocab"], escape=kind != TokenizerKind.WORD)
        files = {"vocab": VOCAB_FILE}
        if kind == TokenizerKind.BPE:
            (staging / TOKENIZER_FILE).write_text(data["tokenizer_json"], encoding="utf-8")
            files["tokenizer"] = TOKENIZER_FILE
        if fmt == "onnx":
            files.update(export_onnx(model, staging, opset=opset))
        else:
            files.update(export_torchscript(model, staging))
        return files

    def check(staging: Path) -> ParityReport:
        log(f"exported {fmt}; checking parity with PyTorch eager")
        runner = OnnxRunner if fmt == "onnx" else TorchScriptRunner
        return check_parity(model, runner(staging, model.config.cell))

    def manifest(staging: Path, files: Files, parity: ParityReport) -> ModelManifest:
        return ModelManifest(
            name=name or model_dir.name,
            kind=ModelKind(model.config.cell),
            format=ModelFormat(fmt),
            description=description,
            files={key: FileEntry(path=path) for key, path in files.items()},
            tokenizer=spec,
            architecture=architecture(model.config, fmt, opset),
            provenance=trained_provenance(data, metrics),
        )

    return write_served_folder(
        model_dir,
        write=write,
        check=check,
        manifest=manifest,
        overwrite=overwrite,
        quantize=quantize,
    )


def trained_provenance(data: dict[str, Any], metrics: dict[str, float] | None) -> Provenance:
    """A train-rnn checkpoint's provenance (corpus, command, now, finite metrics), for every
    folder exported from one: recurrent here, the transformer's in trainers."""
    return Provenance(
        training_corpus=data.get("training_corpus"),
        trained_by=data.get("command"),
        created=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        metrics={k: v for k, v in (metrics or {}).items() if math.isfinite(v)},
    )
