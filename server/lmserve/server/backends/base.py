"""The contract every language-model backend fulfils, and the batch types that cross it.

Backends know nothing of gRPC or of text: they take vocabulary ids and return natural-log
probabilities. Texts become ids in `lmserve.server.text`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

IdArray = npt.NDArray[np.int32]
OffsetArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


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


@dataclass(frozen=True)
class BatchScores:
    """Scores of an `EncodedBatch`, all natural logs.

    `totals[i]` is the sum of text i's scored tokens (`</s>` included when eos was on).
    `token_log_probs[token_offsets[i]:token_offsets[i+1]]` are text i's per-token scores when
    they were asked for (else None); the extra last entry of each text is `</s>` when eos was on.
    `ngram_lengths` is the matched n-gram length per token (n-gram backends only).
    """

    totals: FloatArray
    token_log_probs: FloatArray | None = None
    token_offsets: OffsetArray | None = None
    ngram_lengths: IdArray | None = None


class LanguageModelBackend(Protocol):
    """A loaded model that keeps no per-request state. Every score is a natural log."""

    @property
    def vocab(self) -> Vocabulary: ...

    def score(
        self, batch: EncodedBatch, *, bos: bool = True, eos: bool = True, per_token: bool = False
    ) -> BatchScores:
        """Scores every text of the batch: log P(tokens [+ </s>] | <s>) in nats."""
        ...

    def next_token_log_probs(self, context: Sequence[int], *, bos: bool = True) -> FloatArray:
        """log P(w | <s> context) in nats for every vocabulary id w (shape [len(vocab)])."""
        ...
