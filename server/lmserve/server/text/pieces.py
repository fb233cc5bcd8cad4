"""What each token of a subword vocabulary adds to a word, and which tokens end one.

Completing a word with a character or BPE model means searching over token sequences; the
search needs, per token, the text it adds to the word being spelled and whether it closes the
word. The two subword vocabularies mark word ends differently:

- BPE (`text/bpe.py`): a word's last piece carries the suffix `</w>`, so `the</w>` adds "the"
  and ends the word, while `the` adds "the" and does not.
- characters (`text/char.py`): the space token ends the word (it adds nothing to it); every
  other character adds itself.
- a leading space (a Hugging Face byte-level or SentencePiece tokenizer, `text/pretrained.py`):
  ` the` starts a word, `the` continues one, and a word ends where the next piece starts with
  whitespace (or the text ends). No piece ends a word itself, so the search sees one more,
  virtual piece, `boundary_id`, whose log-probability is that of every piece that closes the
  word (`word_view`); the first piece of a word must open one (or, at the start of a text,
  must not: a text's first word has no space before it).
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
    # The leading-space convention only (None otherwise), per real token id: it opens a word
    # (one whitespace, then text), continues one (text without whitespace), closes the word
    # before it (starts with whitespace, or is `</s>`).
    opens: npt.NDArray[np.bool_] | None = None
    continues: npt.NDArray[np.bool_] | None = None
    closes: npt.NDArray[np.bool_] | None = None

    @classmethod
    def build(
        cls,
        vocab: Vocabulary,
        texts: list[str],
        ends: list[bool],
        *,
        opens: npt.NDArray[np.bool_] | None = None,
        continues: npt.NDArray[np.bool_] | None = None,
        closes: npt.NDArray[np.bool_] | None = None,
    ) -> PieceVocabulary:
        specials = {vocab.bos_id, vocab.eos_id, vocab.unk_id, vocab.pad_id}
        usable = np.array([i not in specials for i in range(len(texts))], dtype=np.bool_)
        kept = [i for i in range(len(texts)) if usable[i]]
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
            opens=opens,
            continues=continues,
            closes=closes,
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

    @classmethod
    def for_leading_space(cls, vocab: Vocabulary, decoded: list[str]) -> PieceVocabulary:
        """A vocabulary whose pieces carry the space before a word (`decoded`: each token's
        text on its own); the extra last entry is the virtual word boundary."""
        specials = {vocab.bos_id, vocab.eos_id, vocab.unk_id, vocab.pad_id}
        opens = np.array(
            [len(t) > 1 and t[0].isspace() and not any(c.isspace() for c in t[1:]) for t in decoded]
        )
        continues = np.array([bool(t) and not any(c.isspace() for c in t) for t in decoded])
        closes = np.array([t[:1].isspace() for t in decoded])
        closes[vocab.eos_id] = True
        for i in specials - {-1}:
            opens[i] = continues[i] = False
        texts = [t[1:] if o else t for t, o in zip(decoded, opens, strict=True)] + [""]
        ends = [False] * len(decoded) + [True]
        return cls.build(vocab, texts, ends, opens=opens, continues=continues, closes=closes)

    @property
    def boundary_id(self) -> int:
        """The virtual piece that ends a word (leading-space vocabularies only)."""
        return len(self.texts) - 1

    def word_view(
        self, log_probs: npt.NDArray[np.floating], *, first: bool, text_start: bool
    ) -> npt.NDArray[np.float64]:
        """A leading-space model's next-token log-probs as the search reads them: the pieces
        that may come next in a word (see the module doc) and the boundary's log-probability,
        log of the summed probability of every piece that closes the word."""
        assert self.opens is not None and self.continues is not None and self.closes is not None
        lp = np.asarray(log_probs, dtype=np.float64)
        out = np.full(len(self.texts), -np.inf)
        if first:
            allowed = self.continues if text_start else self.opens
        else:
            allowed = self.continues
            closing = lp[self.closes]
            if closing.size:
                top = closing.max()
                if np.isfinite(top):
                    out[-1] = top + np.log(np.exp(closing - top).sum())
        out[:-1][allowed] = lp[allowed]
        return out

    def __len__(self) -> int:
        return len(self.texts)
