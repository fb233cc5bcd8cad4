"""Word-level tokenization and encoding of text batches into vocabulary ids.

KenLM reads text as whitespace-separated words and never changes them; that is the default here.
A model may ask for lowercasing and a token pattern (the shipped KJV model does, so that users can
send ordinary text), and then exactly the rule its training corpus was prepared with applies.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from itertools import chain, repeat

import numpy as np

from lmserve.server.backends.base import EncodedBatch, Vocabulary


class WordTokenizer:
    """Splits text into words: optional lowercasing, then a regex or plain whitespace split.

    >>> WordTokenizer(lowercase=True, pattern=r"[a-z]+").split("In the Beginning, God")
    ['in', 'the', 'beginning', 'god']
    """

    def __init__(self, *, lowercase: bool = False, pattern: str | None = None) -> None:
        self.lowercase = lowercase
        self.pattern = pattern
        self._findall = re.compile(pattern).findall if pattern else None

    def split(self, text: str) -> list[str]:
        if self.lowercase:
            text = text.lower()
        if self._findall is not None:
            return list(self._findall(text))
        return text.split()

    def split_batch(self, texts: Sequence[str]) -> list[list[str]]:
        split = self.split
        return [split(t) for t in texts]


def encode_token_lists(token_lists: Sequence[Sequence[str]], vocab: Vocabulary) -> EncodedBatch:
    """Maps words to ids in one pass over the whole batch; unknown words get `vocab.unk_id`."""
    lengths = np.fromiter(map(len, token_lists), dtype=np.int64, count=len(token_lists))
    offsets = np.zeros(len(token_lists) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    total = int(offsets[-1])
    flat = chain.from_iterable(token_lists)
    # -1 marks an OOV word; dict.get via map runs in C, with no Python loop per word.
    ids = np.fromiter(map(vocab.index.get, flat, repeat(-1, total)), dtype=np.int32, count=total)
    oov = ids < 0
    ids[oov] = vocab.unk_id
    # KenLM counts the literal unknown-word token as OOV too.
    oov |= ids == vocab.unk_id
    return EncodedBatch(ids=ids, offsets=offsets, oov=oov)
