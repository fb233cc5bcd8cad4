"""`train-ngram --memory`: how much working memory counting may use, as `lmplz -S` spells it.

A size is bytes with an optional K/M/G/T suffix (powers of 1024; `2G`, `512M`, `1.5G`) or a
percentage of the machine's physical memory (`80%`, lmplz's default). Counting keeps the whole
corpus in memory when it fits in that budget and otherwise counts it in sorted runs on disk
(`counting`), so the setting trades memory for disk traffic, never the result.
"""

from __future__ import annotations

import os
import re

DEFAULT_MEMORY = "80%"
_UNITS = {"": 1, "B": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(%|[BKMGT]?)(?:I?B)?\s*$", re.IGNORECASE)


def physical_memory() -> int:
    """Bytes of RAM on this machine (0 where the platform does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def parse_memory(text: str) -> int:
    """Bytes of a size such as `2G`, `800M`, `4096`, or `50%` of physical memory."""
    match = _SIZE.match(text)
    if match is None:
        raise ValueError(f"not a memory size: {text!r} (try 2G, 800M or 50%)")
    number, unit = float(match.group(1)), match.group(2).upper()
    if unit == "%":
        total = physical_memory()
        if total <= 0:
            raise ValueError(f"cannot read this machine's memory for {text!r}; give a size")
        size = total * number / 100.0
    else:
        size = number * _UNITS[unit]
    if size < 1:
        raise ValueError(f"memory size {text!r} is below one byte")
    return int(size)


def format_bytes(size: float) -> str:
    """`1.5 GB`, `300 MB`: a size for progress lines."""
    for unit, scale in (("GB", 2**30), ("MB", 2**20), ("KB", 2**10)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size:.0f} B"
