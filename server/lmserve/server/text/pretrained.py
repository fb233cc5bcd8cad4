"""A checkpoint's own Hugging Face `tokenizer.json`, taken as it is (byte-level BPE like GPT-2's,
SentencePiece-style BPE like Llama's): the codec of models brought from Hugging Face.

Texts are encoded whole, exactly as transformers would (no special tokens added: the backend
reads `<s>` first itself), so a score equals the checkpoint's own. Words are what whitespace
separates: `count_words` gives per-word perplexity that compares with every other tokenizer,
and completion searches over pieces, a word ending where the next piece starts with a space.

A model may score more tokens than its tokenizer has (an output padded to a round size): the
extra ids get placeholder names, are never produced by encoding, and are banned from sampling
only by their tiny probability, as in transformers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from lmserve.server.text.pieces import PieceVocabulary
from lmserve.server.text.vocab import EncodedBatch, Vocabulary

PLACEHOLDER = "<|lmserve-unused-{}|>"


class PretrainedCodec:
    """Texts <-> the ids of a `tokenizer.json` (see the module doc).

    `bos`, `eos`, `unk` name the tokens the model uses (GPT-2: one token for all three).
    """

    kind = "huggingface"
    tokens_are_words = False

    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        bos: str,
        eos: str,
        unk: str | None = None,
        vocab_size: int | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        by_id = {i: t for t, i in tokenizer.get_vocab(with_added_tokens=True).items()}
        # Ids from here on are the model's padding: no text (decoding drops them).
        self.tokenizer_size = len(by_id)
        size = max(vocab_size or 0, len(by_id))
        if sorted(by_id) != list(range(len(by_id))):
            raise ValueError("tokenizer.json ids are not dense 0..n-1")
        words = [by_id.get(i, PLACEHOLDER.format(i)) for i in range(size)]
        self.vocab = Vocabulary.from_words(words, unk=unk or eos, bos=bos, eos=eos)
        v = self.vocab
        # Byte-level tokenizers have no unknown token: nothing they encode is out of vocabulary.
        self._flags_oov = unk is not None and v.unk_id not in (v.bos_id, v.eos_id)
        self._pieces: PieceVocabulary | None = None

    @classmethod
    def from_file(
        cls, path: Path, *, bos: str, eos: str, unk: str | None, vocab_size: int | None = None
    ) -> PretrainedCodec:
        return cls(Tokenizer.from_file(str(path)), bos=bos, eos=eos, unk=unk, vocab_size=vocab_size)

    def count_words(self, text: str) -> int:
        return len(text.split())

    def split_batch(self, texts: Sequence[str]) -> list[list[str]]:
        return [text.split() for text in texts]

    def encode_texts(self, texts: Sequence[str]) -> EncodedBatch:
        """Each text, whole -> its ids (no special tokens added)."""
        encodings = self.tokenizer.encode_batch(list(texts), add_special_tokens=False)
        offsets = np.zeros(len(texts) + 1, dtype=np.int64)
        np.cumsum([len(e.ids) for e in encodings], out=offsets[1:])
        ids = np.fromiter(
            (i for e in encodings for i in e.ids), dtype=np.int32, count=int(offsets[-1])
        )
        oov = ids == self.vocab.unk_id if self._flags_oov else np.zeros(len(ids), dtype=np.bool_)
        return EncodedBatch(ids=ids, offsets=offsets, oov=oov)

    def encode_token_lists(self, token_lists: Sequence[Sequence[str]]) -> EncodedBatch:
        """Words joined by single spaces, then encoded as a text."""
        return self.encode_texts([" ".join(words) for words in token_lists])

    def decode(self, ids: Iterable[int]) -> str:
        v = self.vocab
        size = self.tokenizer_size
        kept = [i for i in ids if i not in (v.bos_id, v.eos_id) and i < size]
        return str(self.tokenizer.decode(kept, skip_special_tokens=False))

    def word_separator_id(self) -> int | None:
        return None

    def piece_vocabulary(self) -> PieceVocabulary | None:
        """Each piece's text as decoded alone; a piece that starts with a space starts a word."""
        if self._pieces is None:
            texts = [
                self.decode([i]) if i < self.tokenizer_size else "" for i in range(len(self.vocab))
            ]
            self._pieces = PieceVocabulary.for_leading_space(self.vocab, texts)
        return self._pieces

    def piece_decoder(self) -> Callable[[Sequence[int]], str] | None:
        return self.decode

    def token_names(self, text: str, ids: Sequence[int]) -> list[str]:
        names = self.vocab.words
        return [names[i] for i in ids]
