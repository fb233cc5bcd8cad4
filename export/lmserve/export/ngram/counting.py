"""Vectorised n-gram counting: every order as sorted integer keys (`tables`), no loop per n-gram.

Orders are counted one after another, since an n-gram's key holds its context's number among
the (k-1)-grams: for every corpus position j where an n-gram of order k ends, the key is
`node[j - 1] * V + word[j]`, `node` being the (k-1)-gram ending at each position. One sort of
those keys gives the sorted n-grams, their counts and the n-gram ending at every position (the
next order's `node`); the (k-1)-gram ending at j is the n-gram's suffix.

Two ways, one result (tested equal): when the corpus's per-position arrays fit in `memory`
(about `IN_MEMORY_BYTES_PER_TOKEN` a token), each order is one sort in memory; otherwise
`counting_runs` counts chunk by chunk and merges sorted runs from disk, as lmplz does.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lmserve.export.ngram.corpus_stream import TokenStore
from lmserve.export.ngram.counting_runs import count_in_runs
from lmserve.export.ngram.progress import Progress
from lmserve.export.ngram.tables import (
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
from lmserve.export.ngram.vocab import EncodedCorpus

__all__ = ["IN_MEMORY_BYTES_PER_TOKEN", "NgramCounts", "OrderTable", "count_ngrams", "count_store"]

# Peak bytes per corpus token of counting in memory, beyond the tables: the ids, the previous
# order's node and the n-gram end positions (4 each), the keys sorted with their positions in
# place (8), first-of-run flags (1) and each key's rank (4), with a margin (measured with
# tracemalloc on 1M synthetic words: 22).
IN_MEMORY_BYTES_PER_TOKEN = 32


def count_ngrams(
    corpus: EncodedCorpus,
    order: int,
    vocab_size: int,
    *,
    memory: int | None = None,
    temp_dir: Path | None = None,
) -> NgramCounts:
    """Counts every n-gram of orders 1..`order` that lies inside a sentence `<s> .. </s>`."""
    return count_store(
        TokenStore.from_corpus(corpus), order, vocab_size, memory=memory, temp_dir=temp_dir
    )


def count_store(
    store: TokenStore,
    order: int,
    vocab_size: int,
    *,
    memory: int | None = None,
    temp_dir: Path | None = None,
    progress: Progress | None = None,
) -> NgramCounts:
    """`count_ngrams` over a `TokenStore`: in memory if it is there and fits `memory` bytes
    (None: no bound), else in sorted runs under `temp_dir` within that working memory."""
    if order < 1:
        raise ValueError(f"order must be at least 1, got {order}")
    progress = progress or Progress.silent()
    fits = memory is None or store.tokens * IN_MEMORY_BYTES_PER_TOKEN <= memory
    if store.in_memory and fits:
        return _count_in_memory(store, order, vocab_size)
    budget = memory if memory is not None else store.tokens * IN_MEMORY_BYTES_PER_TOKEN
    return count_in_runs(store, order, vocab_size, budget, temp_dir, progress)


def _count_in_memory(store: TokenStore, order: int, vocab_size: int) -> NgramCounts:
    ids = store.read(0, len(store.lengths))
    v = np.int64(vocab_size)
    tables = [unigram_table(np.bincount(ids, minlength=vocab_size), vocab_size, len(ids))]
    # node[j]: number of the order-k n-gram ending at position j (-1 where none fits).
    node = ids
    for k in range(2, order + 1):
        ends = ngram_ends(store.lengths, k)
        if len(ends) == 0:
            raise no_ngrams_error(k)
        check_key_range(len(tables[-1]), vocab_size, k)
        keys = node[ends - 1].astype(np.int64)
        keys *= v
        keys += ids[ends]
        uniq, counts, inverse = sorted_unique(keys)
        n = len(uniq)
        context, word = split_keys(uniq, vocab_size, len(tables[-1]))
        del keys, uniq  # uniq is a view of the keys
        suffix = np.empty(n, dtype=node.dtype)
        # The (k-1)-gram ending at j is words 2..k of this one (assignments are idempotent).
        suffix[inverse] = node[ends]
        if k < order:
            node = np.full(len(ids), -1, dtype=index_dtype(n))
            node[ends] = inverse
        del inverse, ends
        count = counts.astype(index_dtype(len(ids)), copy=False)
        tables.append(OrderTable(k, context, word, suffix, count))
    return NgramCounts(vocab_size=vocab_size, orders=tables)
