"""Training data for recurrent LMs: a vocabulary, sentences as ids, and padded batches.

Every sentence is scored on its own, from the initial state, as the server scores a text: the
input is `<s> w1 .. wn` and the target `w1 .. wn </s>`, so `</s>` is predicted and counted (the
n-gram convention). Batches group sentences of similar length to keep padding small.
Word, character and BPE vocabularies all start with `<unk> <s> </s>` (ids 0, 1, 2).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from lmserve.server.backends.base import EncodedBatch, Vocabulary
from lmserve.server.manifest import TokenizerKind, TokenizerSpec

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


class Codec(Protocol):
    """What training needs of a tokenizer: its vocabulary and a batch encoder."""

    @property
    def vocab(self) -> Vocabulary: ...

    def encode_texts(self, texts: Sequence[str]) -> EncodedBatch: ...


def make_codec(
    spec: TokenizerSpec, vocab: Sequence[str], tokenizer_json: str | None = None
) -> Codec:
    """The codec a checkpoint's tokenizer spec, vocabulary (and tokenizer.json) describe."""
    from lmserve.server.text.bpe import BpeCodec
    from lmserve.server.text.char import CharCodec
    from lmserve.server.text.word import TextEncoder, WordTokenizer

    lowercase, pattern = spec.lowercase, spec.pattern
    if spec.kind == TokenizerKind.BPE:
        if tokenizer_json is None:
            raise ValueError("a BPE tokenizer needs its tokenizer.json")
        return BpeCodec.from_json(tokenizer_json, lowercase=lowercase, pattern=pattern)
    if spec.kind == TokenizerKind.CHARACTER:
        return CharCodec(Vocabulary.from_words(vocab), lowercase=lowercase, pattern=pattern)
    tokenizer = WordTokenizer(lowercase=lowercase, pattern=pattern)
    return TextEncoder(tokenizer, Vocabulary.from_words(vocab))


def split_encoded(batch: EncodedBatch) -> list[np.ndarray]:
    """An EncodedBatch as one int64 id array per text (the form training batches take)."""
    ids = batch.ids.astype(np.int64)
    return [ids[a:b] for a, b in zip(batch.offsets[:-1], batch.offsets[1:], strict=True)]


def count_words(texts: Iterable[str], spec: TokenizerSpec) -> int:
    """Words as the word tokenizer counts them, plus one `</s>` per text: the per-word footing
    on which word, character and BPE perplexities compare (natural log)."""
    from lmserve.server.text.word import WordTokenizer

    tokenizer = WordTokenizer(lowercase=spec.lowercase, pattern=spec.pattern)
    return sum(len(tokenizer.split(t)) + 1 for t in texts)
