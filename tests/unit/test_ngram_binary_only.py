"""`train-ngram --binary-only`: a model folder with model.lmbin and a manifest that lists only it
(no ARPA copy), which the server loads and serves exactly as the folder with the copy."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from lmserve.server.cli import main
from lmserve.server.decoding.scoring import ScoreOptions
from lmserve.server.manifest import read_manifest, verify_files
from lmserve.server.registry.repository import ModelState, load_entry

TEXTS = [
    "in the beginning god created the heaven and the earth",
    "and god said let there be light",
    "the quick brown fox jumps over the lazy dog",  # OOVs
    "",
]
KJV = ["--lowercase", "--token-pattern", "[a-z]+(?:'[a-z]+)*"]


def _train(corpus: dict[str, Path], folder: Path, *flags: str, order: str = "3") -> None:
    argv = ["train-ngram", "--order", order, *flags, str(corpus["train"]), str(folder)]
    assert main([*argv, "--test", str(corpus["test"])]) == 0


def _scores(folder: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    entry = load_entry(folder)
    assert entry.state is ModelState.READY, entry.load_error
    assert entry.scorer is not None
    scored = entry.scorer.score_texts(TEXTS, ScoreOptions())
    return scored.log_probs, scored.token_counts, scored.oov_counts


@pytest.mark.parametrize("tokenizer", ["word", "char"])
def test_binary_only_folder_serves_as_the_one_with_the_arpa(
    corpus: dict[str, Path],
    tmp_path: Path,
    tokenizer: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    flags = [*KJV, "--tokenizer", tokenizer]
    if tokenizer == "char":
        flags.append("--discount-fallback")
    with_arpa, binary_only = tmp_path / "with-arpa", tmp_path / "binary-only"
    _train(corpus, with_arpa, *flags)
    capsys.readouterr()
    _train(corpus, binary_only, *flags, "--binary-only")
    summary = json.loads(capsys.readouterr().out)
    assert summary["arpa"] is None

    assert not [p.name for p in binary_only.iterdir() if ".arpa" in p.name]
    assert any(p.name.startswith("model.arpa") for p in with_arpa.iterdir())
    manifest = read_manifest(binary_only)
    verify_files(binary_only, manifest)  # every listed file exists with its sha256
    reference = read_manifest(with_arpa)
    assert "arpa" in reference.files and "arpa" not in manifest.files
    assert set(manifest.files) == set(reference.files) - {"arpa"}
    assert manifest.files["model"] == reference.files["model"]  # the same binary, byte for byte
    assert (binary_only / "model.lmbin").read_bytes() == (with_arpa / "model.lmbin").read_bytes()
    assert manifest.provenance is not None and manifest.provenance.trained_by is not None
    assert "--binary-only" in manifest.provenance.trained_by
    assert reference.provenance is not None
    for key in ("test_perplexity", "test_tokens", "test_oov"):
        assert manifest.provenance.metrics[key] == reference.provenance.metrics[key]

    served, expected = _scores(binary_only), _scores(with_arpa)
    for got, want in zip(served, expected, strict=True):
        np.testing.assert_array_equal(got, want)
    assert served[2][2] > 0 or tokenizer == "char"  # the OOV sentence has OOVs (words)


def test_binary_only_removes_an_earlier_runs_arpa(corpus: dict[str, Path], tmp_path: Path) -> None:
    folder = tmp_path / "m"
    _train(corpus, folder, *KJV, order="2")
    assert (folder / "model.arpa.gz").exists()
    _train(corpus, folder, *KJV, "--binary-only", order="2")
    assert not (folder / "model.arpa.gz").exists()
    verify_files(folder, read_manifest(folder))
    assert _scores(folder)[0].shape == (len(TEXTS),)


def test_binary_only_and_arpa_only_exclude_each_other(
    corpus: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["train-ngram", "--order", "2", "--arpa-only", "--binary-only"]
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, str(corpus["train"]), str(tmp_path / "m")])
    assert exit_info.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert errors == [
        "lmserve train-ngram: error: argument --binary-only: not allowed with argument --arpa-only"
    ]
    assert not (tmp_path / "m").exists()
