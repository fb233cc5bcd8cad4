"""Tiny recurrent model folders for tests and benchmarks, written by the real exporter.

    model = tiny_model("lstm", vocab_words)
    write_onnx_folder(model, vocab_words, folder, name="tiny-lstm")
    write_torchscript_folder(model, vocab_words, folder2, name="tiny-lstm-ts")

Both go through `lmserve export-rnn`'s writer (`lmserve.export.rnn.folder.write_model_folder`):
the same `model.yaml`, `vocab.txt`, `step.onnx` + `score.onnx` + `weights.bin` or `model.ts`
that users get, parity-checked against PyTorch eager before the folder appears. Tests of broken
folders start from these and break one thing by hand.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from lmserve.export.rnn.folder import Checkpoint, ExportFormat, write_model_folder
from lmserve.export.rnn.model import CellType, RecurrentLM, RecurrentLMConfig
from lmserve.server.manifest import ModelManifest

WORDS = "the cat sat on mat a dog ran to and in house big small red".split()
VOCAB = ["<unk>", "<s>", "</s>", *WORDS]


def tiny_model(cell: CellType = "lstm", vocab: Sequence[str] = VOCAB, seed: int = 0) -> RecurrentLM:
    torch.manual_seed(seed)
    config = RecurrentLMConfig(
        vocab_size=len(vocab), cell=cell, embedding_size=8, hidden_size=8, num_layers=2,
        dropout=0.0,
    )  # fmt: skip
    model = RecurrentLM(config).eval()
    with torch.no_grad():  # a random init with visible structure, not near-uniform outputs
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    return model


def write_folder(
    model: RecurrentLM,
    vocab: Sequence[str],
    folder: Path,
    *,
    name: str,
    fmt: ExportFormat,
    tokenizer: dict[str, Any] | None = None,
) -> ModelManifest:
    """Exports `model` (a word model over `vocab` unless `tokenizer` says otherwise) to `folder`."""
    data: dict[str, Any] = {
        "vocab": list(vocab),
        "tokenizer": {"kind": "word", **(tokenizer or {})},
        "training_corpus": "tests",
        "command": "tests",
    }
    # The checkpoint's file is only read for a report.json beside it, which the metrics given
    # here make unnecessary.
    checkpoint = Checkpoint(folder.with_suffix(".pt"), model.eval(), data)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # graphs this small export and check ~10x faster on one thread
    try:
        result = write_model_folder(
            checkpoint, folder, fmt=fmt, name=name, metrics={"valid_perplexity": 1.0}
        )
    finally:
        torch.set_num_threads(threads)
    return result.manifest


def write_onnx_folder(
    model: RecurrentLM, vocab: Sequence[str], folder: Path, *, name: str, **extra: Any
) -> ModelManifest:
    return write_folder(model, vocab, folder, name=name, fmt="onnx", **extra)


def write_torchscript_folder(
    model: RecurrentLM, vocab: Sequence[str], folder: Path, *, name: str, **extra: Any
) -> ModelManifest:
    return write_folder(model, vocab, folder, name=name, fmt="torchscript", **extra)


def eager_token_log_probs(
    model: RecurrentLM,
    ids: Sequence[int],
    eos: bool = True,
    *,
    bos_id: int | None = None,
    eos_id: int | None = None,
) -> list[float]:
    """The PyTorch model's own per-token natural-log probs of `<s> ids [</s>]` (ids of VOCAB's
    `<s>`/`</s>` unless given)."""
    bos_id = VOCAB.index("<s>") if bos_id is None else bos_id
    eos_id = VOCAB.index("</s>") if eos_id is None else eos_id
    inputs = [bos_id, *ids]
    targets = [*ids, eos_id] if eos else list(ids)
    inputs = inputs[: len(targets)]
    if not targets:
        return []
    with torch.no_grad():
        logits, _ = model(torch.tensor([inputs]), model.initial_state(1))
        lp = torch.log_softmax(logits.double(), dim=-1)[0]
    return [float(lp[t, w]) for t, w in enumerate(targets)]
