"""`lmserve train-ngram` end to end: a tiny corpus in, a valid, checksummed model folder out."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmserve.export.corpora import KJV_TOKEN_PATTERN, kjv_split
from lmserve.server.cli import main
from lmserve.server.manifest import read_manifest, verify_files


@pytest.fixture
def corpus(tmp_path: Path) -> dict[str, Path]:
    files = {}
    for split, lines in (("train", 400), ("valid", 40), ("test", 40)):
        text = kjv_split(split).read_text(encoding="utf-8").splitlines()[:lines]
        files[split] = tmp_path / f"{split}.txt"
        files[split].write_text("\n".join(text) + "\n", encoding="utf-8")
    return files


@pytest.mark.parametrize("smoothing", ["modified-kneser-ney", "interpolated", "add-k"])
def test_train_ngram_writes_a_valid_model_folder(
    corpus: dict[str, Path], tmp_path: Path, smoothing: str
) -> None:
    out = tmp_path / "models" / "tiny-3gram"
    argv = ["train-ngram", "--order", "3", "--smoothing", smoothing, "--lowercase",
            "--token-pattern", KJV_TOKEN_PATTERN, "--heldout", str(corpus["valid"]),
            "--test", str(corpus["test"]), "--min-count", "2",
            str(corpus["train"]), str(out)]  # fmt: skip
    assert main(argv) == 0
    manifest = read_manifest(out)
    verify_files(out, manifest)
    assert manifest.name == "tiny-3gram"  # MODEL_DIR's basename by default
    assert manifest.ngram is not None and manifest.ngram.order == 3
    assert manifest.ngram.smoothing == smoothing
    assert manifest.tokenizer.lowercase and manifest.tokenizer.pattern == KJV_TOKEN_PATTERN
    metrics = manifest.provenance.metrics
    assert 1.0 < metrics["test_perplexity"] < 5000.0
    assert 1.0 < metrics["valid_perplexity"] < 5000.0
    assert metrics["test_perplexity_no_oov"] <= metrics["test_perplexity"] or metrics["test_oov"]
    assert "train-ngram" in (manifest.provenance.trained_by or "")


def test_train_ngram_name_and_arpa_only(corpus: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "arpa-only"
    argv = ["train-ngram", "--order", "2", "--smoothing", "kneser-ney", "--name", "x",
            "--arpa-only", "--no-gzip", str(corpus["train"]), str(out)]  # fmt: skip
    assert main(argv) == 0
    assert (out / "model.arpa").is_file()
    assert not (out / "model.yaml").exists()


def test_train_ngram_rejects_interpolation_without_heldout(
    corpus: dict[str, Path], tmp_path: Path
) -> None:
    argv = ["train-ngram", "--order", "2", "--smoothing", "interpolated",
            str(corpus["train"]), str(tmp_path / "m")]  # fmt: skip
    assert main(argv) == 2
