"""What scoring needs of a model's tokenization, whatever its kind: texts -> ids, words counted.

    codec: TextCodec = WordCodec(WordTokenizer(), vocab)     # or CharCodec, BpeCodec
    batch = codec.encode_texts(["in the beginning"])
    codec.count_words("in the beginning")                    # 3, whatever the tokens are

Every codec splits text into words with the model's `WordTokenizer` first; a word model's
tokens are those words, a character or BPE model's tokens are pieces of them. `count_words`
gives the words behind a text, so that perplexity can be reported per word for every kind.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from lmserve.server.text.vocab import EncodedBatch, Vocabulary
from lmserve.server.text.word import TextEncoder, WordTokenizer


class TextCodec(Protocol):
    """Texts (or already split words) -> token ids of one model's vocabulary."""

    vocab: Vocabulary

    def encode_texts(self, texts: Sequence[str]) -> EncodedBatch:
        """Each text -> its token ids (`<s>`/`</s>` not added; unknown tokens flagged OOV)."""
        ...

    def encode_token_lists(self, token_lists: Sequence[Sequence[str]]) -> EncodedBatch:
        """Each list of words, taken as they are -> its token ids."""
        ...

    def count_words(self, text: str) -> int:
        """The words of `text` as the model's word tokenizer splits it."""
        ...

    def word_separator_id(self) -> int | None:
        """The token between two words when a word's own tokens do not end it (a character
        model's space), else None: a word is one token, a BPE word ends with its `x</w>`."""
        ...


class WordCodec(TextEncoder):
    """The word-level codec: one token per word (a `TextEncoder` that also counts words).

    >>> codec = WordCodec(WordTokenizer(), Vocabulary.from_words(["<unk>", "<s>", "</s>", "a"]))
    >>> codec.encode_texts(["a b"]).ids.tolist(), codec.count_words("a b")
    ([3, 0], 2)
    """

    kind = "word"

    def count_words(self, text: str) -> int:
        return len(self.tokenizer.split(text))

    def word_separator_id(self) -> int | None:
        return None

    def split_batch(self, texts: Sequence[str]) -> list[list[str]]:
        """The words of each text: for this codec, also its tokens."""
        return self.tokenizer.split_batch(texts)


__all__ = ["TextCodec", "WordCodec", "WordTokenizer"]
