"""The serving process keeps freed memory: glibc's thresholds are set where glibc runs."""

from __future__ import annotations

import ctypes.util
import sys

import numpy as np
import pytest

from lmserve.server.allocator import keep_freed_memory


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or "musl" in (ctypes.util.find_library("c") or ""),
    reason="mallopt's thresholds are glibc's",
)
def test_glibc_takes_the_thresholds_and_large_temporaries_still_work() -> None:
    assert keep_freed_memory() is True
    # Blocks above the old 128 kB default now come from the heap; they must behave as before.
    for _ in range(3):
        a = np.ones((32, 12_352), dtype=np.float32)
        assert float(a.sum()) == 32 * 12_352
