"""`NgramTables`: a back-off n-gram model as it is scored and stored, nothing more.

The unigrams are two arrays indexed by word id; every order k >= 2 is one probing hash table
(`hashing.ProbingTable`) whose slots hold the exact key, log-prob and backoff. At 1.5 slots per
entry an n-gram costs 24 bytes (18 in the highest order), KenLM's probing footprint.

Beside them, the bigrams' second words grouped by their first word (`bigram_start`,
`bigram_words`: 4 bytes a bigram, about half a byte an n-gram of a 5-gram model). A next-word
distribution needs the words that can follow a context; every n-gram's suffix being an entry,
those are among the bigrams that begin with the context's last word, so the distribution reads
that short list and probes the longer contexts for its words only, instead of probing the
whole vocabulary.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from lmserve.server.backends.ngram.compact import CompactTable, compact_tables
from lmserve.server.backends.ngram.hashing import EMPTY, ProbingTable

# An order's table: exact (`ProbingTable`) or quantized (`CompactTable`, `import-arpa --quantize`).
ScoringTable = ProbingTable | CompactTable

F32 = npt.NDArray[np.float32]
U32 = npt.NDArray[np.uint32]
I64 = npt.NDArray[np.int64]

UNK, BOS, EOS = "<unk>", "<s>", "</s>"


@dataclass
class NgramTables:
    """Natural-log values (ARPA's log10 x ln 10) as float32.

    `uni_prob`/`uni_backoff` are indexed by word id (`vocab` order); `tables[k-2]` is order k's
    table, keyed by the prefix's slot in order k-1's (order 1's "slot" is the word id).
    `counts` are the ARPA `\\data\\` counts; `fill_ins[k-1]` the entries of order k the import
    added because the file lacked them (prefixes or suffixes of its n-grams, as KenLM adds).
    """

    vocab: list[str]
    counts: list[int]
    uni_prob: F32
    uni_backoff: F32
    tables: list[ScoringTable] = field(default_factory=list)
    fill_ins: list[int] = field(default_factory=list)
    # The words that follow word w in a bigram: bigram_words[bigram_start[w]:bigram_start[w + 1]].
    # Empty for a unigram model.
    bigram_start: U32 = field(default_factory=lambda: np.zeros(1, dtype=np.uint32))
    bigram_words: U32 = field(default_factory=lambda: np.zeros(0, dtype=np.uint32))

    @property
    def order(self) -> int:
        return len(self.tables) + 1

    def nbytes(self) -> int:
        """Bytes of the arrays (what the binary holds beside its header and vocabulary)."""
        lists = self.bigram_start.nbytes + self.bigram_words.nbytes
        tables = sum(t.nbytes for t in self.tables)
        return self.uni_prob.nbytes + self.uni_backoff.nbytes + lists + tables

    def with_bigram_lists(self) -> NgramTables:
        """The same model with its bigram lists made from its exact order-2 table (empty lists,
        one offset a word, for a unigram model)."""
        if not self.tables:
            empty = np.zeros(len(self.vocab) + 1, dtype=np.uint32)
            return dataclasses.replace(self, bigram_start=empty, bigram_words=empty[:0])
        table = self.tables[0]
        assert isinstance(table, ProbingTable), "bigram lists are made from the exact table"
        keys = table.slots["key"]
        keys = keys[keys != EMPTY]
        first = (keys >> np.uint64(32)).astype(np.int64)
        second = (keys & np.uint64(0xFFFFFFFF)).astype(np.int64)
        start, words = group_bigrams(first, second, len(self.vocab))
        return dataclasses.replace(self, bigram_start=start, bigram_words=words)

    def n_entries(self) -> int:
        """N-grams held, fill-ins included."""
        return len(self.uni_prob) + sum(t.n_entries for t in self.tables)

    @property
    def quantized(self) -> bool:
        return any(isinstance(t, CompactTable) for t in self.tables)

    def quantize(self) -> NgramTables:
        """The same model with 8-bit values and quotiented keys (`compact.py`)."""
        if self.quantized:
            return self
        exact = [t for t in self.tables if isinstance(t, ProbingTable)]
        compact = compact_tables(exact, len(self.vocab))
        return dataclasses.replace(self, tables=list(compact))

    def max_value_errors(self) -> tuple[float, float]:
        """The largest |quantized - exact| of any log-prob and of any backoff (nats; 0 when
        exact)."""
        probs, backoffs = [0.0], [0.0]
        for t in self.tables:
            if isinstance(t, CompactTable):
                probs.append(t.quantization.max_prob_error)
                backoffs.append(t.quantization.max_backoff_error)
        return max(probs), max(backoffs)

    def max_token_error(self) -> float:
        """A bound on any token's log-prob error from quantization: its n-gram's log-prob plus
        the backoffs of up to N-2 contexts of orders >= 2 (unigrams are exact; nats, 0 when
        exact)."""
        prob, backoff = self.max_value_errors()
        return prob + max(0, self.order - 2) * backoff


def group_bigrams(first: I64, second: I64, vocab_size: int) -> tuple[U32, U32]:
    """(start, words): the second words grouped by first word, with per-word offsets."""
    if len(second) >= 2**32:
        raise ValueError("too many bigrams for 32-bit offsets")
    order = np.argsort(first.astype(np.uint32), kind="stable")  # a radix sort
    start = np.zeros(vocab_size + 1, dtype=np.uint32)
    start[1:] = np.cumsum(np.bincount(first, minlength=vocab_size))
    return start, second[order].astype(np.uint32)
