"""The training corpus read block by block into int32 ids, in memory or on disk.

The whole text is never held as Python strings (a list of token lists costs ~80 bytes a token):
`read_corpus` reads ~1 MB of whole lines at a time, tokenizes them and keeps only their ids,
4 bytes a token, and each sentence's length. A word model's vocabulary is only known at the
end (`min_count`, `top_n`), so words get provisional ids by first occurrence and are counted
as they come; `vocab.choose_words` then picks the model's words exactly as `select_vocabulary`
would from the whole text, and a remap array turns provisional ids into the model's. Once the
ids pass `memory_tokens`, they go to a file in `temp_dir` instead (the remap is then applied
as chunks are read back), so counting can run with bounded memory.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import chain
from pathlib import Path

import numpy as np
import numpy.typing as npt

from lmserve.export.ngram.progress import Progress
from lmserve.export.ngram.spill import RawFile
from lmserve.export.ngram.tokens import CorpusTokenizer
from lmserve.export.ngram.vocab import (
    SPECIAL,
    UNK_ID,
    EncodedCorpus,
    choose_words,
    encode_sentences,
)

Int32Array = npt.NDArray[np.int32]
BLOCK_CHARS = 1 << 20


class TokenStore:
    """Every sentence as `<s> ids.. </s>` (int32), concatenated, and each sentence's length.

    In memory, or in a file (then `remap` turns the stored ids into the model's as they are
    read back)."""

    def __init__(
        self, ids: Int32Array | RawFile, lengths: Int32Array, remap: Int32Array | None = None
    ) -> None:
        self._ids = ids
        self._remap = remap
        self.lengths = lengths
        self.offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=self.offsets[1:])

    @classmethod
    def from_corpus(cls, corpus: EncodedCorpus) -> TokenStore:
        """An encoded corpus (its sentences start where `pos` is 0), in memory."""
        starts = np.flatnonzero(corpus.pos == 0)
        lengths = np.diff(np.append(starts, len(corpus.ids))).astype(np.int32)
        return cls(corpus.ids.astype(np.int32, copy=False), lengths)

    @property
    def in_memory(self) -> bool:
        return not isinstance(self._ids, RawFile)

    @property
    def tokens(self) -> int:
        return int(self.offsets[-1])

    def read(self, first: int, last: int) -> Int32Array:
        """The ids of sentences first..last-1."""
        start, stop = int(self.offsets[first]), int(self.offsets[last])
        if isinstance(self._ids, RawFile):
            ids = self._ids.read(start, stop)
            return ids if self._remap is None else self._remap[ids]
        return self._ids[start:stop]

    def chunks(self, max_tokens: int) -> list[tuple[int, int]]:
        """Sentence ranges of at most `max_tokens` tokens each (a longer sentence alone)."""
        bounds = [0]
        n = len(self.lengths)
        while bounds[-1] < n:
            first = bounds[-1]
            limit = self.offsets[first] + max_tokens
            last = int(np.searchsorted(self.offsets, limit, side="right")) - 1
            bounds.append(min(max(last, first + 1), n))
        return list(zip(bounds[:-1], bounds[1:], strict=True))

    def remove(self) -> None:
        if isinstance(self._ids, RawFile):
            self._ids.remove()


def line_blocks(path: Path, block_chars: int = BLOCK_CHARS) -> Iterator[list[str]]:
    """The file's lines, a block at a time, exactly as `read_text().splitlines()` gives them
    (a block ends just after a newline, where `splitlines` also splits)."""
    with path.open(encoding="utf-8") as f:
        rest = ""
        while text := f.read(block_chars):
            text = rest + text
            cut = text.rfind("\n") + 1
            rest = text[cut:]
            if cut:
                yield text[:cut].splitlines()
        if rest:
            yield rest.splitlines()


class _Vocabulary:
    """Provisional ids by first occurrence, and every word's count so far. The specials come
    first, so the markers `encode_sentences` writes already have their final ids."""

    def __init__(self) -> None:
        self.index: dict[str, int] = {w: i for i, w in enumerate(SPECIAL)}
        self.counts = np.zeros(len(SPECIAL), dtype=np.int64)

    def add(self, sentences: Sequence[Sequence[str]]) -> None:
        index = self.index
        for word in dict.fromkeys(chain.from_iterable(sentences)):  # this block's, in order
            if word not in index:
                index[word] = len(index)

    def count(self, ids: Int32Array) -> None:
        seen = np.bincount(ids, minlength=len(self.index))
        seen[: len(self.counts)] += self.counts
        self.counts = seen

    def remap(self, min_count: int, top_n: int | None) -> tuple[list[str], Int32Array]:
        """The model's words and each provisional id's id among them (`<unk>` if not kept)."""
        counts = dict(zip(self.index, self.counts.tolist(), strict=True))
        words = choose_words(counts, min_count=min_count, top_n=top_n)
        final = {w: i for i, w in enumerate(words)}
        remap = np.full(len(self.index), UNK_ID, dtype=np.int32)
        for word, provisional in self.index.items():
            remap[provisional] = final.get(word, UNK_ID)
        return words, remap


def read_corpus(
    tokens: CorpusTokenizer,
    path: Path,
    *,
    vocabulary: Sequence[str] | None = None,
    min_count: int = 1,
    top_n: int | None = None,
    memory_tokens: int | None = None,
    temp_dir: Path | None = None,
    progress: Progress | None = None,
) -> tuple[list[str], TokenStore]:
    """The model's words and the encoded corpus. A given `vocabulary` (a codec's) is used as
    it is; otherwise words are chosen from the corpus (`min_count`, `top_n`). The ids move to
    `temp_dir` once there are more than `memory_tokens` of them."""
    progress = progress or Progress.silent()
    fixed = {w: i for i, w in enumerate(vocabulary)} if vocabulary is not None else None
    seen = _Vocabulary()
    blocks: list[Int32Array] = []
    lengths: list[Int32Array] = []
    on_disk: RawFile | None = None
    total = 0
    for lines in line_blocks(path):
        sentences = tokens.split(lines)
        if fixed is None:
            seen.add(sentences)
        ids, sizes = encode_sentences(sentences, fixed if fixed is not None else seen.index)
        del sentences
        if fixed is None:
            seen.count(ids)
        else:
            ids[ids < 0] = UNK_ID
        lengths.append(sizes)
        total += len(ids)
        if on_disk is None and memory_tokens is not None and total > memory_tokens:
            if temp_dir is None:
                raise ValueError("the corpus does not fit the memory setting and no temp_dir")
            on_disk = RawFile(temp_dir / "corpus.ids", np.int32)
            progress.note(f"corpus past {memory_tokens:,} tokens: its ids go to {temp_dir}")
            for block in blocks:
                on_disk.append(block)
            blocks = []
        if on_disk is not None:
            on_disk.append(ids)
        else:
            blocks.append(ids)
        progress.update(f"read {total:,} tokens, {len(lengths):,} blocks")
    sentence_lengths = np.concatenate(lengths) if lengths else np.zeros(0, np.int32)
    del lengths
    remap = None
    if vocabulary is not None:
        words = list(vocabulary)
    else:
        words, remap = seen.remap(min_count, top_n)
    progress.note(f"read {total:,} tokens in {len(sentence_lengths):,} sentences, "
                  f"{len(words):,} words in the vocabulary")  # fmt: skip
    if on_disk is not None:
        return words, TokenStore(on_disk, sentence_lengths, remap)
    if remap is not None:
        for i, block in enumerate(blocks):  # one block at a time: no second copy of them all
            blocks[i] = remap[block]
    ids = np.concatenate(blocks) if blocks else np.zeros(0, np.int32)
    del blocks
    return words, TokenStore(ids, sentence_lengths)
