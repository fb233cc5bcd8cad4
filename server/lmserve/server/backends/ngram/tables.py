"""`NgramTables`: a back-off n-gram model as it is scored and stored, nothing more.

The unigrams are two arrays indexed by word id; every order k >= 2 is one probing hash table
(`hashing.ProbingTable`) whose slots hold the exact key, log-prob and backoff. That is the whole
model: the binary file (`binary.py`) is these arrays, and scoring, next-word distributions and
beam search read nothing else. At 1.5 slots per entry an n-gram costs 24 bytes (18 in the
highest order), KenLM's probing footprint.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from lmserve.server.backends.ngram.hashing import ProbingTable

F32 = npt.NDArray[np.float32]

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
    tables: list[ProbingTable] = field(default_factory=list)
    fill_ins: list[int] = field(default_factory=list)

    @property
    def order(self) -> int:
        return len(self.tables) + 1

    def nbytes(self) -> int:
        """Bytes of the arrays (what the binary holds beside its header and vocabulary)."""
        return (
            self.uni_prob.nbytes
            + self.uni_backoff.nbytes
            + sum(t.slots.nbytes for t in self.tables)
        )

    def n_entries(self) -> int:
        """N-grams held, fill-ins included."""
        return len(self.uni_prob) + sum(t.n_entries for t in self.tables)
