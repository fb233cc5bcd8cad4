"""What each token of a subword vocabulary adds to a word, and which tokens end one.

Completing a word with a character or BPE model means searching over token sequences; the
search needs, per token, the text it adds to the word being spelled and whether it closes the
word. The two subword vocabularies mark word ends differently:

- BPE (`text/bpe.py`): a word's last piece carries the suffix `</w>`, so `the</w>` adds "the"
  and ends the word, while `the` adds "the" and does not.
- characters (`text/char.py`): the space token ends the word (it adds nothing to it); every
  other character adds itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from lmserve.server.text.prefix_index import WordPrefixIndex
from lmserve.server.text.vocab import Vocabulary

END_OF_WORD = "</w>"  # the suffix of text/bpe.py
SPACE = " "


@dataclass(frozen=True)
class PieceVocabulary:
    """Per token id: `texts[i]` (what it adds to the word), `ends_word[i]`, `usable[i]` (not a
    special token). `index` finds the usable pieces by their text's prefix."""

    texts: tuple[str, ...]
    ends_word: npt.NDArray[np.bool_]
    usable: npt.NDArray[np.bool_]
    index: WordPrefixIndex
    by_text: dict[str, tuple[int, ...]]
    usable_ids: npt.NDArray[np.int64]
    """The usable ids: what may follow a path that already spells a word."""
    starting_ids: npt.NDArray[np.int64]
    """The usable ids that add text: what may start a word (no empty word)."""

    @classmethod
    def build(cls, vocab: Vocabulary, texts: list[str], ends: list[bool]) -> PieceVocabulary:
        specials = {vocab.bos_id, vocab.eos_id, vocab.unk_id, vocab.pad_id}
        usable = np.array([i not in specials for i in range(len(vocab))], dtype=np.bool_)
        kept = [i for i in range(len(vocab)) if usable[i]]
        by_text: dict[str, list[int]] = {}
        for i in kept:
            by_text.setdefault(texts[i], []).append(i)
        return cls(
            texts=tuple(texts),
            ends_word=np.array(ends, dtype=np.bool_),
            usable=usable,
            index=WordPrefixIndex([texts[i] for i in kept], kept),
            by_text={t: tuple(ids) for t, ids in by_text.items()},
            usable_ids=np.array(kept, dtype=np.int64),
            starting_ids=np.array([i for i in kept if texts[i]], dtype=np.int64),
        )

    @classmethod
    def for_bpe(cls, vocab: Vocabulary) -> PieceVocabulary:
        """A BPE vocabulary: `x</w>` adds x and ends the word."""
        ends = [w.endswith(END_OF_WORD) for w in vocab.words]
        texts = [w.removesuffix(END_OF_WORD) for w in vocab.words]
        return cls.build(vocab, texts, ends)

    @classmethod
    def for_characters(cls, vocab: Vocabulary) -> PieceVocabulary:
        """A character vocabulary: the space token ends the word and adds nothing."""
        ends = [w == SPACE for w in vocab.words]
        texts = ["" if w == SPACE else w for w in vocab.words]
        return cls.build(vocab, texts, ends)

    def __len__(self) -> int:
        return len(self.texts)
