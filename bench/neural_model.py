"""A random-initialised recurrent model of the default size, exported by `lmserve export-rnn`'s
functions into cached ONNX and TorchScript folders (the benchmarks' shared fixture).

    onnx_dir, ts_dir, model = default_folders()
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from common import CACHE_DIR, log

VOCAB_SIZE = 12_352  # the KJV word vocabulary with specials


def _manifest(folder: Path, model: Any, fmt: str, files: dict[str, str]) -> None:
    from lmserve.export.rnn.folder import architecture
    from lmserve.export.rnn.to_onnx import OPSET
    from lmserve.server.manifest import ModelManifest, sha256_of, write_manifest

    manifest = ModelManifest.model_validate(
        {
            "name": f"bench-lstm-{fmt}",
            "kind": model.config.cell,
            "format": fmt,
            "files": {k: {"path": p, "sha256": sha256_of(folder / p)} for k, p in files.items()},
            "tokenizer": {"kind": "word"},
            "architecture": architecture(model.config, fmt, OPSET),  # type: ignore[arg-type]
        }
    )
    write_manifest(folder, manifest)


def build_model(
    cell: Literal["rnn", "lstm", "gru"] = "lstm", size: int = 512, vocab: int = VOCAB_SIZE
) -> Any:
    import torch

    from lmserve.export.rnn.model import RecurrentLM, RecurrentLMConfig

    torch.manual_seed(0)
    config = RecurrentLMConfig(
        vocab_size=vocab, cell=cell, embedding_size=size, hidden_size=size, num_layers=1,
        dropout=0.0, tie_weights=True,
    )  # fmt: skip
    return RecurrentLM(config).eval()


def default_folders(root: Path = CACHE_DIR / "neural") -> tuple[Path, Path, Any]:
    """(onnx folder, torchscript folder, eager model), exported once and cached."""
    from lmserve.export.rnn.to_onnx import export_onnx
    from lmserve.export.rnn.to_torchscript import export_torchscript

    model = build_model()
    onnx_dir, ts_dir = root / "bench-lstm-onnx", root / "bench-lstm-ts"
    words = ["<unk>", "<s>", "</s>", *(f"w{i}" for i in range(VOCAB_SIZE - 3))]
    for folder, fmt, export in ((onnx_dir, "onnx", export_onnx), (ts_dir, "torchscript", None)):
        if (folder / "model.yaml").is_file():
            continue
        log(f"exporting {folder}")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "vocab.txt").write_text("\n".join(words) + "\n", encoding="utf-8")
        files = export(model, folder) if export else export_torchscript(model, folder)
        _manifest(folder, model, fmt, {"vocab": "vocab.txt", **files})
    return onnx_dir, ts_dir, model
