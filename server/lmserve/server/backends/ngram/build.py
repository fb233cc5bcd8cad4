"""Turns a parsed ARPA model into the tables the engine scores with (`NgramTables`), in numpy.

This is the reference build and the fallback of the streaming C importer (`arpa_import.py`): it
holds the whole parsed file in memory. Per order k the entries are sorted by (prefix index, last
word), so the children of a context are contiguous (CSR, `child_start`). While building, each
entry's exact key `prefix << 32 | word` goes into a bucketed hash table (`HashTable`) to find
prefixes and suffixes; the finished model is one probing table per order (`ProbingTable`: key,
prob and backoff in one slot, keyed by the prefix's slot).

ARPA files from pruned SRILM models can lack lower-order entries that KenLM relies on. KenLM
fills them in while loading (`lm/search_hashed.cc`, `FixSRI`: a missing suffix of an n-gram
gets a "blank" entry whose probability is the backed-off one and whose backoff is 0). We do the
same for missing suffixes, and also for missing prefixes (contexts), which our prefix-chained
keys need; KenLM's probing model refuses such files and its trie inserts the same blanks.
Afterwards every substring of an entry is an entry, so "longest chain of matches" and "longest
matching n-gram" coincide, as KenLM's lookup loop assumes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from lmserve.server.backends.ngram.arpa import ArpaModel
from lmserve.server.backends.ngram.hashing import HashTable, build_probing_tables, make_keys
from lmserve.server.backends.ngram.tables import BOS, EOS, UNK, NgramTables, ScoringTable
from lmserve.server.errors import ArpaFormatError

LN10 = math.log(10.0)
# KenLM scores a word at log10 -100 when the model has no <unk> (`lm/model.cc`).
MISSING_UNK_LOG10 = -100.0

F32 = npt.NDArray[np.float32]
I32 = npt.NDArray[np.int32]
I64 = npt.NDArray[np.int64]


@dataclass
class _Rows:
    """One order's entries while building, in log10."""

    words: I32
    log10_prob: npt.NDArray[np.float64]
    log10_backoff: npt.NDArray[np.float64]
    lines: I32  # -1 for fill-in entries

    def extend(self, words: I32) -> None:
        n = len(words)
        self.words = np.concatenate([self.words, words])
        self.log10_prob = np.concatenate([self.log10_prob, np.full(n, np.nan)])
        self.log10_backoff = np.concatenate([self.log10_backoff, np.zeros(n)])
        self.lines = np.concatenate([self.lines, np.full(n, -1, dtype=np.int32)])

    def take(self, perm: I64) -> None:
        self.words, self.lines = self.words[perm], self.lines[perm]
        self.log10_prob, self.log10_backoff = self.log10_prob[perm], self.log10_backoff[perm]


