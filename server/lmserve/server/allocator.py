"""Keeps freed memory in the serving process instead of handing it back to the kernel.

    keep_freed_memory()   # once, at `lmserve serve` start-up; True when glibc took the settings

Generation allocates numpy temporaries of a few MB every step (a [32, 12352] float32 batch of
distributions is 1.6 MB). glibc serves blocks that large with mmap and unmaps them when they
are freed, so each step page-faults its temporaries in again: at batch 32 that doubled the cost
of top-k/top-p sampling (4.6 vs 9.2 ms a step for top-p 0.9, `bench`-style loop in one
process). Raising glibc's mmap threshold to its maximum and its trim threshold keeps those
pages mapped for the next step, at the price of up to TRIM_THRESHOLD of freed memory kept.
Only glibc has these knobs; elsewhere this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

# mallopt parameters (glibc's malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# glibc's largest mmap threshold on 64-bit; blocks below it come from the heap and are reused.
MMAP_THRESHOLD = 32 * 1024 * 1024
# Freed memory at the top of the heap kept before glibc trims it.
TRIM_THRESHOLD = 256 * 1024 * 1024


def keep_freed_memory() -> bool:
    """Sets the thresholds with glibc's `mallopt`; False where that is not available."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    # mallopt returns 1 on success (musl's stub returns 0).
    return bool(
        mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
        and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    )
