"""Byte-pair-encoding tokenization with Hugging Face `tokenizers`, trained by `lmserve train-rnn`.

The text is first split into words exactly as the word tokenizer does (KenLM's ASCII whitespace,
or the model's lowercase/pattern); each word is then cut into subwords, its last subword carrying
the end-of-word suffix `</w>` (Sennrich et al., 2016), so decoding restores the words joined by
single spaces. The whole tokenizer (model, merges, a `WhitespaceSplit` pre-tokenizer and the
matching decoder) is saved as `tokenizer.json` in the model folder and loaded from it for serving.

`Whitespace` (which also splits punctuation off words) is not used: decoding could not tell
"earth ." from "earth." and the word count would no longer match the word tokenizer's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from lmserve.server.text.pieces import END_OF_WORD, PieceVocabulary
from lmserve.server.text.vocab import EncodedBatch, Vocabulary
from lmserve.server.text.word import WordTokenizer

SPECIALS = ("<unk>", "<s>", "</s>")


def _vocabulary(tokenizer: Tokenizer) -> Vocabulary:
    """The ids of tokenizer.json as a dense `Vocabulary` (specials at 0, 1, 2)."""
    by_id = {i: t for t, i in tokenizer.get_vocab(with_added_tokens=True).items()}
    if sorted(by_id) != list(range(len(by_id))):
        raise ValueError("tokenizer.json ids are not dense 0..n-1")
    words = [by_id[i] for i in range(len(by_id))]
    if tuple(words[: len(SPECIALS)]) != SPECIALS:
        raise ValueError(f"tokenizer.json must start with {SPECIALS}, has {words[:3]}")
    return Vocabulary.from_words(words)


class BpeCodec:
    """Texts <-> subword ids.

    >>> codec = BpeCodec.train(["in the beginning god created the heaven"] * 5, vocab_size=40)
    >>> codec.decode(codec.encode_texts(["in  the beginning"]).ids.tolist())
    'in the beginning'
    """

    kind = "bpe"
    tokens_are_words = False

    def __init__(
        self, tokenizer: Tokenizer, *, lowercase: bool = False, pattern: str | None = None
    ) -> None:
        self.tokenizer = tokenizer
        self.words = WordTokenizer(lowercase=lowercase, pattern=pattern)
        self.vocab = _vocabulary(tokenizer)

    @classmethod
    def train(
        cls,
        texts: Iterable[str],
        *,
        vocab_size: int,
        min_frequency: int = 2,
        lowercase: bool = False,
        pattern: str | None = None,
    ) -> BpeCodec:
        tokenizer = Tokenizer(models.BPE(unk_token="<unk>", end_of_word_suffix=END_OF_WORD))
        # Kept in tokenizer.json so that the file also works on its own; the words fed to it
        # here are already lowercased and split, which these steps leave unchanged.
        if lowercase:
            tokenizer.normalizer = normalizers.Lowercase()
        tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        tokenizer.decoder = decoders.BPEDecoder(suffix=END_OF_WORD)
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            special_tokens=list(SPECIALS),
            end_of_word_suffix=END_OF_WORD,
            show_progress=False,
        )
        splitter = WordTokenizer(lowercase=lowercase, pattern=pattern)
        tokenizer.train_from_iterator((" ".join(splitter.split(t)) for t in texts), trainer)
        return cls(tokenizer, lowercase=lowercase, pattern=pattern)

    @classmethod
    def from_file(
        cls, path: Path, *, lowercase: bool = False, pattern: str | None = None
    ) -> BpeCodec:
        return cls(Tokenizer.from_file(str(path)), lowercase=lowercase, pattern=pattern)

    @classmethod
    def from_json(
        cls, text: str, *, lowercase: bool = False, pattern: str | None = None
    ) -> BpeCodec:
        return cls(Tokenizer.from_str(text), lowercase=lowercase, pattern=pattern)

    def to_json(self) -> str:
        return str(self.tokenizer.to_str())

    def save(self, path: Path) -> None:
        path.write_text(self.to_json(), encoding="utf-8")

    def count_words(self, text: str) -> int:
        """Words as the word tokenizer counts them (per-word perplexity adds one `</s>` a line)."""
        return len(self.words.split(text))

    def split_batch(self, texts: Sequence[str]) -> list[list[str]]:
        """The words of each text (what its pieces spell)."""
        return self.words.split_batch(texts)

    def word_separator_id(self) -> int | None:
        return None  # a word's last piece (`x</w>`) ends it

    def piece_vocabulary(self) -> PieceVocabulary | None:
        """`x</w>` adds x and ends the word; `x` adds x and does not."""
        return PieceVocabulary.for_bpe(self.vocab)

    def piece_decoder(self) -> Callable[[Sequence[int]], str] | None:
        """`decode`: a piece's entry carries the `</w>` mark, not the text it adds."""
        return self.decode

    def token_names(self, text: str, ids: Sequence[int]) -> list[str]:
        """The pieces as the vocabulary writes them (`x</w>` included: the client sends them
        back as tokens)."""
        names = self.vocab.words
        return [names[i] for i in ids]

    def encode_texts(self, texts: Sequence[str]) -> EncodedBatch:
        """Splits into words, then words into subword ids (`<s>`/`</s>` not added)."""
        return self.encode_token_lists(self.split_batch(texts))

    def encode_token_lists(self, token_lists: Sequence[Sequence[str]]) -> EncodedBatch:
        """Already split words (taken as they are) -> subword ids; unknown characters -> `<unk>`."""
        offsets = np.zeros(len(token_lists) + 1, dtype=np.int64)
        # An empty text is an empty pre-tokenized input, which `tokenizers` handles as such.
        encodings = self.tokenizer.encode_batch(
            [list(words) for words in token_lists], is_pretokenized=True, add_special_tokens=False
        )
        np.cumsum([len(e.ids) for e in encodings], out=offsets[1:])
        ids = np.fromiter(
            (i for e in encodings for i in e.ids), dtype=np.int32, count=int(offsets[-1])
        )
        return EncodedBatch(ids=ids, offsets=offsets, oov=ids == self.vocab.unk_id)

    def decode(self, ids: Iterable[int]) -> str:
        """Ids -> words joined by single spaces; `<s>`/`</s>` dropped, unknown pieces as `<unk>`."""
        v = self.vocab
        kept = [i for i in ids if i != v.bos_id and i != v.eos_id]
        return str(self.tokenizer.decode(kept, skip_special_tokens=False))
