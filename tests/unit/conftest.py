"""Fixtures shared by the unit tests."""

from __future__ import annotations

from pathlib import Path

import pytest

CORPUS = Path(__file__).resolve().parents[2] / "export/lmserve/export/corpora/kjv"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The first lines of the shipped KJV splits (train 200, valid 40, test 40): a tiny corpus
    that neural training tests train on in seconds."""
    folder = tmp_path_factory.mktemp("corpus")
    paths = {}
    for split, n in (("train", 200), ("valid", 40), ("test", 40)):
        lines = (CORPUS / f"{split}.txt").read_text(encoding="utf-8").splitlines()[:n]
        paths[split] = folder / f"{split}.txt"
        paths[split].write_text("\n".join(lines) + "\n", encoding="utf-8")
    return paths
