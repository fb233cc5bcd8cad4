"""The training commands refuse a bad flag with one line naming it, before reading any corpus:
argparse checks patterns, files and numbers (`export/cli_types.py`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmserve.server.cli import main


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.txt"
    path.write_text("a b c\nb c d\n")
    return path


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one error line a refused command prints (argparse exits with status 2)."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--token-pattern", "("], "argument --token-pattern: not a regular expression"),
        (["--heldout", "/nonexistent.txt"], "argument --heldout: no such file: /nonexistent.txt"),
        (["--test", "/nonexistent.txt"], "argument --test: no such file"),
        (["--smoothing", "add-k", "--add-k", "-1"], "argument --add-k: must be greater than 0"),
        (["--add-k", "x"], "argument --add-k: not a number: 'x'"),
        (["--tokenizer", "bpe", "--bpe-model", "/nope.json"], "argument --bpe-model: no such file"),
    ],
)
def test_train_ngram_flags(
    tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], says: str
) -> None:
    line = _refused(["train-ngram", "--order", "3", *flags, str(tiny), str(tmp_path / "m")], capsys)
    assert says in line and line.startswith("lmserve train-ngram: error: "), line
    assert not (tmp_path / "m").exists()


def test_train_ngram_missing_corpus(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = _refused(
        ["train-ngram", "--order", "3", "/nonexistent.txt", str(tmp_path / "m")], capsys
    )
    assert "argument corpus: no such file: /nonexistent.txt" in line


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--token-pattern", "("], "argument --token-pattern: not a regular expression"),
        (["--test", "/nonexistent.txt"], "argument --test: no such file"),
    ],
)
def test_train_rnn_flags(
    tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], says: str
) -> None:
    argv = ["train-rnn", str(tiny), str(tmp_path / "run"), "--heldout", str(tiny), *flags]
    line = _refused(argv, capsys)
    assert says in line and line.startswith("lmserve train-rnn: error: "), line
    assert not (tmp_path / "run").exists()


def test_train_rnn_on_a_corpus_too_small_for_a_vocabulary(
    tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["train-rnn", str(tiny), str(tmp_path / "run"), "--heldout", str(tiny)]
    assert main([*argv, "--vocab-size", "2"]) == 2
    err = capsys.readouterr().err
    assert "the vocabulary has 3 entries (specials included); a model needs at least 4" in err
    assert "validation error" not in err
