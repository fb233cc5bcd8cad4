"""Fixtures every test suite shares: where the repository and the shared reference data are."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

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