def build_tables(arpa: ArpaModel, name: str = "<arpa>") -> NgramTables:
    """Builds gap-filled probing tables from an ARPA model (see the module docstring).

    It takes the model's arrays over (`arpa.orders` is emptied): the sorted copies replace
    them, and nothing holds the file order's arrays beside them (the peak of an import)."""
    vocab = list(arpa.vocab)
    uni = arpa.orders[0]
    log10_prob, log10_backoff = uni.log10_prob, uni.log10_backoff
    for marker in (BOS, EOS):
        if marker not in vocab:
            raise ArpaFormatError(name, f"the unigrams lack {marker}")
    if UNK not in vocab:
        vocab.append(UNK)
        log10_prob = np.append(log10_prob, MISSING_UNK_LOG10)
        log10_backoff = np.append(log10_backoff, 0.0)
    n_order = len(arpa.orders)
    rows = [_Rows(o.words, o.log10_prob, o.log10_backoff, o.lines) for o in arpa.orders]
    arpa.orders.clear()
    uni_lines = np.full(len(vocab), -1, dtype=np.int32)
    uni_lines[: len(uni.lines)] = uni.lines
    rows[0] = _Rows(
        np.arange(len(vocab), dtype=np.int32)[:, None], log10_prob, log10_backoff, uni_lines
    )

    tables: list[HashTable | None] = [None] * n_order
    parents: list[I64] = [np.zeros(0, dtype=np.int64)] * n_order
    # suffix[k-1][e]: index in order k-1 of entry e's suffix (its last k-1 words).
    suffix: list[I64] = [np.zeros(0, dtype=np.int64)] * n_order
    k = 2
    while k <= n_order:
        cur = rows[k - 1]
        # Walk each entry's prefix chain: the index of words[:j] in order j, j = 1..k-1.
        prefix = cur.words[:, 0].astype(np.int64)
        missing_at = 0
        for j in range(2, k):
            table = tables[j - 1]
            assert table is not None
            prefix = table.lookup(make_keys(prefix, cur.words[:, j - 1])).astype(np.int64)
            gone = prefix < 0
            if gone.any():
                rows[j - 1].extend(_unique_rows(cur.words[gone, :j]))
                missing_at = j
                break
        if missing_at:
            k = missing_at  # rebuild from the order that gained fill-in contexts
            continue
        if k >= 3:
            below = tables[k - 2]
            assert below is not None
            suffix_idx = below.lookup(make_keys(suffix[k - 2][prefix], cur.words[:, -1])).astype(
                np.int64
            )
            gone = suffix_idx < 0
            if gone.any():
                rows[k - 2].extend(_unique_rows(cur.words[gone, 1:]))
                k -= 1
                continue
        else:
            suffix_idx = cur.words[:, -1].astype(np.int64)
        keys = make_keys(prefix, cur.words[:, -1])
        perm = np.argsort(keys)  # distinct keys: any order of ties is moot
        keys, prefix, suffix_idx = keys[perm], prefix[perm], suffix_idx[perm]
        cur.take(perm)
        dup = np.flatnonzero(keys[1:] == keys[:-1])
        if len(dup):
            line = int(max(cur.lines[dup[0]], cur.lines[dup[0] + 1]))
            raise ArpaFormatError(name, f"line {line}: duplicate {k}-gram")
        # A fill-in entry's probability is the backed-off one: p(suffix) + backoff(context).
        fill = np.isnan(cur.log10_prob)
        if fill.any():
            below_rows = rows[k - 2]
            cur.log10_prob[fill] = (
                below_rows.log10_prob[suffix_idx[fill]] + below_rows.log10_backoff[prefix[fill]]
            )
        tables[k - 1] = HashTable.build(keys)
        parents[k - 1], suffix[k - 1] = prefix, suffix_idx
        k += 1

    del tables, suffix  # the build's hash tables: the probing tables below replace them
    child_start = []
    for k in range(1, n_order):
        per_parent = np.bincount(parents[k], minlength=len(rows[k - 1].words))
        starts = np.zeros(len(per_parent) + 1, dtype=np.int64)
        np.cumsum(per_parent, out=starts[1:])
        child_start.append(starts)
    del parents
    probs, backoffs, words = [], [], []
    fill_ins = []
    while rows:  # each order's build rows go as its final arrays are made
        r = rows.pop(0)
        probs.append((r.log10_prob * LN10).astype(np.float32))
        if rows:  # not the highest order
            backoffs.append((r.log10_backoff * LN10).astype(np.float32))
        words.append(r.words[:, -1].astype(np.int32))
        fill_ins.append(int(np.count_nonzero(r.lines < 0)))
        del r
    fill_ins[0] = 0  # an appended <unk> is not a fill-in
    probing: list[ScoringTable] = list(build_probing_tables(probs, backoffs, words, child_start))
    return NgramTables(
        vocab=vocab,
        counts=list(arpa.counts),
        uni_prob=probs[0],
        uni_backoff=backoffs[0] if backoffs else np.zeros(len(vocab), dtype=np.float32),
        tables=probing,
        fill_ins=fill_ins,
    ).with_bigram_lists()


def _unique_rows(words: I32) -> I32:
    """Distinct rows of a small int32 matrix (only used for the rare fill-in entries)."""
    return np.unique(words, axis=0).astype(np.int32)
