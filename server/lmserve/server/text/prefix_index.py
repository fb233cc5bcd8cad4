"""The words of a vocabulary that start with a typed prefix, as one slice of a sorted array.

Autocomplete asks "which words start with `gr`?" once per keystroke. Sorting the words once
makes every answer a contiguous run found by two binary searches (O(log V)), returned as a
view of the id array: no per-keystroke scan of the vocabulary and no allocation beyond the view.

    >>> index = WordPrefixIndex.from_vocab(Vocabulary.from_words(["<unk>", "<s>", "</s>", "go",
    ...     "god", "good", "a"]))
    >>> index.ids_with_prefix("go").tolist()
    [3, 4, 5]
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Sequence

import numpy as np
import numpy.typing as npt

from lmserve.server.text.vocab import Vocabulary

Int64Array = npt.NDArray[np.int64]

# The last code point: a prefix made only of these has no successor string.
_MAX_CHAR = chr(0x10FFFF)


def _successor(prefix: str) -> str | None:
    """The least string greater than every string that starts with `prefix` (None: no bound)."""
    stripped = prefix.rstrip(_MAX_CHAR)
    if not stripped:
        return None
    return stripped[:-1] + chr(ord(stripped[-1]) + 1)


class WordPrefixIndex:
    """Words sorted by code point with their ids; `ids_with_prefix` is a slice of `ids`.

    Several ids may share one text (a subword vocabulary's `the` and `the</w>` both read
    "the" once their end-of-word mark is stripped); they sit together, by id.
    """

    def __init__(self, words: Sequence[str], ids: Sequence[int]) -> None:
        if len(words) != len(ids):
            raise ValueError(f"{len(words)} words but {len(ids)} ids")
        order = sorted(range(len(words)), key=lambda i: (words[i], ids[i]))
        self.words: tuple[str, ...] = tuple(words[i] for i in order)
        """The indexed words, sorted (code point order, as `str` compares)."""
        self.ids: Int64Array = np.array([ids[i] for i in order], dtype=np.int64)
        """`ids[j]` is the vocabulary id of `words[j]`."""
        self.ids.setflags(write=False)  # the slices handed out must not be written through

    @classmethod
    def from_vocab(cls, vocab: Vocabulary, exclude_ids: Iterable[int] = ()) -> WordPrefixIndex:
        """Every word of `vocab` except its specials (`<s>`, `</s>`, `<unk>`, pad) and
        `exclude_ids`: what a completion may ever offer."""
        excluded = {vocab.bos_id, vocab.eos_id, vocab.unk_id, vocab.pad_id, *exclude_ids}
        kept = [i for i in range(len(vocab)) if i not in excluded]
        return cls([vocab.words[i] for i in kept], kept)

    def __len__(self) -> int:
        return len(self.words)

    def span(self, prefix: str) -> tuple[int, int]:
        """(lo, hi): `words[lo:hi]` are exactly the words that start with `prefix`."""
        words = self.words
        lo = bisect_left(words, prefix)
        upper = _successor(prefix)
        hi = len(words) if upper is None else bisect_left(words, upper, lo)
        return lo, hi

    def ids_with_prefix(self, prefix: str) -> Int64Array:
        """The ids of the words that start with `prefix` (all of them for ""), in word order;
        a read-only view of `ids`."""
        lo, hi = self.span(prefix)
        return self.ids[lo:hi]

    def words_with_prefix(self, prefix: str) -> tuple[str, ...]:
        lo, hi = self.span(prefix)
        return self.words[lo:hi]
