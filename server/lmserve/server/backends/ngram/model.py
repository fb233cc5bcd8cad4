"""`NgramModel`: a back-off n-gram language model scored exactly as KenLM scores it.

KenLM's rule (`lm/model.cc`, `GenericModel::FullScore`): for word w after history h, find the
longest n-gram `h' w` in the model whose context h' is a suffix of h, and

    log p(w | h) = log p(w | h') + sum of backoff(c) over the suffixes c of h longer than h'

where the sum runs over the contexts KenLM's state holds (those found while scoring the previous
word, at most N-1 words). All values here are natural logs (ARPA's log10 x ln 10).

The model is `tables.NgramTables`: unigram arrays, and for each order k >= 2 a probing hash
table (`hashing.ProbingTable`) whose slots hold an entry's exact key, log-prob and backoff. The
key of the order-k entry ending at token i is `(slot of the order-(k-1) entry ending at token
i-1) << 32 | word_i` (order 1's "slot" is the word id), so the entries ending at a token form a
prefix chain through the tables.

The C kernel (`_kernel.c`, the default when built) resolves the orders one after another over a
chunk of texts, prefetching lookups well ahead, then applies KenLM's state rule per text.
`kernel="numpy"` is the vectorised reference:
1. Lay the batch out as one token array with `<s>`/`</s>` inserted per text.
2. Resolve order k for all positions still matching in one vectorised lookup, k = 2..N.
3. The backoff part at token i is (sum of backoffs of all contexts found at i-1) minus (those
   at i-1 that token i extended), accumulated in float64 during the same loop.
4. Totals are a segmented sum over the texts' offsets.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from lmserve.server.backends.base import BatchScores, EncodedBatch, FloatArray, Vocabulary
from lmserve.server.backends.ngram.arpa import Progress
from lmserve.server.backends.ngram.arpa_import import import_arpa
from lmserve.server.backends.ngram.binary import BinaryVersionError, load_tables, save_tables
from lmserve.server.backends.ngram.compact import CompactTable
from lmserve.server.backends.ngram.tables import BOS, EOS, UNK, NgramTables, ScoringTable

# KenLM's minimised state after a history: the last word, then the slots of the entries of
# orders 2, 3, ... ending at it (`context_slots`), at most order - 1 of them. Equal states give
# equal next-token distributions, and a tuple of ints is hashable: histories merge by it.
NgramState = tuple[int, ...]

try:
    from lmserve.server.backends.ngram import _kernel
except ImportError:  # not compiled (e.g. a source checkout without `make install`)
    _kernel = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

Kernel = Literal["c", "numpy"]
# The C kernel when it is importable; NgramModel(kernel=...) overrides per model.
DEFAULT_KERNEL: Kernel = "c" if _kernel is not None else "numpy"


def c_kernel_available() -> bool:
    return _kernel is not None


class NgramModel:
    """A loaded n-gram model; keeps no per-request state. Every score is a natural log.

    >>> model = NgramModel.from_arpa("kjv.3gram.arpa")          # doctest: +SKIP
    >>> batch = encode_token_lists([["in", "the", "beginning"]], model.vocab)  # doctest: +SKIP
    >>> model.score(batch).totals                                 # doctest: +SKIP
    array([-9.02...])
    """

    def __init__(self, tables: NgramTables, *, kernel: Kernel | None = None) -> None:
        self._t = tables
        self.order: int = tables.order
        # The import refused duplicate unigrams: the word index can wait for its first use.
        self._vocab = Vocabulary.from_words(tables.vocab, unk=UNK, bos=BOS, eos=EOS, distinct=True)
        # float64 copies of the small unigram arrays: gathered for every token.
        self._uni_prob = tables.uni_prob.astype(np.float64)
        self._uni_backoff = tables.uni_backoff.astype(np.float64)
        self._tables: list[ScoringTable] = list(tables.tables)
        self._c: _kernel.Scorer | None = None
        self.kernel: Kernel = kernel or DEFAULT_KERNEL
        if self.kernel == "c":
            if _kernel is None:
                raise RuntimeError("the C kernel is not built: run `make install`")
            self._c = _kernel.Scorer(*self._scorer_args())
        elif self.kernel != "numpy":
            raise ValueError(f"kernel must be 'c' or 'numpy', not {kernel!r}")

    def _scorer_args(self) -> tuple[Any, ...]:
        return (
            self._uni_prob,
            self._uni_backoff,
            tuple(t.raw for t in self._tables),
            tuple(t.n_home for t in self._tables),
            self._vocab.bos_id,
            self._vocab.eos_id,
            tuple(t.kernel_layout() if isinstance(t, CompactTable) else None for t in self._tables),
            self._t.bigram_start,
            self._t.bigram_words,
        )

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def from_arpa(
        cls,
        path: str | Path,
        *,
        kernel: Kernel | None = None,
        progress: Progress | None = None,
    ) -> NgramModel:
        """Reads an ARPA file (plain or gzipped, any order) in one streaming pass
        (`arpa_import.import_arpa`); `progress(read, total)` is called as its n-grams are read."""
        return cls(import_arpa(path, progress=progress), kernel=kernel)

    def save(self, path: str | Path) -> str:
        """Writes the memory-mappable binary file (see `binary.py`); returns its sha256 (hex)."""
        return save_tables(self._t, Path(path))

    @classmethod
    def load(
        cls,
        path: str | Path,
        *,
        kernel: Kernel | None = None,
        arpa_fallback: str | Path | None = None,
    ) -> NgramModel:
        """Memory-maps a file written by `save`; raises ModelLoadError if it is not one.

        A binary of another format version (`binary.BinaryVersionError`, naming the file, the
        version found and the one expected) is compiled from `arpa_fallback` instead when that is
        given, with a warning to rebuild the binary; without it the error is raised.
        """
        try:
            return cls(load_tables(Path(path)), kernel=kernel)
        except BinaryVersionError as exc:
            if arpa_fallback is None:
                raise
            logger.warning(
                "%s: binary format version %d, this lmserve reads version %d; compiling %s "
                "in memory instead (slow). Rebuild the binary: `lmserve import-arpa` or "
                "`make models`",
                path,
                exc.found,
                exc.expected,
                arpa_fallback,
            )
            return cls.from_arpa(arpa_fallback, kernel=kernel)

    # -- facts --------------------------------------------------------------------------------
    @property
    def vocab(self) -> Vocabulary:
        return self._vocab

    def adopt_vocabulary(self, vocab: Vocabulary) -> None:
        """Takes a codec's token strings for the same ids: a character or BPE model's ARPA words
        are its tokens escaped (`text.char.escape_token`), the codec's are the tokens themselves.
        """
        same_ids = (vocab.unk_id, vocab.bos_id, vocab.eos_id) == (
            self._vocab.unk_id,
            self._vocab.bos_id,
            self._vocab.eos_id,
        )
        if len(vocab) != len(self._vocab) or not same_ids:
            raise ValueError("the new vocabulary must have the same size and special ids")
        self._vocab = vocab

    @property
    def tables(self) -> NgramTables:
        return self._t

    def ngram_counts(self) -> list[int]:
        """Entries per order as the ARPA `\\data\\` section declared them."""
        return list(self._t.counts)

    # -- scoring ------------------------------------------------------------------------------
    def score(
        self, batch: EncodedBatch, *, bos: bool = True, eos: bool = True, per_token: bool = False
    ) -> BatchScores:
        """log P(text [+ </s>] | <s> or empty context) in nats per text, as KenLM's score."""
        if self._c is not None:
            return self._score_c(batch, bos=bos, eos=eos, per_token=per_token)
        offsets = np.asarray(batch.offsets, dtype=np.int64)
        n_texts = len(offsets) - 1
        lengths = np.diff(offsets)
        extra = int(bos) + int(eos)
        ext_offsets = offsets + np.arange(n_texts + 1, dtype=np.int64) * extra
        tokens = self._layout(batch.ids, lengths, ext_offsets, bos, eos)
        log_probs, matched = self._score_tokens(tokens, ext_offsets)
        text_starts = ext_offsets[:-1]
        if bos:  # <s> is context only
            log_probs[text_starts] = 0.0
        cumulative = np.zeros(len(log_probs) + 1, dtype=np.float64)
        np.cumsum(log_probs, out=cumulative[1:])
        totals = cumulative[ext_offsets[1:]] - cumulative[text_starts]
        if not per_token:
            return BatchScores(totals=totals)
        keep = np.ones(len(tokens), dtype=np.bool_)
        if bos:
            keep[text_starts] = False
        token_offsets = offsets + np.arange(n_texts + 1, dtype=np.int64) * int(eos)
        return BatchScores(
            totals=totals,
            token_log_probs=log_probs[keep],
            token_offsets=token_offsets,
            ngram_lengths=matched[keep].astype(np.int32),
        )

    def _score_c(
        self, batch: EncodedBatch, *, bos: bool, eos: bool, per_token: bool
    ) -> BatchScores:
        """`score` through the C kernel: one call, outputs allocated here."""
        assert self._c is not None
        ids = np.ascontiguousarray(batch.ids, dtype=np.int32)
        offsets = np.ascontiguousarray(batch.offsets, dtype=np.int64)
        n_texts = len(offsets) - 1
        totals = np.empty(n_texts, dtype=np.float64)
        if not per_token:
            self._c.score(ids, offsets, bos, eos, totals)
            return BatchScores(totals=totals)
        n_out = len(ids) + (n_texts if eos else 0)
        log_probs = np.empty(n_out, dtype=np.float64)
        lengths = np.empty(n_out, dtype=np.int32)
        self._c.score(ids, offsets, bos, eos, totals, log_probs, lengths)
        token_offsets = offsets + np.arange(n_texts + 1, dtype=np.int64) * int(eos)
        return BatchScores(
            totals=totals,
            token_log_probs=log_probs,
            token_offsets=token_offsets,
            ngram_lengths=lengths,
        )

    def _layout(
        self,
        ids: npt.NDArray[np.int32],
        lengths: npt.NDArray[np.int64],
        ext_offsets: npt.NDArray[np.int64],
        bos: bool,
        eos: bool,
    ) -> npt.NDArray[np.int64]:
        """The flat token array with <s> before and </s> after each text, as asked."""
        ids64 = np.asarray(ids, dtype=np.int64)
        if not (bos or eos):
            return ids64
        tokens = np.empty(int(ext_offsets[-1]), dtype=np.int64)
        extra = int(bos) + int(eos)
        shift = np.repeat(np.arange(len(lengths), dtype=np.int64) * extra + int(bos), lengths)
        tokens[np.arange(len(ids64), dtype=np.int64) + shift] = ids64
        if bos:
            tokens[ext_offsets[:-1]] = self._vocab.bos_id
        if eos:
            tokens[ext_offsets[1:] - 1] = self._vocab.eos_id
        return tokens

    def _score_tokens(
        self, tokens: npt.NDArray[np.int64], ext_offsets: npt.NDArray[np.int64]
    ) -> tuple[FloatArray, npt.NDArray[np.int8]]:
        """Per-token log p (nats) and matched n-gram length; texts start at `ext_offsets`."""
        n_order = self.order
        log_probs = self._uni_prob[tokens]
        matched = np.ones(len(tokens), dtype=np.int8)
        if n_order == 1 or len(tokens) == 0:
            return log_probs, matched
        # found_backoff[i]: sum of backoffs of the contexts (orders < N) found ending at i.
        found_backoff = self._uni_backoff[tokens]
        # extended[i]: the part of found_backoff[i-1] that token i's longer match made unused.
        extended = np.zeros(len(tokens), dtype=np.float64)
        first = np.zeros(len(tokens), dtype=np.bool_)
        first[ext_offsets[:-1][ext_offsets[:-1] < len(tokens)]] = True
        # Positions whose previous token is in the same text, and that previous token's entry.
        pos = np.flatnonzero(~first[1:]) + 1
        prev: npt.NDArray[np.integer[Any]] = tokens[pos - 1]
        # prev: the order-(k-1) entry ending at pos-1 (a word id for k = 2, else a slot).
        for k in range(2, n_order + 1):
            table = self._tables[k - 2]
            entry = table.find(prev.astype(np.int64), tokens[pos])
            hit = entry >= 0
            pos, entry, prev = pos[hit], entry[hit], prev[hit]
            if len(pos) == 0:
                break
            if k == 2:
                below = self._uni_backoff[prev]
            else:
                below = self._tables[k - 3].backoffs(prev.astype(np.int64))
            extended[pos] += below
            log_probs[pos] = table.probs(entry)
            matched[pos] = k
            if k == n_order:
                break
            found_backoff[pos] += table.backoffs(entry)
            nxt = pos + 1
            more = nxt < len(tokens)
            more[more] = ~first[nxt[more]]
            pos, prev = nxt[more], entry[more]
        # KenLM: p += backoffs of in_state contexts from the matched length up (FullScore).
        backoff = np.empty(len(tokens), dtype=np.float64)
        backoff[0] = 0.0
        np.subtract(found_backoff[:-1], extended[1:], out=backoff[1:])
        backoff[first] = 0.0
        log_probs += backoff
        return log_probs, matched

    # -- next-word distributions --------------------------------------------------------------
    def context_slots(self, context: Sequence[int], *, bos: bool = True) -> list[int]:
        """KenLM's state after `[<s>] context`: the entries of orders 1, 2, ... that end it, as
        slots of their orders' tables (order 1's "slot" is the word id)."""
        n_keep = self.order - 1
        window = [int(t) for t in context][-n_keep:] if n_keep else []
        if bos and len(context) < n_keep:
            window.insert(0, self._vocab.bos_id)
        found: list[int] = []  # slots ending at the previous token, by order (order 1: word)
        for word in window:
            now = [word]
            for k, prev in enumerate(found[: n_keep - 1], start=2):
                slot = self._tables[k - 2].get_entry(prev, word)
                if slot < 0:
                    break
                now.append(slot)
            found = now
        return found[:n_keep]

    def next_token_log_probs(self, context: Sequence[int], *, bos: bool = True) -> FloatArray:
        """log P(w | [<s>] context) in nats for every vocabulary id w (shape [len(vocab)]).

        The words of the bigrams after the context's last word (`NgramTables.bigram_words`)
        are looked up after each longer context entry, shortest first, as long as they keep
        matching (every suffix of an entry is an entry): the longest match writes last. The C
        kernel does it with prefetching (its float32 row, widened); numpy in vectorised rounds.
        """
        if self._c is not None:
            return self.next_token_log_probs_batch([context], bos=bos)[0].astype(np.float64)
        return self._next_token_log_probs_numpy(context, bos=bos)

    def _next_token_log_probs_numpy(self, context: Sequence[int], *, bos: bool) -> FloatArray:
        return self._state_log_probs_numpy(self.context_slots(context, bos=bos))

    def _state_log_probs_numpy(self, found: Sequence[int]) -> FloatArray:
        """A state's next-token log-probs (float64), the numpy kernel's way."""
        backoffs = [float(self._uni_backoff[found[0]])] if found else []
        backoffs += [
            float(self._tables[j - 1].backoffs(np.array([s], dtype=np.int64))[0])
            for j, s in enumerate(found)
            if j
        ]
        out = self._uni_prob + sum(backoffs)
        if not found:
            return out
        # The words that may follow: those of the bigrams after the context's last word.
        start, last = self._t.bigram_start, found[0]
        words = self._t.bigram_words[start[last] : start[last + 1]].astype(np.int64)
        for j, slot in enumerate(found):
            table = self._tables[j]
            hit = table.find(np.full(len(words), slot, dtype=np.int64), words)
            keep = hit >= 0
            words = words[keep]
            out[words] = table.probs(hit[keep]) + sum(backoffs[j + 1 :])
        return out

    def next_token_log_probs_batch(
        self,
        contexts: Sequence[Sequence[int]],
        *,
        bos: bool = True,
        out: npt.NDArray[np.float32] | None = None,
    ) -> npt.NDArray[np.float32]:
        """`next_token_log_probs` of every context as one float32 array [len(contexts), V].

        The C kernel fills all rows in one call (a row whose cut context another row has is
        copied from it), each row a pass over the vocabulary per context order; the numpy kernel
        runs `next_token_log_probs` per row. `out`, when given, must be a C-contiguous float32
        [len(contexts), V] array; it is filled and returned.
        """
        n_rows, n_vocab = len(contexts), len(self._vocab)
        if out is None:
            out = np.empty((n_rows, n_vocab), dtype=np.float32)
        elif out.dtype != np.float32 or out.shape != (n_rows, n_vocab):
            raise ValueError(
                f"out must be float32 {(n_rows, n_vocab)}, not {out.dtype} {out.shape}"
            )
        if self.kernel != "c":
            for i, context in enumerate(contexts):
                out[i] = self._next_token_log_probs_numpy(context, bos=bos)
            return out
        scorer = self._c
        assert scorer is not None
        # Flattened through lists: ~4x cheaper than np.fromiter for a step's few short contexts.
        offsets = np.array([0, *itertools.accumulate(map(len, contexts))], dtype=np.int64)
        ids = np.array(list(itertools.chain.from_iterable(contexts)), dtype=np.int32)
        scorer.distributions(ids, offsets, bos, out)
        return out

    # -- word lookups from a state ------------------------------------------------------------
    def lookup_start(self, *, bos: bool) -> NgramState:
        """The state after `<s>` (bos), or before anything was read."""
        return (self._vocab.bos_id,) if bos and self.order > 1 else ()

    def score_next(
        self, states: Sequence[NgramState], tokens: Sequence[int]
    ) -> tuple[list[float], list[NgramState]]:
        """For each (state, token): log P(token | state) in nats and the state after the token,
        without computing a distribution: the token's entries after the state's, orders 2.. up
        to the first miss (a handful of probes, where a distribution probes every word that
        follows the state's last word). Each value equals, bit for bit, the float32 entry of
        `next_token_log_probs_batch`'s row for the same history (the same float64 sums, rounded
        alike); Score's per-token log-prob sums the backoffs in another order (within 1e-6).
        Rows from the same state object (a lattice node's arcs) read it once."""
        if len(states) != len(tokens):
            raise ValueError(f"{len(states)} states for {len(tokens)} tokens")
        if self._c is not None:
            return self._c.score_next(states, tokens)
        lps: list[float] = []
        nexts: list[NgramState] = []
        n_vocab = len(self._vocab)
        rows: dict[NgramState, FloatArray] = {}
        for state, token in zip(states, tokens, strict=True):
            word = int(token)
            if not 0 <= word < n_vocab:
                raise ValueError(f"{word} is not a vocabulary id")
            row = rows.get(state)
            if row is None:
                row = rows[state] = self._state_log_probs_numpy(state)
            lps.append(float(np.float32(row[word])))
            nexts.append(self._next_state(state, word))
        return lps, nexts

    def _next_state(self, state: NgramState, word: int) -> NgramState:
        """The chain of entries ending at `word` after `state`, at most order - 1 (numpy)."""
        now = [word]
        for k, prev in enumerate(state[: self.order - 2], start=2):
            slot = self._tables[k - 2].get_entry(prev, word)
            if slot < 0:
                break
            now.append(slot)
        return tuple(now[: self.order - 1])

    def state_distributions(self, states: Sequence[NgramState]) -> npt.NDArray[np.float32]:
        """Each state's next-token log-probs, float32 [len(states), V]: the rows
        `next_token_log_probs_batch` gives for histories that end in these states."""
        out = np.empty((len(states), len(self._vocab)), dtype=np.float32)
        if self._c is not None:
            self._c.state_distributions(states, out)
            return out
        for i, state in enumerate(states):
            out[i] = self._state_log_probs_numpy(state)
        return out
