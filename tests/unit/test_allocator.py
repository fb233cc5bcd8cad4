"""The serving process keeps freed memory: glibc accepts the thresholds where glibc runs."""

from __future__ import annotations

import ctypes.util
import sys

import pytest

from lmserve.server.allocator import keep_freed_memory


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or "musl" in (ctypes.util.find_library("c") or ""),
    reason="mallopt's thresholds are glibc's",
)
def test_glibc_takes_the_thresholds() -> None:
    # mallopt answers 0 for a parameter or value it refuses (e.g. an mmap threshold above
    # its 32 MB maximum), so this fails if the settings do not take.
    assert keep_freed_memory() is True
