"""Counting with bounded memory, as lmplz does: sorted runs on disk, merged per order.

Per order k, in two passes over the corpus in chunks of whole sentences sized to the memory
setting (`CHUNK_BYTES_PER_TOKEN`):

1. count: each chunk's n-gram keys (from its ids and the previous order's `node` of each
   position, both read from disk) are sorted and counted (`tables.sorted_unique`), written as
   a sorted run, and each position's index in its chunk's run is kept in a file;
2. merge the runs (`spill.merge_runs`) into the order's sorted keys and counts;
3. number: each run's keys are found among the merged ones (one `searchsorted` of sorted keys,
   not one per position), which gives every position's n-gram, so this order's `node` file for
   the next order and each n-gram's suffix (the (k-1)-gram ending at the same position).

The tables it returns are exactly `counting._count_in_memory`'s. Only the tables themselves
(16 bytes an n-gram) and the merged keys of the order being counted are held whole; what
scales with the corpus stays within `memory` bytes.
"""

from __future__ import annotations

import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

from lmserve.export.ngram.corpus_stream import TokenStore
from lmserve.export.ngram.memory import format_bytes
from lmserve.export.ngram.progress import Progress
from lmserve.export.ngram.spill import RawFile, SortedRun, merge_block_size, merge_runs, write_run
from lmserve.export.ngram.tables import (
    IndexArray,
    Int64Array,
    NgramCounts,
    OrderTable,
    check_key_range,
    index_dtype,
    ngram_ends,
    no_ngrams_error,
    sorted_unique,
    split_keys,
    unigram_table,
)

# Peak bytes per token of a chunk: its ids as stored and remapped, its previous node and its
# n-gram end positions (4 each), keys sorted with their positions in place (8), flags (1) and
# ranks (4), with a margin for the run being written and the numbering pass.
CHUNK_BYTES_PER_TOKEN = 40
MIN_CHUNK_TOKENS = 1024


class _Chunk:
    """One chunk's sentences and where its tokens and its n-gram ends start in the files."""

    def __init__(self, store: TokenStore, first: int, last: int) -> None:
        self.first, self.last = first, last
        self.start = int(store.offsets[first])
        self.stop = int(store.offsets[last])
        self.ends_start = 0
        self.ends_stop = 0

    def ends(self, store: TokenStore, k: int) -> IndexArray:
        return ngram_ends(store.lengths[self.first : self.last], k)


def count_in_runs(
    store: TokenStore,
    order: int,
    vocab_size: int,
    memory: int,
    temp_dir: Path | None,
    progress: Progress,
) -> NgramCounts:
    """`count_store` in chunks of at most `memory` bytes of working memory (see the module)."""
    chunk_tokens = max(MIN_CHUNK_TOKENS, memory // CHUNK_BYTES_PER_TOKEN)
    chunks = [_Chunk(store, a, b) for a, b in store.chunks(chunk_tokens)]
    with ExitStack() as stack:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(
            prefix="lmserve-count-", dir=temp_dir)))  # fmt: skip
        progress.note(f"counting {store.tokens:,} tokens in {len(chunks)} chunks of up to "
                      f"{chunk_tokens:,} tokens (--memory {format_bytes(memory)}); "
                      f"sorted runs in {folder}")  # fmt: skip
        unigrams = np.zeros(vocab_size, dtype=np.int64)
        for chunk in chunks:
            unigrams += np.bincount(store.read(chunk.first, chunk.last), minlength=vocab_size)
        tables = [unigram_table(unigrams, vocab_size, store.tokens)]
        count_dtype = index_dtype(store.tokens)
        nodes: RawFile | None = None  # the previous order's node at every position
        for k in range(2, order + 1):
            check_key_range(len(tables[-1]), vocab_size, k)
            started = time.monotonic()
            runs, inverse = _write_runs(store, chunks, nodes, k, vocab_size, folder, count_dtype,
                                        progress)  # fmt: skip
            keys, counts = _merge(runs, folder / f"merged-{k}", memory, k, progress)
            suffix, next_nodes = _number(store, chunks, runs, inverse, nodes, keys, k, order,
                                         len(tables[-1]), folder)  # fmt: skip
            for run in runs:
                run.remove()
            inverse.remove()
            if nodes is not None:
                nodes.remove()
            nodes = next_nodes
            context, word = split_keys(keys, vocab_size, len(tables[-1]))
            del keys
            tables.append(OrderTable(k, context, word, suffix, counts))
            progress.note(f"{k}-grams: {len(word):,} from {len(runs)} runs in "
                          f"{time.monotonic() - started:.1f} s")  # fmt: skip
        return NgramCounts(vocab_size=vocab_size, orders=tables)


