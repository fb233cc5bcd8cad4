"""Vocabulary selection and encoding of a tokenized corpus into one flat array of word ids.

Ids 0, 1, 2 are always `<unk>`, `<s>`, `</s>` (KenLM's order); the other words follow in order
of first occurrence. With `min_count` / `top_n`, words that do not qualify map to `<unk>`, which
then has real counts like any other word.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain, repeat

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
    for special in SPECIAL:
        counts.pop(special, None)
    words = [w for w, c in counts.items() if c >= min_count]
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
    `oov` marks corpus words that were mapped to `<unk>` (the markers are never OOV).
    """

    ids: npt.NDArray[np.int64]
    pos: npt.NDArray[np.int64]
    oov: npt.NDArray[np.bool_]
    sentences: int


def encode_corpus(sentences: Sequence[Sequence[str]], index: dict[str, int]) -> EncodedCorpus:
    """Maps words to ids in one pass (dict lookups run in C via `map`), adding the markers."""
    n = len(sentences)
    lengths = np.fromiter(map(len, sentences), dtype=np.int64, count=n) + 2
    total = int(lengths.sum())
    # Where each sentence starts in the flat array.
    starts = np.zeros(n, dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    is_word = np.ones(total, dtype=bool)
    is_word[starts] = False
    is_word[starts + lengths - 1] = False
    n_words = total - 2 * n
    word_ids = np.fromiter(
        map(index.get, chain.from_iterable(sentences), repeat(-1, n_words)),
        dtype=np.int64,
        count=n_words,
    )
    ids = np.empty(total, dtype=np.int64)
    ids[starts] = BOS_ID
    ids[starts + lengths - 1] = EOS_ID
    oov = np.zeros(total, dtype=bool)
    oov[is_word] = word_ids < 0
    word_ids[word_ids < 0] = UNK_ID
    ids[is_word] = word_ids
    pos = np.arange(total, dtype=np.int64) - np.repeat(starts, lengths)
    return EncodedCorpus(ids=ids, pos=pos, oov=oov, sentences=n)
