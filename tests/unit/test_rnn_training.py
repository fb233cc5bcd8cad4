"""train-rnn on a tiny corpus: the loss really falls, and word/char/BPE runs write a checkpoint and,
with --export, a model folder that loads. Sizes are tiny (16 hidden units, 200 lines)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from lmserve.export.rnn.data import build_word_vocab, encode_sentences
from lmserve.export.rnn.model import RecurrentLM, RecurrentLMConfig
from lmserve.export.trainers.loop import BEST_CHECKPOINT, TrainConfig, train
from lmserve.export.trainers.recurrent import evaluate, train_batch
from lmserve.server.cli import main
from lmserve.server.manifest import read_manifest, verify_files


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def test_training_reduces_validation_loss(tmp_path: Path, corpus: dict[str, Path]) -> None:
    def sentences(split: str) -> list[list[str]]:
        return [line.split() for line in corpus[split].read_text().splitlines()]

    vocab = build_word_vocab(sentences("train"), min_count=2)
    index = {w: i for i, w in enumerate(vocab)}
    train_ids = encode_sentences(sentences("train"), index)
    valid_ids = encode_sentences(sentences("valid"), index)
    torch.manual_seed(0)
    config = RecurrentLMConfig(
        vocab_size=len(vocab), cell="gru", embedding_size=32, hidden_size=32, dropout=0.0
    )
    model = RecurrentLM(config)
    before = evaluate(model, valid_ids)
    cfg = TrainConfig(epochs=3, batch_size=16, lr=1e-2, seed=0)
    after = train(
        model, cfg, train_ids, valid_ids, tmp_path, progress=False, log=lambda _: None,
        step=train_batch, scorer=evaluate,
    )  # fmt: skip
    # Untrained, the model is about uniform over the vocabulary; trained, far below it.
    assert before.perplexity > 0.8 * len(vocab)
    assert after.perplexity < 0.5 * before.perplexity
    assert after.tokens == before.tokens == sum(len(s) + 1 for s in valid_ids)


@pytest.mark.parametrize(
    ("tokenizer", "kind"), [("word", "word"), ("char", "character"), ("bpe", "bpe")]
)
def test_train_rnn_writes_checkpoint_and_exports(
    tmp_path: Path, corpus: dict[str, Path], tokenizer: str, kind: str
) -> None:
    out, model_dir = tmp_path / "run", tmp_path / f"tiny-{tokenizer}"
    args = [
        "train-rnn", str(corpus["train"]), str(out),
        "--heldout", str(corpus["valid"]), "--test", str(corpus["test"]),
        "--tokenizer", tokenizer, "--bpe-vocab-size", "150", "--cell", "lstm",
        "--embedding-size", "16", "--hidden-size", "16", "--epochs", "1", "--batch-size", "32",
        "--threads", "1", "--no-progress", "--export", str(model_dir),
    ]  # fmt: skip
    assert main(args) == 0

    data = torch.load(out / BEST_CHECKPOINT, weights_only=True)
    for key in ("model_config", "state_dict", "vocab", "tokenizer", "train_config", "history"):
        assert key in data
    assert data["tokenizer"]["kind"] == kind
    assert data["vocab"][:3] == ["<unk>", "<s>", "</s>"]

    manifest = read_manifest(model_dir)
    verify_files(model_dir, manifest)
    assert manifest.tokenizer.kind == kind and manifest.kind == "lstm"
    assert manifest.architecture["vocab_size"] == len(data["vocab"])
    assert manifest.provenance.trained_by is not None
    assert manifest.provenance.trained_by.startswith("lmserve train-rnn ")
    if tokenizer == "bpe":
        assert manifest.tokenizer.file == "tokenizer"
        assert (model_dir / manifest.files["tokenizer"].path).is_file()
        assert len(data["vocab"]) <= 150

    # Per-word perplexities: report.json, checkpoint conversion and manifest agree.
    report = json.loads((out / "report.json").read_text())
    metrics = manifest.provenance.metrics
    assert math.isclose(metrics["valid_perplexity"], report["valid_perplexity"], rel_tol=1e-9)
    assert metrics["test_perplexity"] == report["test_perplexity"]
    words = sum(len(line.split()) + 1 for line in corpus["valid"].read_text().splitlines())
    tokens = report["valid_tokens"]
    if tokenizer == "word":
        assert tokens == words
    else:
        # More tokens than words: the per-token perplexity is the smaller one.
        assert tokens > words and report["valid_token_perplexity"] < report["valid_perplexity"]
        ratio = math.log(report["valid_perplexity"]) / math.log(report["valid_token_perplexity"])
        assert math.isclose(ratio, tokens / words, rel_tol=1e-9)

    # export-rnn rebuilds the tokenizer from the checkpoint alone and measures the same test
    # perplexity as training did: the exported model reads text exactly as training did.
    again = tmp_path / "again"
    assert main(["export-rnn", str(out / BEST_CHECKPOINT), str(again), "--test",
                 str(corpus["test"]), "--format", "torchscript"]) == 0  # fmt: skip
    remeasured = read_manifest(again).provenance.metrics["test_perplexity"]
    assert math.isclose(remeasured, report["test_perplexity"], rel_tol=1e-5)


def test_train_rnn_refuses_an_occupied_export_folder_before_training(
    tmp_path: Path, corpus: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "notes.txt").write_text("not a model")
    args = ["train-rnn", str(corpus["train"]), str(tmp_path / "run"),
            "--heldout", str(corpus["valid"]), "--export", str(occupied)]  # fmt: skip
    assert main(args) == 2
    assert "not an empty folder" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
    assert (occupied / "notes.txt").read_text() == "not a model"


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--embedding-size", "32", "--hidden-size", "64"], "or add --no-tie-weights"),
        (  # the example, word for word
            ["--cell", "ffnn", "--order", "4", "--embedding-size", "32", "--hidden-size", "64"],
            "--embedding-size 32 and --hidden-size 64 differ",
        ),
        (["--cell", "lstm", "--order", "3"], "--order is for --cell ffnn only"),
        (["--cell", "ffnn", "--layers", "2"], "--cell ffnn has one hidden layer: drop --layers 2"),
        (["--dropout", "1.5"], "--dropout 1.5: must be less than 1"),
        (["--lr", "0"], "--lr 0.0: must be greater than 0"),
        (["--epochs", "0"], "--epochs 0: must be greater than or equal to 1"),
        (["--batch-size", "0"], "--batch-size 0: must be greater than or equal to 1"),
        (["--lr-decay", "2"], "--lr-decay 2.0: must be less than or equal to 1"),
        (["--threads", "0"], "--threads 0: must be greater than or equal to 1"),
        (["--max-minutes", "0"], "--max-minutes 0.0: must be greater than 0"),
        (["--layers", "0"], "--layers 0: must be greater than or equal to 1"),
        (["--embedding-size", "0", "--hidden-size", "0"], "--hidden-size 0: must be greater"),
    ],
)
def test_bad_flags_get_one_plain_line_each_before_anything_runs(
    tmp_path: Path,
    corpus: dict[str, Path],
    capsys: pytest.CaptureFixture[str],
    flags: list[str],
    says: str,
) -> None:
    args = ["train-rnn", str(corpus["train"]), str(tmp_path / "run"),
            "--heldout", str(corpus["valid"]), *flags]  # fmt: skip
    assert main(args) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines and all(line.startswith("lmserve train-rnn: ") for line in lines), lines
    assert any(says in line for line in lines), lines
    assert not any("validation error" in line or "pydantic" in line for line in lines), lines
    assert not (tmp_path / "run").exists()  # nothing was read, trained or written
