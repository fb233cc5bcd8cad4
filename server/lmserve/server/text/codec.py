"""What scoring needs of a model's tokenization, whatever its kind: texts -> ids, words counted.

    codec: TextCodec = WordCodec(WordTokenizer(), vocab)     # or CharCodec, BpeCodec
    batch = codec.encode_texts(["in the beginning"])
    codec.count_words("in the beginning")                    # 3, whatever the tokens are

Every codec splits text into words with the model's `WordTokenizer` first; a word model's
tokens are those words, a character or BPE model's tokens are pieces of them. `count_words`
gives the words behind a text, so that perplexity can be reported per word for every kind.

What differs by tokenizer kind is asked of the codec, never decided by its class elsewhere:
`tokens_are_words`, `word_separator_id`, `piece_vocabulary` (completing a word from pieces),
`piece_decoder` (tokens whose vocabulary entries are not their text) and `token_names`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from lmserve.server.text.pieces import PieceVocabulary
from lmserve.server.text.vocab import EncodedBatch, Vocabulary
from lmserve.server.text.word import TextEncoder, WordTokenizer


class TextCodec(Protocol):
    """Texts (or already split words) -> token ids of one model's vocabulary."""

    vocab: Vocabulary

    @property
    def tokens_are_words(self) -> bool:
        """True when each token is one word as the word tokenizer splits it (a word model)."""
        ...

    def encode_texts(self, texts: Sequence[str]) -> EncodedBatch:
        """Each text -> its token ids (`<s>`/`</s>` not added; unknown tokens flagged OOV)."""
        ...

    def encode_token_lists(self, token_lists: Sequence[Sequence[str]]) -> EncodedBatch:
        """Each list of words, taken as they are -> its token ids."""
        ...

    def count_words(self, text: str) -> int:
        """The words of `text` as the model's word tokenizer splits it."""
        ...

    def split_batch(self, texts: Sequence[str]) -> list[list[str]]:
        """The words of each text as the model's word tokenizer splits them (a word model's
        tokens; what a character or BPE model's tokens spell)."""
        ...

    def word_separator_id(self) -> int | None:
        """The token between two words when a word's own tokens do not end it (a character
        model's space), else None: a word is one token, a BPE word ends with its `x</w>`."""
        ...

    def piece_vocabulary(self) -> PieceVocabulary | None:
        """What each token adds to a word being spelled and which tokens end one, for models
        whose tokens are pieces of words (characters, BPE); None for a word model."""
        ...

    def piece_decoder(self) -> Callable[[Sequence[int]], str] | None:
        """The codec's `decode` when a token's vocabulary entry is not the text it adds (BPE
        pieces with their `</w>` mark); None when every entry is its own text (words,
        characters)."""
        ...

    def token_names(self, text: str, ids: Sequence[int]) -> list[str]:
        """The tokens of `text` (encoded as `ids`) as a client keeps them: a word model's words
        as the tokenizer writes them (an unknown word stays itself), else the vocabulary's
        entries."""
        ...


class WordCodec(TextEncoder):
    """The word-level codec: one token per word (a `TextEncoder` that also counts words).

    >>> codec = WordCodec(WordTokenizer(), Vocabulary.from_words(["<unk>", "<s>", "</s>", "a"]))
    >>> codec.encode_texts(["a b"]).ids.tolist(), codec.count_words("a b")
    ([3, 0], 2)
    """

    kind = "word"
    tokens_are_words = True

    def count_words(self, text: str) -> int:
        return len(self.tokenizer.split(text))

    def word_separator_id(self) -> int | None:
        return None

    def split_batch(self, texts: Sequence[str]) -> list[list[str]]:
        """The words of each text: for this codec, also its tokens."""
        return self.tokenizer.split_batch(texts)

    def piece_vocabulary(self) -> PieceVocabulary | None:
        return None  # a word is one token: completions come from the vocabulary's words

    def piece_decoder(self) -> Callable[[Sequence[int]], str] | None:
        return None  # each entry is its word

    def token_names(self, text: str, ids: Sequence[int]) -> list[str]:
        words = self.tokenizer.split(text)
        if len(words) == len(ids):
            return words
        names = self.vocab.words
        return [names[i] for i in ids]


__all__ = ["TextCodec", "WordCodec", "WordTokenizer"]
