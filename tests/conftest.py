"""Fixtures every test suite shares: where the repository and the shared reference data are."""

from __future__ import annotations

from pathlib import Path

import pytest

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
