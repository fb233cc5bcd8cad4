"""Training data for recurrent LMs: a vocabulary, sentences as ids, and padded batches.

Every sentence is scored on its own, from the initial state, as the server scores a text: the
input is `<s> w1 .. wn` and the target `w1 .. wn </s>`, so `</s>` is predicted and counted (the
n-gram convention). Batches group sentences of similar length to keep padding small.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

SPECIALS = ("<unk>", "<s>", "</s>")
UNK_ID, BOS_ID, EOS_ID = 0, 1, 2
IGNORE_INDEX = -100


def build_word_vocab(
    sentences: Sequence[Sequence[str]], *, min_count: int = 1, max_size: int | None = None
) -> list[str]:
    """Specials first, then words by falling frequency (ties alphabetical); the rest is `<unk>`."""
    counts = Counter(w for s in sentences for w in s)
    for special in SPECIALS:
        counts.pop(special, None)
    words = sorted((w for w, c in counts.items() if c >= min_count), key=lambda w: (-counts[w], w))
    if max_size is not None:
        words = words[: max(0, max_size - len(SPECIALS))]
    return [*SPECIALS, *words]


def encode_sentences(sentences: Sequence[Sequence[str]], index: dict[str, int]) -> list[np.ndarray]:
    """Each sentence as an int64 id array (no specials); unknown words become `<unk>`."""
    return [np.array([index.get(w, UNK_ID) for w in s], dtype=np.int64) for s in sentences]


@dataclass(frozen=True)
class Batch:
    """inputs `<s> w..` and targets `w.. </s>`, [batch, time]; padded targets are ignored."""

    inputs: torch.Tensor
    targets: torch.Tensor

    @property
    def tokens(self) -> int:
        return int((self.targets != IGNORE_INDEX).sum())


def make_batch(sentences: Sequence[np.ndarray]) -> Batch:
    width = max(len(s) for s in sentences) + 1
    inputs = np.full((len(sentences), width), EOS_ID, dtype=np.int64)
    targets = np.full((len(sentences), width), IGNORE_INDEX, dtype=np.int64)
    for row, ids in enumerate(sentences):
        n = len(ids)
        inputs[row, 0] = BOS_ID
        inputs[row, 1 : n + 1] = ids
        targets[row, :n] = ids
        targets[row, n] = EOS_ID
    return Batch(torch.from_numpy(inputs), torch.from_numpy(targets))


def length_bucketed_batches(
    sentences: Sequence[np.ndarray], batch_size: int, rng: np.random.Generator | None
) -> Iterator[Batch]:
    """Batches of similar-length sentences; with `rng`, in a shuffled order (training)."""
    order = np.argsort([len(s) for s in sentences], kind="stable")
    groups = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    if rng is not None:
        rng.shuffle(groups)
    for group in groups:
        yield make_batch([sentences[i] for i in group])
