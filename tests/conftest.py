"""Fixtures every test suite shares: where the repository and the shared reference data are."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from served import serve  # noqa: F401  (the one way tests start a server: tests/served.py)

# Every server a test starts opens its HTTP front on a free port (the default, 8080, would be
# shared by the many servers a run starts). A test that needs a known port sets its own.
os.environ.setdefault("LMSERVE_HTTP_PORT", "0")

REPO_ROOT = Path(__file__).resolve().parents[1]
# Reference data (KenLM models and scores, the KJV corpus) lives beside the checkout, for us and CI.
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """`../shared/data`. CI always has it, so a missing folder is a failure, never a skip."""
    if not SHARED_DATA.is_dir():
        pytest.fail(
            f"reference data missing: {SHARED_DATA} (the checkout needs ../shared beside it)"
        )
    return SHARED_DATA


# `make models`'s kjv-5gram, trained with the Makefile's flags (its held-out and test perplexities
# in the manifest): trained once per session for every module that serves or scores it, and for
# the trainer's own check against KenLM's figures (tests/unit/test_ngram_training_kneser_ney.py).
KJV_5GRAM_FLAGS = [
    "--order", "5", "--smoothing", "modified-kneser-ney", "--name", "kjv-5gram", "--lowercase",
    "--token-pattern", "[a-z]+(?:'[a-z]+)*",
]  # fmt: skip


@pytest.fixture(scope="session")
def kjv_5gram(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model folder: kjv-5gram trained by `lmserve train-ngram` on the shipped KJV train split,
    its valid and test perplexities measured (`provenance.metrics`)."""
    from lmserve.export.corpora import kjv_split
    from lmserve.server.cli import main

    folder = tmp_path_factory.mktemp("kjv-5gram") / "kjv-5gram"
    reports = ["--heldout", str(kjv_split("valid")), "--test", str(kjv_split("test"))]
    argv = ["train-ngram", *KJV_5GRAM_FLAGS, *reports, str(kjv_split("train")), str(folder)]
    assert main(argv) == 0
    return folder


@pytest.fixture(scope="session")
def shipped_repository(tmp_path_factory: pytest.TempPathFactory, kjv_5gram: Path) -> Path:
    """What `make serve` serves: kjv-5gram (trained) and the committed kjv-lstm."""
    root = tmp_path_factory.mktemp("shipped")
    (root / "kjv-5gram").symlink_to(kjv_5gram, target_is_directory=True)
    (root / "kjv-lstm").symlink_to(REPO_ROOT / "models" / "kjv-lstm", target_is_directory=True)
    return root
