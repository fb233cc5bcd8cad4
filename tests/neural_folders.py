"""Tiny recurrent model folders for tests and benchmarks, written by the exporter's contract.

    model = tiny_model("lstm", vocab_words)
    write_onnx_folder(model, vocab_words, folder, name="tiny-lstm")
    write_torchscript_folder(model, vocab_words, folder2, name="tiny-lstm-ts")

Until `lmserve export-rnn` lands this is the reference writer of the contract: `model.yaml`,
`vocab.txt`, `step.onnx` + `score.onnx` (+ `weights.bin`) or `model.ts`.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from lmserve.export.rnn.model import RecurrentLM, RecurrentLMConfig
from lmserve.server.registry.manifest import ModelManifest, sha256_of, write_manifest

WORDS = "the cat sat on mat a dog ran to and in house big small red".split()
VOCAB = ["<unk>", "<s>", "</s>", *WORDS]


def tiny_model(cell: str = "lstm", vocab: Sequence[str] = VOCAB, seed: int = 0) -> RecurrentLM:
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


class _Graph(nn.Module):
    """The exported signature: (tokens, [targets,] h, c) -> (log-probs, h_out, c_out)."""

    def __init__(self, model: RecurrentLM) -> None:
        super().__init__()
        self.model = model
        self.lstm = model.config.cell == "lstm"

    def _forward(self, tokens: Tensor, h: Tensor, c: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        state = (h, c) if self.lstm else (h,)
        logits, new = self.model(tokens, state)
        return torch.log_softmax(logits, dim=-1), new[0], new[1] if self.lstm else c

    def step(self, tokens: Tensor, h: Tensor, c: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return self._forward(tokens, h, c)

    def score(
        self, tokens: Tensor, targets: Tensor, h: Tensor, c: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        lp, h2, c2 = self._forward(tokens, h, c)
        return lp.gather(-1, targets.unsqueeze(-1)).squeeze(-1), h2, c2


class _Step(_Graph):
    def forward(self, tokens: Tensor, h: Tensor, c: Tensor | None = None) -> Any:
        lp, h2, c2 = self.step(tokens, h, h if c is None else c)
        return (lp, h2, c2) if self.lstm else (lp, h2)


class _Score(_Graph):
    def forward(self, tokens: Tensor, targets: Tensor, h: Tensor, c: Tensor | None = None) -> Any:
        lp, h2, c2 = self.score(tokens, targets, h, h if c is None else c)
        return (lp, h2, c2) if self.lstm else (lp, h2)


def _manifest(
    folder: Path, model: RecurrentLM, name: str, fmt: str, files: dict[str, str], **extra: Any
) -> ModelManifest:
    config = model.config
    manifest = ModelManifest.model_validate(
        {
            "name": name,
            "kind": config.cell,
            "format": fmt,
            "files": {k: {"path": p, "sha256": sha256_of(folder / p)} for k, p in files.items()},
            "tokenizer": {"kind": "word", **extra.get("tokenizer", {})},
            "architecture": {
                "cell": config.cell,
                "vocab_size": config.vocab_size,
                "embedding_size": config.embedding_size,
                "hidden_size": config.hidden_size,
                "num_layers": config.num_layers,
                "tie_weights": config.tie_weights,
                "state_names": list(config.state_names),
            },
            "provenance": {"trained_by": "tests", "metrics": {"valid_perplexity": 1.0}},
        }
    )
    write_manifest(folder, manifest)
    return manifest


def write_onnx_folder(
    model: RecurrentLM, vocab: Sequence[str], folder: Path, *, name: str, **extra: Any
) -> ModelManifest:
    import onnx

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    cfg = model.config
    h = torch.zeros(cfg.num_layers, 2, cfg.hidden_size)
    c = torch.zeros_like(h) if cfg.cell == "lstm" else torch.empty(0)
    tokens = torch.zeros(2, 3, dtype=torch.long)
    states = ["h", "c"] if cfg.cell == "lstm" else ["h"]
    state_axes = {s: {1: "batch"} for s in states}
    out_axes = {f"{s}_out": {1: "batch"} for s in states}
    seq = {0: "batch", 1: "time"}
    for graph, fname, args, inputs, first in (
        (_Step(model), "step.onnx", (tokens, h, c), ["tokens", *states], "log_probs"),
        (
            _Score(model),
            "score.onnx",
            (tokens, tokens, h, c),
            ["tokens", "targets", *states],
            "token_log_probs",
        ),
    ):
        if cfg.cell != "lstm":  # RNN/GRU graphs have no c input
            args = args[:-1]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                graph,
                args,
                str(folder / fname),
                input_names=inputs,
                output_names=[first, *[f"{s}_out" for s in states]],
                dynamic_axes={
                    "tokens": seq,
                    "targets": seq,
                    first: seq,
                    **state_axes,
                    **out_axes,
                },  # fmt: skip
                opset_version=17,
                dynamo=False,
            )
        proto = onnx.load(str(folder / fname))
        onnx.save_model(
            proto,
            str(folder / fname),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=f"{fname}.weights",
            size_threshold=0,
        )
    files = {
        "vocab": "vocab.txt",
        "step": "step.onnx",
        "score": "score.onnx",
        "weights": "step.onnx.weights",
        "score_weights": "score.onnx.weights",
    }
    return _manifest(folder, model, name, "onnx", files, **extra)


def write_torchscript_folder(
    model: RecurrentLM, vocab: Sequence[str], folder: Path, *, name: str, **extra: Any
) -> ModelManifest:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    cfg = model.config
    h = torch.zeros(cfg.num_layers, 2, cfg.hidden_size)
    c = torch.zeros_like(h) if cfg.cell == "lstm" else torch.empty(0)
    tokens = torch.zeros(2, 3, dtype=torch.long)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace_module(
            _Graph(model), {"step": (tokens, h, c), "score": (tokens, tokens, h, c)}
        )
        traced.save(str(folder / "model.ts"))
    files = {"vocab": "vocab.txt", "model": "model.ts"}
    return _manifest(folder, model, name, "torchscript", files, **extra)


def eager_token_log_probs(model: RecurrentLM, ids: Sequence[int], eos: bool = True) -> list[float]:
    """The PyTorch model's own per-token natural-log probs of `<s> ids [</s>]`."""
    bos_id, eos_id = VOCAB.index("<s>"), VOCAB.index("</s>")
    inputs = [bos_id, *ids]
    targets = [*ids, eos_id] if eos else list(ids)
    inputs = inputs[: len(targets)]
    if not targets:
        return []
    with torch.no_grad():
        logits, _ = model(torch.tensor([inputs]), model.initial_state(1))
        lp = torch.log_softmax(logits.double(), dim=-1)[0]
    return [float(lp[t, w]) for t, w in enumerate(targets)]
