"""Word-level tokenization and encoding of text batches into vocabulary ids.

KenLM reads text as whitespace-separated words and never changes them; that is the default here.
A model may ask for lowercasing and a token pattern (the shipped KJV model does, so that users can
send ordinary text), and then exactly the rule its training corpus was prepared with applies.

Whitespace is KenLM's (util::kSpaces): ASCII space, \t, \n, \r, \v, \f and nothing else; a
no-break or other Unicode space stays inside a word (`str.split()` would split there: KenLM
does not). `TextEncoder` splits and encodes a whole batch in one C call (`_wordindex.c`) for that
rule; a regex-pattern tokenizer splits in Python (`re.findall`) and the same C index encodes the
words (`WordIndex.encode_words`), as it does a client's token lists. `encode_token_lists` below
is the Python reference (and the path when the extension is not compiled).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from itertools import chain, repeat

import numpy as np

from lmserve.server.text.vocab import EncodedBatch, Vocabulary

try:
    from lmserve.server.text import _wordindex
except ImportError:  # not compiled: the Python path below is the fallback and the reference
    _wordindex = None  # type: ignore[assignment]

# A word: a maximal run of bytes outside KenLM's whitespace set.
_KENLM_WORD = re.compile(r"[^ \t\n\r\v\f]+")


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
        return _KENLM_WORD.findall(text)

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


class TextEncoder:
    """A tokenizer and a vocabulary: texts (or token lists) -> `EncodedBatch`, one call a batch.

    >>> enc = TextEncoder(WordTokenizer(), Vocabulary.from_words(["<unk>", "<s>", "</s>", "a"]))
    >>> enc.encode_texts(["a b", ""]).ids.tolist()
    [3, 0]
    """

    def __init__(self, tokenizer: WordTokenizer, vocab: Vocabulary, *, native: bool = True):
        self.tokenizer = tokenizer
        self.vocab = vocab
        self._index: _wordindex.WordIndex | None = None
        if native and _wordindex is not None:
            self._index = _wordindex.WordIndex(list(vocab.words), vocab.unk_id)

    @property
    def native(self) -> bool:
        return self._index is not None

    def encode_texts(self, texts: Sequence[str]) -> EncodedBatch:
        """Splits with the tokenizer and maps words to ids (unknown -> unk, flagged OOV)."""
        if self._index is None:
            return encode_token_lists(self.tokenizer.split_batch(texts), self.vocab)
        if self.tokenizer.pattern is not None:  # a regex splits: the words are encoded in C
            return _encoded(self._index.encode_words(self.tokenizer.split_batch(texts)))
        if self.tokenizer.lowercase:
            texts = [t.lower() for t in texts]
        return _encoded(self._index.encode(texts))

    def encode_token_lists(self, token_lists: Sequence[Sequence[str]]) -> EncodedBatch:
        """Already split words (taken as they are) -> ids."""
        if self._index is None:
            return encode_token_lists(token_lists, self.vocab)
        return _encoded(self._index.encode_words(token_lists))


def _encoded(arrays: tuple[bytearray, bytearray, bytearray, bytearray]) -> EncodedBatch:
    """The C index's four arrays (ids, offsets, oov, oov_counts) as an `EncodedBatch`."""
    ids, offsets, oov, oov_counts = arrays
    return EncodedBatch(
        ids=np.frombuffer(ids, dtype=np.int32),
        offsets=np.frombuffer(offsets, dtype=np.int64),
        oov=np.frombuffer(oov, dtype=np.bool_),
        oov_counts=np.frombuffer(oov_counts, dtype=np.int64),
    )
