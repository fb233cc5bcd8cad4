"""A model's vocabulary and texts encoded as its ids: what text and backends both speak.

The text layer produces `EncodedBatch`es over a `Vocabulary`; backends score them. Both types
live here, below the backends, so the text layer never imports a backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

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
    index: dict[str, int]
    unk_id: int
    bos_id: int
    eos_id: int
    pad_id: int = -1

    @classmethod
    def from_words(
        cls,
        words: Sequence[str],
        *,
        unk: str = "<unk>",
        bos: str = "<s>",
        eos: str = "</s>",
        pad: str | None = None,
    ) -> Vocabulary:
        index = {w: i for i, w in enumerate(words)}
        if len(index) != len(words):
            raise ValueError("vocabulary has duplicate words")
        return cls(
            words=tuple(words),
            index=index,
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
    """

    ids: IdArray
    offsets: OffsetArray
    oov: npt.NDArray[np.bool_]
    oov_counts: npt.NDArray[np.int64] | None = None

    @property
    def batch_size(self) -> int:
        return len(self.offsets) - 1
