"""Vocabulary selection and encoding of a tokenized corpus into one flat array of word ids.

Ids 0, 1, 2 are always `<unk>`, `<s>`, `</s>` (KenLM's order); the other words follow in order
of first occurrence. With `min_count` / `top_n`, words that do not qualify map to `<unk>`, which
then has real counts like any other word.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import chain, repeat
from typing import Any

import numpy as np
import numpy.typing as npt

UNK, BOS, EOS = "<unk>", "<s>", "</s>"
UNK_ID, BOS_ID, EOS_ID = 0, 1, 2
SPECIAL = (UNK, BOS, EOS)


def select_vocabulary(
    sentences: Sequence[Sequence[str]], *, min_count: int = 1, top_n: int | None = None
) -> list[str]:
    """The model's words: specials first, then the kept corpus words by first occurrence.

    `min_count` keeps words seen at least that often; `top_n` keeps the n most frequent of those
    (ties broken by first occurrence, so the result is deterministic).
    """
    counts = Counter(chain.from_iterable(sentences))  # insertion order = first occurrence
    return choose_words(counts, min_count=min_count, top_n=top_n)


def choose_words(
    counts: Mapping[str, int], *, min_count: int = 1, top_n: int | None = None
) -> list[str]:
    """`select_vocabulary` from word counts in first-occurrence order (the streaming reader
    counts block by block, so it cannot hand over the sentences)."""
    words = [w for w, c in counts.items() if c >= min_count and w not in SPECIAL]
    if top_n is not None and top_n < len(words):
        first_seen = {w: i for i, w in enumerate(words)}
        kept = set(sorted(words, key=lambda w: (-counts[w], first_seen[w]))[:top_n])
        words = [w for w in words if w in kept]
    return [*SPECIAL, *words]


@dataclass(frozen=True)
class EncodedCorpus:
    """Every sentence as `<s> w1 .. wm </s>`, concatenated.

    `ids[j]` is the word id at flat position j and `pos[j]` its position inside its sentence
    (0 for the `<s>`), so an n-gram of order k ends at j exactly when `pos[j] >= k - 1`.
    `oov` marks corpus words that were mapped to `<unk>` (the markers are never OOV). Ids and
    positions are int32 (half the memory of int64): vocabularies and sentences stay far below
    2**31.
    """

    ids: npt.NDArray[np.int32]
    pos: npt.NDArray[np.int32]
    oov: npt.NDArray[np.bool_]
    sentences: int


def encode_sentences(
    sentences: Sequence[Sequence[str]], index: Mapping[str, int]
) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32]]:
    """Each sentence as `<s> ids.. </s>` (int32, -1 for a word not in `index`), concatenated,
    and each sentence's length with its markers. Dict lookups run in C via `map`."""
    n = len(sentences)
    lengths = np.fromiter(map(len, sentences), dtype=np.int32, count=n) + np.int32(2)
    starts = np.zeros(n, dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    total = int(starts[-1]) + int(lengths[-1]) if n else 0
    n_words = total - 2 * n
    ids = np.empty(total, dtype=np.int32)
    is_word = np.ones(total, dtype=bool)
    is_word[starts] = False
    is_word[starts + lengths - 1] = False
    ids[is_word] = np.fromiter(
        map(index.get, chain.from_iterable(sentences), repeat(-1, n_words)),
        dtype=np.int32,
        count=n_words,
    )
    ids[starts] = BOS_ID
    ids[starts + lengths - 1] = EOS_ID
    return ids, lengths


def positions(lengths: npt.NDArray[np.int32]) -> npt.NDArray[np.int32]:
    """Each token's position inside its sentence (0 for the `<s>`), from the lengths."""
    total = int(lengths.sum(dtype=np.int64))
    wide = np.int32 if total < 2**31 else np.int64  # int32 arithmetic when it cannot overflow
    starts = np.zeros(len(lengths), dtype=wide)
    np.cumsum(lengths[:-1], out=starts[1:])
    pos: npt.NDArray[np.signedinteger[Any]] = np.arange(total, dtype=wide)
    pos -= np.repeat(starts, lengths)
    return pos.astype(np.int32, copy=False)


def encode_corpus(sentences: Sequence[Sequence[str]], index: Mapping[str, int]) -> EncodedCorpus:
    """The sentences' ids and positions; words not in `index` become `<unk>`, marked `oov`."""
    ids, lengths = encode_sentences(sentences, index)
    oov = ids < 0
    ids[oov] = UNK_ID
    return EncodedCorpus(ids=ids, pos=positions(lengths), oov=oov, sentences=len(sentences))
