"""train-rnn --cell transformer on a tiny corpus: the loss falls, the scorer agrees with the
model's own loss sentence by sentence, flags are refused before the corpus is read, and a run
writes a checkpoint that exports (word vocabulary) into a model folder. Sizes are tiny
(d=16, 2 layers, 200 lines)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from lmserve.export.rnn.data import BOS_ID, EOS_ID, build_word_vocab, encode_sentences
from lmserve.export.trainers.loop import BEST_CHECKPOINT, LAST_CHECKPOINT, TrainConfig, train
from lmserve.export.trainers.transformer import (
    HF_FOLDER,
    TransformerLM,
    TransformerLMConfig,
    evaluate,
    train_batch,
)
from lmserve.server.cli import main


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def _ids(path: Path, index: dict[str, int] | None = None) -> tuple[list[np.ndarray], list[str]]:
    sentences = [line.lower().split() for line in path.read_text().splitlines()]
    vocab = build_word_vocab(sentences)
    return encode_sentences(sentences, index or {w: i for i, w in enumerate(vocab)}), vocab


def _brute_force(model: TransformerLM, sentences: list[np.ndarray]) -> float:
    """Sum of log p over each sentence alone (no padding, no batch), from the HF model's own
    mean loss with `labels=`: the number evaluate() must reproduce."""
    total = 0.0
    with torch.no_grad():
        for ids in sentences:
            seq = torch.tensor([[BOS_ID, *ids.tolist(), EOS_ID]])
            loss = model.net(input_ids=seq, labels=seq, use_cache=False).loss
            total -= float(loss) * (len(ids) + 1)  # shifted: every token after <s>, </s> too
    return total


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_loss_falls_and_evaluation_matches_the_model_loss(
    tmp_path: Path, corpus: dict[str, Path], family: str
) -> None:
    train_ids, vocab = _ids(corpus["train"])
    index = {w: i for i, w in enumerate(vocab)}
    valid_ids, _ = _ids(corpus["valid"], index)
    torch.manual_seed(0)
    config = TransformerLMConfig(
        vocab_size=len(vocab), family=family, hidden_size=16, num_layers=2, heads=2, dropout=0.0
    )
    model = TransformerLM(config)
    before = evaluate(model, valid_ids, batch_size=8)
    # Batched and padded (length buckets of 8) against one sentence at a time, unpadded.
    assert before.log_prob == pytest.approx(_brute_force(model, valid_ids), rel=1e-4)
    assert before.tokens == sum(len(s) + 1 for s in valid_ids)
    assert before.perplexity > 0.5 * len(vocab)  # untrained: about uniform
    cfg = TrainConfig(
        epochs=3, batch_size=16, lr=1e-2, seed=0, optimizer="adamw", clip=1.0, warmup_steps=5,
        lr_schedule="cosine",
    )  # fmt: skip
    after = train(
        model, cfg, train_ids, valid_ids, tmp_path, progress=False, log=lambda _: None,
        step=train_batch, scorer=evaluate,
    )  # fmt: skip
    assert math.isfinite(after.perplexity)
    assert after.perplexity < 0.5 * before.perplexity
    assert after.log_prob == pytest.approx(_brute_force(model, valid_ids), rel=1e-4)
    history = torch.load(tmp_path / LAST_CHECKPOINT, weights_only=True)["history"]
    # `lr` is the plateau rate (1e-2, halved when validation got worse), not the cosine's.
    halvings = math.log2(1e-2 / history[-1]["lr"])
    assert halvings == pytest.approx(round(halvings)) and halvings < len(history)
    assert history[-1]["last_batch_lr"] < 1e-4  # the cosine's, near 0 by the last epoch's end


def test_bf16_step_trains(corpus: dict[str, Path]) -> None:
    train_ids, vocab = _ids(corpus["train"])
    torch.manual_seed(0)
    model = TransformerLM(
        TransformerLMConfig(vocab_size=len(vocab), hidden_size=16, num_layers=1, heads=2)
    )
    cfg = TrainConfig(lr=1e-2, precision="bf16", optimizer="adamw", clip=1.0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    from lmserve.export.rnn.data import length_bucketed_batches

    batch = next(length_bucketed_batches(train_ids, 16, rng=None))
    first = train_batch(model, batch, optimizer, cfg)
    for _ in range(20):
        last = train_batch(model, batch, optimizer, cfg)
    assert math.isfinite(first) and last < 0.7 * first


def _args(corpus: dict[str, Path], out: Path, *extra: str) -> list[str]:
    return [
        "train-rnn", str(corpus["train"]), str(out),
        "--heldout", str(corpus["valid"]), "--test", str(corpus["test"]),
        "--lowercase", "--cell", "transformer", "--hidden-size", "16", "--layers", "1",
        "--heads", "2", "--max-positions", "128", "--epochs", "2", "--batch-size", "32",
        "--optimizer", "adamw", "--lr", "5e-3", "--warmup-steps", "2", "--clip", "1",
        "--threads", "1", "--no-progress", *extra,
    ]  # fmt: skip


def test_train_neural_transformer_writes_checkpoint_and_exports(
    tmp_path: Path, corpus: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    out, model_dir = tmp_path / "run", tmp_path / "tiny-transformer"
    assert main([*_args(corpus, out), "--export", str(model_dir)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert math.isfinite(report["valid_perplexity"]) and math.isfinite(report["test_perplexity"])
    data = torch.load(out / BEST_CHECKPOINT, weights_only=True)
    assert data["model_config"]["cell"] == "transformer"
    assert data["vocab"][:3] == ["<unk>", "<s>", "</s>"]
    assert (out / HF_FOLDER / "config.json").is_file()
    assert (model_dir / "model.yaml").is_file()
    manifest = (model_dir / "model.yaml").read_text()
    assert "kind: transformer" in manifest and "test_perplexity" in manifest
    # export-rnn takes the same checkpoint.
    capsys.readouterr()
    again = tmp_path / "again"
    assert main(["export-rnn", str(out / BEST_CHECKPOINT), str(again), "--test",
                 str(corpus["test"])]) == 0  # fmt: skip
    measured = json.loads(capsys.readouterr().out)
    assert measured["test_perplexity"] == pytest.approx(report["test_perplexity"], rel=1e-6)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--embedding-size", "32"], "drop --embedding-size 32"),
        (["--heads", "3"], "--hidden-size 16 is not a multiple of --heads 3"),
        (["--max-positions", "8"], "raise --max-positions to at least"),
        (["--tokenizer", "char", "--export", "x"], "exports word models only"),
    ],
)
def test_flags_refused_with_the_fix(
    tmp_path: Path,
    corpus: dict[str, Path],
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
    message: str,
) -> None:
    # A repeated flag (--heads) takes its last value, as argparse does.
    assert main(_args(corpus, tmp_path / "run", *extra)) == 2
    assert message in capsys.readouterr().err


def test_transformer_flags_refused_for_other_cells(
    tmp_path: Path, corpus: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["train-rnn", str(corpus["train"]), str(tmp_path), "--heldout", str(corpus["valid"]),
            "--cell", "lstm", "--heads", "4"]  # fmt: skip
    assert main(args) == 2
    assert "--heads is for --cell transformer only" in capsys.readouterr().err
