"""Arrays on disk for counting under a memory bound: raw column files and sorted runs.

Counting a corpus larger than `--memory` works as lmplz does: each chunk's n-gram keys are
sorted and counted in memory and written out as a sorted run (`write_run`); `merge_runs` then
merges the runs k ways into the order's sorted counts. The merge is vectorised in blocks: it
holds one block of each run, takes from every run the keys up to the smallest last key among
the blocks of runs that have more on disk (no run can hold a smaller key further on, since runs
are sorted and their keys unique), sums the counts of equal keys with one sort, and refills
the blocks it emptied. Each round emits at least one whole block, and no Python code runs per
n-gram.

Files are raw native-endian arrays (no header): they are private to one process and read back
in ranges with `np.fromfile`, which never maps them, so reading a run does not grow the RSS.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

Int64Array = npt.NDArray[np.int64]
AnyIntArray = npt.NDArray[Any]

# Bytes a merge holds per buffered entry: the key and count buffers, their concatenation, the
# sort order and the sorted copies (int64 keys, counts at most int64).
MERGE_BYTES_PER_ENTRY = 64
MIN_MERGE_BLOCK = 4096


class RawFile:
    """An array of one dtype appended to a file block by block and read back in ranges."""

    def __init__(self, path: Path, dtype: npt.DTypeLike) -> None:
        self.path = path
        self.dtype = np.dtype(dtype)
        self.size = 0
        path.write_bytes(b"")

    def append(self, values: npt.ArrayLike) -> None:
        block = np.ascontiguousarray(values, dtype=self.dtype)
        with self.path.open("ab") as out:
            block.tofile(out)
        self.size += len(block)

    def read(self, start: int, stop: int) -> AnyIntArray:
        count = max(0, min(stop, self.size) - start)
        if count == 0:
            return np.empty(0, dtype=self.dtype)
        offset = start * self.dtype.itemsize
        return np.fromfile(self.path, dtype=self.dtype, count=count, offset=offset)

    def read_all(self) -> AnyIntArray:
        return self.read(0, self.size)

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


@dataclass
class SortedRun:
    """Sorted unique int64 keys and their counts, on disk."""

    keys: RawFile
    counts: RawFile

    def __len__(self) -> int:
        return self.keys.size

    def remove(self) -> None:
        self.keys.remove()
        self.counts.remove()


def write_run(folder: Path, name: str, keys: Int64Array, counts: AnyIntArray) -> SortedRun:
    """One chunk's sorted unique keys and counts as a run in `folder`."""
    run = SortedRun(RawFile(folder / f"{name}.keys", np.int64), RawFile(folder / f"{name}.counts",
                    counts.dtype))  # fmt: skip
    run.keys.append(keys)
    run.counts.append(counts)
    return run


@dataclass
class _Cursor:
    """A run's buffered block and where its next block starts on disk."""

    run: SortedRun
    keys: Int64Array
    counts: AnyIntArray
    next: int = 0

    @property
    def more_on_disk(self) -> bool:
        return self.next < len(self.run)

    def refill(self, block: int) -> None:
        if len(self.keys) == 0 and self.more_on_disk:
            stop = self.next + block
            self.keys = self.run.keys.read(self.next, stop)
            self.counts = self.run.counts.read(self.next, stop)
            self.next = min(stop, len(self.run))


def merge_block_size(runs: int, memory: int) -> int:
    """Entries per run a merge may buffer within `memory` bytes."""
    return max(MIN_MERGE_BLOCK, memory // (max(runs, 1) * MERGE_BYTES_PER_ENTRY))


def sum_sorted(keys: Int64Array, counts: AnyIntArray) -> tuple[Int64Array, AnyIntArray]:
    """Distinct keys in order with the summed counts of their entries (any entry order)."""
    order = np.argsort(keys)
    keys, counts = keys[order], counts[order]
    del order
    first = np.empty(len(keys), dtype=bool)
    first[:1] = True
    np.not_equal(keys[1:], keys[:-1], out=first[1:])
    starts = np.flatnonzero(first)
    return keys[starts], np.add.reduceat(counts, starts) if len(starts) else counts[:0]


def merge_runs(
    runs: list[SortedRun],
    out: tuple[RawFile, RawFile],
    *,
    block: int,
    report: Callable[[int, int], None] | None = None,
) -> int:
    """Merges sorted runs into `out` (keys, counts): each key once, counts summed. Returns the
    number of distinct keys. `report(entries_merged, entries_total)` follows the progress."""
    cursors = [_Cursor(r, np.empty(0, np.int64), np.empty(0, r.counts.dtype)) for r in runs]
    total = sum(len(r) for r in runs)
    merged = written = 0
    while True:
        for c in cursors:
            c.refill(block)
        cursors = [c for c in cursors if len(c.keys)]
        if not cursors:
            break
        limits = [int(c.keys[-1]) for c in cursors if c.more_on_disk]
        keys_parts, count_parts = [], []
        for c in cursors:
            take = len(c.keys) if not limits else int(np.searchsorted(c.keys, min(limits), "right"))
            keys_parts.append(c.keys[:take])
            count_parts.append(c.counts[:take])
            c.keys, c.counts = c.keys[take:], c.counts[take:]
        keys, counts = sum_sorted(np.concatenate(keys_parts), np.concatenate(count_parts))
        merged += sum(len(k) for k in keys_parts)
        del keys_parts, count_parts
        out[0].append(keys)
        out[1].append(counts)
        written += len(keys)
        if report is not None:
            report(merged, total)
    return written
