"""export-rnn: ONNX and TorchScript folders that match PyTorch eager, share their weights, and
refuse bad checkpoints. Models are tiny (vocabulary 60, hidden 16) so each export takes < 1 s."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from lmserve.export.parity import ParityError
from lmserve.export.rnn.folder import ExportFormat, load_checkpoint, write_model_folder
from lmserve.export.rnn.model import CellType, RecurrentLM, RecurrentLMConfig
from lmserve.export.rnn.parity import OnnxRunner, TorchScriptRunner, check_parity
from lmserve.export.rnn.to_onnx import ALIGNMENT, EXTERNAL_MIN_BYTES
from lmserve.export.rnn.to_torchscript import (
    export_torchscript,
    load_torchscript,
    quiet_torchscript,
)
from lmserve.export.trainers.export_command import measured_metrics
from lmserve.export.trainers.loop import save_checkpoint
from lmserve.server.cli import main
from lmserve.server.manifest import read_manifest, verify_files

VOCAB = ["<unk>", "<s>", "</s>", *(f"w{i}" for i in range(57))]
CELLS: list[CellType] = ["rnn", "lstm", "gru"]
FORMATS: list[ExportFormat] = ["onnx", "torchscript"]


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def tiny_model(cell: CellType, seed: int = 0, layers: int = 2) -> RecurrentLM:
    torch.manual_seed(seed)
    config = RecurrentLMConfig(
        vocab_size=len(VOCAB), cell=cell, embedding_size=16, hidden_size=16, num_layers=layers
    )
    model = RecurrentLM(config)
    with torch.no_grad():  # sharper than the uniform init, so differences would show
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return model.eval()


def checkpoint_file(tmp_path: Path, cell: CellType, **extra: object) -> Path:
    path = tmp_path / f"{cell}.pt"
    payload = {"vocab": VOCAB, "tokenizer": {"kind": "word"}, "valid_ppl": 40.0, "epoch": 3}
    save_checkpoint(path, tiny_model(cell), {**payload, **extra})
    return path


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("cell", CELLS)
def test_export_matches_eager_with_state_carried(
    tmp_path: Path, cell: CellType, fmt: ExportFormat
) -> None:
    checkpoint = load_checkpoint(checkpoint_file(tmp_path, cell))
    metrics = measured_metrics(checkpoint)
    result = write_model_folder(
        checkpoint,
        tmp_path / "model",
        fmt=fmt,
        metrics=metrics,
    )
    assert result.parity.max_abs_diff < 1e-4 and result.parity.cases == 18

    manifest = read_manifest(tmp_path / "model")
    verify_files(tmp_path / "model", manifest)
    arch = manifest.architecture
    assert (manifest.kind, manifest.format) == (cell, fmt)
    assert arch["state_names"] == (["h", "c"] if cell == "lstm" else ["h"])
    assert arch["vocab_size"] == len(VOCAB) and arch["num_layers"] == 2
    assert manifest.provenance.metrics["valid_perplexity"] == 40.0
    assert manifest.provenance.metrics["epochs"] == 3
    assert manifest.provenance.metrics["parameters"] == sum(
        p.numel() for p in checkpoint.model.parameters()
    )

    # Checked again here, independently of the exporter's own check, with other inputs.
    runner_cls = OnnxRunner if fmt == "onnx" else TorchScriptRunner
    runner = runner_cls(tmp_path / "model", cell)
    report = check_parity(tiny_model(cell), runner, batch_sizes=(2, 5), lengths=(3, 17), seed=7)
    assert report.max_abs_diff < 1e-4


@pytest.mark.parametrize("fmt", FORMATS)
def test_parity_check_catches_a_different_model(tmp_path: Path, fmt: ExportFormat) -> None:
    checkpoint = load_checkpoint(checkpoint_file(tmp_path, "gru"))
    write_model_folder(checkpoint, tmp_path / "m", fmt=fmt)
    runner_cls = OnnxRunner if fmt == "onnx" else TorchScriptRunner
    with pytest.raises(ParityError, match="differ from PyTorch eager"):
        check_parity(tiny_model("gru", seed=1), runner_cls(tmp_path / "m", "gru"))


def test_score_graph_is_gather_of_step_graph(tmp_path: Path) -> None:
    write_model_folder(load_checkpoint(checkpoint_file(tmp_path, "lstm")), tmp_path / "m")
    runner = OnnxRunner(tmp_path / "m", "lstm")
    rng = np.random.default_rng(3)
    tokens = rng.integers(0, len(VOCAB), (4, 9), dtype=np.int64)
    targets = rng.integers(0, len(VOCAB), (4, 9), dtype=np.int64)
    state = tuple(rng.standard_normal((2, 4, 16)).astype(np.float32) for _ in range(2))
    log_probs, step_state = runner.step(tokens, state)
    picked, score_state = runner.score(tokens, targets, state)
    assert picked.shape == (4, 9)
    expected = np.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
    np.testing.assert_allclose(picked, expected, atol=1e-6)
    for a, b in zip(step_state, score_state, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)
    # log-probs are normalised distributions (natural log).
    np.testing.assert_allclose(np.exp(log_probs).sum(-1), 1.0, atol=1e-5)


def _external_ranges(path: Path) -> set[tuple[str, str, str]]:
    graph = onnx.load(str(path), load_external_data=False).graph
    ranges = set()
    for tensor in graph.initializer:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            info = {e.key: e.value for e in tensor.external_data}
            ranges.add((info["location"], info["offset"], info["length"]))
    return ranges


def test_both_graphs_share_one_weights_file(tmp_path: Path) -> None:
    checkpoint = load_checkpoint(checkpoint_file(tmp_path, "lstm"))
    write_model_folder(checkpoint, tmp_path / "m")
    folder = tmp_path / "m"
    names = {p.name for p in folder.iterdir()}
    assert names == {"model.yaml", "vocab.txt", "step.onnx", "score.onnx", "weights.bin"}
    step, score = _external_ranges(folder / "step.onnx"), _external_ranges(folder / "score.onnx")
    assert step and step == score
    param_bytes = 4 * sum(p.numel() for p in checkpoint.model.parameters())
    stored = sum(int(length) for _, _, length in step)
    # Every weight once: the stored tensors are at most the parameters (small biases stay inline)
    # and the file at most that plus alignment padding.
    assert 0.8 * param_bytes < stored <= param_bytes
    assert (folder / "weights.bin").stat().st_size <= stored + ALIGNMENT * len(step)
    # The graphs themselves keep only small tensors inline.
    for name in ("step.onnx", "score.onnx"):
        graph = onnx.load(str(folder / name), load_external_data=False).graph
        inline = [t for t in graph.initializer if t.data_location != onnx.TensorProto.EXTERNAL]
        assert all(len(t.raw_data) < EXTERNAL_MIN_BYTES for t in inline)


def test_torchscript_rnn_passes_empty_c_through(tmp_path: Path) -> None:
    export_torchscript(tiny_model("rnn"), tmp_path)
    module = load_torchscript(tmp_path / "model.ts")
    empty = torch.empty(0)
    lp, h, c = module.step(torch.zeros(3, 4, dtype=torch.long), torch.zeros(2, 3, 16), empty)
    assert lp.shape == (3, 4, len(VOCAB)) and h.shape == (2, 3, 16) and c.numel() == 0


def test_torchscript_deprecation_warning_does_not_escape(tmp_path: Path) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        export_torchscript(tiny_model("lstm"), tmp_path)
        load_torchscript(tmp_path / "model.ts")
        with quiet_torchscript():
            warnings.warn("a user's own warning", DeprecationWarning, stacklevel=1)
    messages = [str(w.message) for w in caught]
    assert not [m for m in messages if "torch.jit" in m], messages
    assert "a user's own warning" in messages
    # Without the guard torch does warn, so the assertion above tests something.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.jit.load(str(tmp_path / "model.ts"))
    assert any("torch.jit" in str(w.message) for w in caught)


def test_export_rnn_command_writes_a_folder(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = checkpoint_file(tmp_path, "gru")
    assert main(["export-rnn", str(path), str(tmp_path / "m"), "--name", "tiny-gru",
                 "--format", "torchscript", "--description", "a test"]) == 0  # fmt: skip
    manifest = read_manifest(tmp_path / "m")
    assert (manifest.name, manifest.description) == ("tiny-gru", "a test")
    assert "parity_max_abs_diff" in capsys.readouterr().out
    # A second export into the same folder is refused unless asked to overwrite.
    assert main(["export-rnn", str(path), str(tmp_path / "m")]) == 1
    assert "exists" in capsys.readouterr().err
    assert main(["export-rnn", str(path), str(tmp_path / "m"), "--overwrite"]) == 0
    assert read_manifest(tmp_path / "m").format == "onnx"


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("truncate", "not a readable checkpoint"),
        ("foreign", "not a train-rnn checkpoint"),
        ("mismatch", "inconsistent checkpoint"),
        ("vocab", "vocabulary has 3 entries"),
    ],
)
def test_corrupt_checkpoint_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture, damage: str, message: str
) -> None:
    path = checkpoint_file(tmp_path, "lstm")
    if damage == "truncate":
        path.write_bytes(path.read_bytes()[:2000])
    elif damage == "foreign":
        torch.save({"weights": torch.zeros(3)}, path)
    elif damage == "mismatch":  # a state dict that does not fit the configuration
        data = torch.load(path, weights_only=True)
        data["model_config"]["hidden_size"] = 32
        data["model_config"]["embedding_size"] = 32
        torch.save(data, path)
    else:
        data = torch.load(path, weights_only=True)
        data["vocab"] = VOCAB[:3]
        torch.save(data, path)
    assert main(["export-rnn", str(path), str(tmp_path / "m")]) == 1
    assert message in capsys.readouterr().err
    assert not (tmp_path / "m").exists()
    assert not [p for p in tmp_path.iterdir() if "partial" in p.name]