def _write_runs(
    store: TokenStore,
    chunks: list[_Chunk],
    nodes: RawFile | None,
    k: int,
    vocab_size: int,
    folder: Path,
    count_dtype: type[np.signedinteger[Any]],
    progress: Progress,
) -> tuple[list[SortedRun], RawFile]:
    """Pass 1: every chunk's sorted run, and each n-gram end's index in its chunk's run."""
    runs: list[SortedRun] = []
    widest = max(chunk.stop - chunk.start for chunk in chunks)
    inverse_file = RawFile(folder / f"inverse-{k}", index_dtype(widest))
    spilled = 0
    for c, chunk in enumerate(chunks):
        ids = store.read(chunk.first, chunk.last)
        node = ids if nodes is None else nodes.read(chunk.start, chunk.stop)
        ends = chunk.ends(store, k)
        keys = node[ends - 1].astype(np.int64)
        keys *= vocab_size
        keys += ids[ends]
        del ids, node
        uniq, counts, inverse = sorted_unique(keys)
        del keys
        chunk.ends_start = inverse_file.size
        inverse_file.append(inverse)
        chunk.ends_stop = inverse_file.size
        runs.append(write_run(folder, f"run-{k}-{c}", uniq, counts.astype(count_dtype)))
        spilled += uniq.nbytes + len(uniq) * np.dtype(count_dtype).itemsize
        progress.update(f"counting {k}-grams: chunk {c + 1} of {len(chunks)}, "
                        f"{len(runs)} runs written ({format_bytes(spilled)})")  # fmt: skip
    if inverse_file.size == 0:
        raise no_ngrams_error(k)
    return runs, inverse_file


def _merge(
    runs: list[SortedRun], stem: Path, memory: int, k: int, progress: Progress
) -> tuple[Int64Array, IndexArray]:
    """Pass 2: the runs merged into the order's sorted keys and summed counts."""
    out = (RawFile(stem.with_suffix(".keys"), np.int64),
           RawFile(stem.with_suffix(".counts"), runs[0].counts.dtype))  # fmt: skip

    def report(done: int, total: int) -> None:
        progress.update(f"merging {len(runs)} runs of {k}-grams: {done:,} of {total:,} entries "
                        f"({100.0 * done / max(total, 1):.0f}%)")  # fmt: skip

    merge_runs(runs, out, block=merge_block_size(len(runs), memory), report=report)
    keys, counts = out[0].read_all(), out[1].read_all()
    out[0].remove()
    out[1].remove()
    return keys, counts


def _number(
    store: TokenStore,
    chunks: list[_Chunk],
    runs: list[SortedRun],
    inverse_file: RawFile,
    nodes: RawFile | None,
    keys: Int64Array,
    k: int,
    order: int,
    contexts: int,
    folder: Path,
) -> tuple[IndexArray, RawFile | None]:
    """Pass 3: each n-gram's suffix, and (below the top order) the node file of order k."""
    n = len(keys)
    suffix = np.empty(n, dtype=index_dtype(contexts))
    next_nodes = RawFile(folder / f"nodes-{k}", index_dtype(n)) if k < order else None
    for chunk, run in zip(chunks, runs, strict=True):
        rank = np.searchsorted(keys, run.keys.read_all()).astype(index_dtype(n))
        here = rank[inverse_file.read(chunk.ends_start, chunk.ends_stop)]
        del rank
        ends = chunk.ends(store, k)
        if nodes is None:
            suffix[here] = store.read(chunk.first, chunk.last)[ends]
        else:
            suffix[here] = nodes.read(chunk.start, chunk.stop)[ends]
        if next_nodes is not None:
            node = np.full(chunk.stop - chunk.start, -1, dtype=next_nodes.dtype)
            node[ends] = here
            next_nodes.append(node)
    return suffix, next_nodes
