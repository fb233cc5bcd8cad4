"""A model's vocabulary and texts encoded as its ids: what text and backends both speak.

The text layer produces `EncodedBatch`es over a `Vocabulary`; backends score them. Both types
live here, below the backends, so the text layer never imports a backend.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain

import numpy as np
import numpy.typing as npt

IdArray = npt.NDArray[np.int32]
OffsetArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Vocabulary:
    """Words and their ids. Ids are positions in `words`.

    >>> v = Vocabulary.from_words(["<unk>", "<s>", "</s>", "the"])
    >>> v.index["the"], v.unk_id
    (3, 0)
    """

    words: tuple[str, ...]
    unk_id: int
    bos_id: int
    eos_id: int
    pad_id: int = -1

    @functools.cached_property
    def index(self) -> dict[str, int]:
        """Word -> id, built on first use: a large model's load stays a memory map (a 60k-word
        dict alone takes ~5 ms), and the C word encoder has an index of its own."""
        return dict(zip(self.words, range(len(self.words)), strict=True))

    @classmethod
    def from_words(
        cls,
        words: Sequence[str],
        *,
        unk: str = "<unk>",
        bos: str = "<s>",
        eos: str = "</s>",
        pad: str | None = None,
        distinct: bool = False,
    ) -> Vocabulary:
        """`distinct=True`: the caller vouches that no word repeats (an ARPA import has checked
        it), so the index is left to be built when first used."""
        words = tuple(words)
        missing = [w for w in (unk, bos, eos, pad) if w is not None and w not in words]
        if missing:
            raise ValueError(f"the vocabulary lacks {missing[0]!r}")
        if distinct:
            ids = [words.index(w) if w is not None else -1 for w in (unk, bos, eos, pad)]
            return cls(words, *ids)
        vocab = cls(words, -1, -1, -1)
        index = vocab.index
        if len(index) != len(words):
            raise ValueError("vocabulary has duplicate words")
        return cls(
            words,
            unk_id=index[unk],
            bos_id=index[bos],
            eos_id=index[eos],
            pad_id=index[pad] if pad is not None else -1,
        )

    def __len__(self) -> int:
        return len(self.words)


@dataclass(frozen=True)
class EncodedBatch:
    """A batch of texts as vocabulary ids, flattened: text i is ids[offsets[i]:offsets[i+1]].

    `oov` marks tokens that were not in the vocabulary (their id is the unknown-word id).
    `<s>`/`</s>` are not included: the backend adds them as the score options say.
    `oov_counts` are the OOV tokens per text when the encoder counted them on the way (the C
    word encoder does, for free), else None and counted from `oov` when needed.
    `starts`, when set, is the id each text is read from in place of `<s>` (a transformer
    scoring with `bos` off reads a text's first token as its context: `first_as_starts`).
    """

    ids: IdArray
    offsets: OffsetArray
    oov: npt.NDArray[np.bool_]
    oov_counts: npt.NDArray[np.int64] | None = None
    starts: IdArray | None = None

    @property
    def batch_size(self) -> int:
        return len(self.offsets) - 1

    @classmethod
    def of_ids(cls, id_lists: Sequence[Sequence[int]], unk_id: int) -> EncodedBatch:
        """Texts given as ids, taken exactly as they are (the unknown-word id flagged OOV)."""
        lengths = np.fromiter(map(len, id_lists), dtype=np.int64, count=len(id_lists))
        offsets = np.zeros(len(id_lists) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        flat = chain.from_iterable(id_lists)
        ids = np.fromiter(flat, dtype=np.int32, count=int(offsets[-1]))
        return cls(ids=ids, offsets=offsets, oov=ids == unk_id)

    def first_as_starts(self) -> EncodedBatch:
        """Each text's first id taken out as the one it is read from (`starts`): what is left
        are the tokens scored after it. Every text must have a first id."""
        firsts = self.offsets[:-1]
        keep = np.ones(len(self.ids), dtype=np.bool_)
        keep[firsts] = False
        offsets = self.offsets - np.arange(len(self.offsets), dtype=np.int64)
        return EncodedBatch(
            ids=self.ids[keep], offsets=offsets, oov=self.oov[keep], starts=self.ids[firsts]
        )
