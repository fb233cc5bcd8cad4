"""The feed-forward (Bengio) LM: its window really is its whole memory, it learns, it exports to
ONNX and TorchScript at parity with PyTorch eager, and bad configurations are refused clearly.
Sizes are tiny (16 units, a 60-word vocabulary, 200 training lines)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from lmserve.export.parity import ParityError
from lmserve.export.rnn.data import BOS_ID, build_word_vocab, encode_sentences
from lmserve.export.rnn.ffnn import FeedForwardLM
from lmserve.export.rnn.folder import Checkpoint, ExportFormat, write_model_folder
from lmserve.export.rnn.model import RecurrentLM, RecurrentLMConfig
from lmserve.export.rnn.parity import OnnxRunner, check_parity
from lmserve.export.trainers.loop import BEST_CHECKPOINT, TrainConfig, train
from lmserve.export.trainers.recurrent import evaluate, load_checkpoint, train_batch
from lmserve.server.backends.onnx import OnnxBackend, OnnxOptions
from lmserve.server.backends.recurrent import RecurrentSpec
from lmserve.server.backends.torchscript import TorchScriptBackend
from lmserve.server.cli import main
from lmserve.server.errors import ModelLoadError
from lmserve.server.families.catalog import make_stepper
from lmserve.server.manifest import read_manifest, verify_files

VOCAB = ["<unk>", "<s>", "</s>", *(f"w{i}" for i in range(57))]
FORMATS: list[ExportFormat] = ["onnx", "torchscript"]


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def tiny_ffnn(order: int = 4, seed: int = 0, tie: bool = False) -> FeedForwardLM:
    torch.manual_seed(seed)
    config = RecurrentLMConfig(
        vocab_size=len(VOCAB), cell="ffnn", order=order, embedding_size=16,
        hidden_size=16 if tie else 24, tie_weights=tie, dropout=0.0,
    )  # fmt: skip
    model = FeedForwardLM(config)
    with torch.no_grad():  # sharper than the uniform init, so differences would show
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return model.eval()


@torch.no_grad()
def test_the_prediction_depends_on_the_last_order_minus_one_tokens_only() -> None:
    model = tiny_ffnn(order=4)
    tokens = torch.tensor([[5, 9, 11, 7, 30, 12, 44]])
    logits, (window,) = model(tokens, model.initial_state(1))
    assert window.dtype == torch.long and window.tolist() == [[[30, 12, 44]]]
    # Position 6 sees (30, 12, 44): the same three tokens after any other history agree.
    other, _ = model(torch.tensor([[50, 3, 30, 12, 44]]), model.initial_state(1))
    torch.testing.assert_close(other[0, -1], logits[0, -1])
    # At the start the window is <s>-padded: reading <s> 5 equals reading 5 after the padding.
    assert model.initial_state(2)[0].tolist() == [[[BOS_ID] * 3] * 2]
    head, _ = model(torch.tensor([[BOS_ID, 5]]), model.initial_state(1))
    torch.testing.assert_close(head[0, 1], logits[0, 0])
    # One token at a time, the window carried, equals the whole sequence at once.
    state = model.initial_state(1)
    for t in range(tokens.shape[1]):
        step, state = model(tokens[:, t : t + 1], state)
        torch.testing.assert_close(step[0, 0], logits[0, t], atol=1e-6, rtol=0)
    # Tied weights share one matrix.
    tied = tiny_ffnn(tie=True)
    assert tied.decoder.weight.data_ptr() == tied.embedding.weight.data_ptr()


def test_bad_configurations_are_refused() -> None:
    with pytest.raises(ValueError, match="order is needed"):
        RecurrentLMConfig(vocab_size=10, cell="ffnn", embedding_size=8, hidden_size=8)
    with pytest.raises(ValueError, match="order is needed"):
        RecurrentLMConfig(vocab_size=10, cell="gru", order=3, embedding_size=8, hidden_size=8)
    with pytest.raises(ValueError, match="one hidden layer"):
        RecurrentLMConfig(
            vocab_size=10, cell="ffnn", order=3, embedding_size=8, hidden_size=8, num_layers=2
        )
    with pytest.raises(ValueError, match="FeedForwardLM"):
        RecurrentLM(
            RecurrentLMConfig(vocab_size=10, cell="ffnn", order=3, embedding_size=8, hidden_size=8)
        )


@pytest.mark.parametrize("fmt", FORMATS)
def test_export_is_at_parity_and_serves_the_same_log_probs(
    tmp_path: Path, fmt: ExportFormat
) -> None:
    model = tiny_ffnn(order=5)
    data = {"vocab": VOCAB, "tokenizer": {"kind": "word"}, "command": "tests"}
    folder = tmp_path / "ffnn"
    result = write_model_folder(Checkpoint(tmp_path / "x.pt", model, data), folder, fmt=fmt)
    assert result.parity.max_abs_diff <= 1e-4 and result.parity.cases == 18
    manifest = read_manifest(folder)
    verify_files(folder, manifest)
    assert (manifest.kind, manifest.format) == ("ffnn", fmt)
    assert manifest.architecture["order"] == 5
    assert manifest.architecture["state_names"] == ["window"]

    backend = (
        OnnxBackend.load(folder, manifest, OnnxOptions(intra_op_threads=1, max_chunk_tokens=3))
        if fmt == "onnx"
        else TorchScriptBackend.load(folder, manifest, max_chunk_tokens=3)
    )
    ids = [7, 8, 9, 10, 11, 12, 13]  # longer than one chunk (3) and than the window (4)
    with torch.no_grad():
        logits, _ = model(torch.tensor([[BOS_ID, *ids]]), model.initial_state(1))
    eager = torch.log_softmax(logits.double(), -1)[0].numpy()
    np.testing.assert_allclose(backend.next_token_log_probs(ids), eager[-1], atol=1e-4)
    # Stepping: split, reorder and merge int64 windows as the scheduler does.
    stepper = make_stepper(backend)
    lp, state = stepper.prefill([ids[:2], ids[:5]])
    assert state[0].dtype == np.int64 and state[0].shape == (1, 2, 4)
    np.testing.assert_allclose(lp[1], eager[5], atol=1e-4)
    swapped = stepper.merge(stepper.split(state)[::-1])
    lp2, _ = stepper.step(np.array([ids[5], ids[2]]), swapped)
    np.testing.assert_allclose(lp2[0], eager[6], atol=1e-4)
    np.testing.assert_allclose(lp2[1], eager[3], atol=1e-4)


def test_parity_catches_a_wrong_window(tmp_path: Path) -> None:
    model = tiny_ffnn()
    data = {"vocab": VOCAB, "tokenizer": {"kind": "word"}, "command": "tests"}
    write_model_folder(Checkpoint(tmp_path / "x.pt", model, data), tmp_path / "m", fmt="onnx")
    runner = OnnxRunner(tmp_path / "m", "ffnn")

    class StaleWindow:
        """Right log-probs, but the window handed back is the one it was given."""

        def step(self, tokens, state):  # type: ignore[no-untyped-def]
            return runner.step(tokens, state)[0], state

        def score(self, tokens, targets, state):  # type: ignore[no-untyped-def]
            return runner.score(tokens, targets, state)[0], state

    with pytest.raises(ParityError, match="window"):
        check_parity(model, StaleWindow())


def test_the_served_spec_needs_an_order() -> None:
    arch = {"cell": "ffnn", "vocab_size": 9, "hidden_size": 4, "state_names": ["window"]}
    with pytest.raises(ModelLoadError, match="needs an order"):
        RecurrentSpec.from_architecture(arch, "model.yaml")
    with pytest.raises(ModelLoadError, match="2 or more"):
        RecurrentSpec.from_architecture({**arch, "order": 1}, "model.yaml")
    with pytest.raises(ModelLoadError, match="state_names"):
        RecurrentSpec.from_architecture({**arch, "order": 3, "state_names": ["h"]}, "model.yaml")
    spec = RecurrentSpec.from_architecture({**arch, "order": 3}, "model.yaml")
    assert spec.state_shape(5) == (1, 5, 2)


def test_training_reduces_validation_loss(tmp_path: Path, corpus: dict[str, Path]) -> None:
    def sentences(split: str) -> list[list[str]]:
        return [line.split() for line in corpus[split].read_text().splitlines()]

    vocab = build_word_vocab(sentences("train"), min_count=2)
    index = {w: i for i, w in enumerate(vocab)}
    train_ids = encode_sentences(sentences("train"), index)
    valid_ids = encode_sentences(sentences("valid"), index)
    torch.manual_seed(0)
    config = RecurrentLMConfig(
        vocab_size=len(vocab), cell="ffnn", order=4, embedding_size=32, hidden_size=32,
        dropout=0.0,
    )  # fmt: skip
    model = FeedForwardLM(config)
    before = evaluate(model, valid_ids)
    cfg = TrainConfig(epochs=3, batch_size=16, lr=1e-2, seed=0)
    after = train(
        model, cfg, train_ids, valid_ids, tmp_path, progress=False, log=lambda _: None,
        step=train_batch, scorer=evaluate,
    )  # fmt: skip
    assert before.perplexity > 0.8 * len(vocab)
    assert after.perplexity < 0.5 * before.perplexity
    assert isinstance(load_checkpoint(tmp_path / BEST_CHECKPOINT)[0], FeedForwardLM)


def test_train_neural_cli_trains_and_exports_an_ffnn(
    tmp_path: Path, corpus: dict[str, Path]
) -> None:
    out, model_dir = tmp_path / "run", tmp_path / "tiny-ffnn"
    args = [
        "train-neural", str(corpus["train"]), str(out),
        "--heldout", str(corpus["valid"]), "--test", str(corpus["test"]),
        "--cell", "ffnn", "--order", "3", "--embedding-size", "16", "--hidden-size", "16",
        "--epochs", "1", "--batch-size", "32", "--threads", "1", "--no-progress",
        "--export", str(model_dir),
    ]  # fmt: skip
    assert main(args) == 0
    manifest = read_manifest(model_dir)
    verify_files(model_dir, manifest)
    assert manifest.kind == "ffnn" and manifest.architecture["order"] == 3
    assert manifest.provenance.trained_by is not None
    assert "--cell ffnn --order 3" in manifest.provenance.trained_by
    assert manifest.provenance.metrics["test_perplexity"] > 1
    ts_dir = tmp_path / "tiny-ffnn-ts"
    assert main(["export-rnn", str(out / BEST_CHECKPOINT), str(ts_dir), "--format",
                 "torchscript"]) == 0  # fmt: skip
    assert read_manifest(ts_dir).architecture["step_inputs"] == ["tokens", "window", "c"]


def test_order_with_a_recurrent_cell_is_a_usage_error(
    tmp_path: Path, corpus: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["train-rnn", str(corpus["train"]), str(tmp_path / "run"), "--heldout",
            str(corpus["valid"]), "--cell", "gru", "--order", "4"]  # fmt: skip
    assert main(args) == 2
    assert (
        "--order is for --cell ffnn only (this is --cell gru): drop --order"
        in capsys.readouterr().err
    )
