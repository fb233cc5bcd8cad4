"""What an n-gram model counts: words, characters or BPE pieces of each line, and its words.

    tokens = CorpusTokenizer.word(lowercase=True, pattern=r"[a-z]+")     # or .char(...), .bpe(...)
    sentences = tokens.read(path)          # one token list per line
    tokens.count_words(path)               # words (+ one `</s>` a line) behind those tokens

A word model's vocabulary is chosen from its counts (`vocab.select_vocabulary`); a character or
BPE model's vocabulary is its codec's, in the codec's id order (`<unk>`, `<s>`, `</s>` first, as
`vocab.SPECIAL`), so that the ARPA's unigram order gives the server's ids exactly the codec's.
In the ARPA file those tokens are written escaped (`text.char.escape_token`: a space is `\\s`),
since ARPA separates words by whitespace. Every kind splits the text into words with the same
`WordTokenizer` first, so per-word perplexities compare between kinds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from lmserve.export.ngram.vocab import SPECIAL
from lmserve.server.manifest import TokenizerKind
from lmserve.server.text.bpe import BpeCodec
from lmserve.server.text.char import CharCodec, escape_token
from lmserve.server.text.word import WordTokenizer

KINDS = {"word": TokenizerKind.WORD, "char": TokenizerKind.CHARACTER, "bpe": TokenizerKind.BPE}


def read_lines(path: Path) -> list[str]:
    """One sentence per line, as KenLM reads text (a line with no words is still a sentence)."""
    return path.read_text(encoding="utf-8").splitlines()


@dataclass(frozen=True)
class CorpusTokenizer:
    """The word splitter, and for character/BPE models the codec that cuts words into tokens."""

    words: WordTokenizer
    codec: CharCodec | BpeCodec | None = None

    @property
    def kind(self) -> TokenizerKind:
        if self.codec is None:
            return TokenizerKind.WORD
        return TokenizerKind.CHARACTER if isinstance(self.codec, CharCodec) else TokenizerKind.BPE

    def split(self, lines: Sequence[str]) -> list[list[str]]:
        """Each line's tokens: its words, or the codec's tokens (characters, BPE pieces)."""
        if self.codec is None:
            return self.words.split_batch(lines)
        batch = self.codec.encode_texts(lines)
        names = self.codec.vocab.words
        ids, offsets = batch.ids.tolist(), batch.offsets.tolist()
        return [[names[i] for i in ids[a:b]] for a, b in zip(offsets, offsets[1:], strict=False)]

    def read(self, path: Path) -> list[list[str]]:
        return self.split(read_lines(path))

    def count_words(self, lines: Sequence[str]) -> int:
        """Words behind the lines' tokens, plus one `</s>` per line (the per-word convention)."""
        return sum(len(w) for w in self.words.split_batch(lines)) + len(lines)

    def vocabulary(self) -> list[str] | None:
        """The codec's tokens in id order (None for word models: chosen from the counts)."""
        if self.codec is None:
            return None
        tokens = list(self.codec.vocab.words)
        if tuple(tokens[: len(SPECIAL)]) != SPECIAL:
            raise ValueError(f"the tokenizer's first tokens must be {SPECIAL}, not {tokens[:3]}")
        return tokens

    def arpa_names(self, vocabulary: Sequence[str]) -> list[str]:
        """The vocabulary as ARPA words: as they are for words, escaped for characters/pieces."""
        if self.codec is None:
            return list(vocabulary)
        return [escape_token(t) for t in vocabulary]


def make_tokenizer(
    kind: str,
    train_lines: Sequence[str],
    *,
    lowercase: bool = False,
    pattern: str | None = None,
    min_count: int = 1,
    top_n: int | None = None,
    bpe_vocab_size: int = 8000,
    bpe_model: Path | None = None,
) -> CorpusTokenizer:
    """The tokenizer `train-ngram --tokenizer KIND` asks for, trained on `train_lines` where it
    needs training (characters; BPE without `bpe_model`, the file a neural model also uses)."""
    words = WordTokenizer(lowercase=lowercase, pattern=pattern)
    if kind == "word":
        return CorpusTokenizer(words)
    if kind == "char":
        max_size = top_n + len(SPECIAL) if top_n is not None else None
        codec: CharCodec | BpeCodec = CharCodec.train(
            train_lines,
            lowercase=lowercase,
            pattern=pattern,
            min_count=min_count,
            max_size=max_size,
        )
        return CorpusTokenizer(words, codec)
    if kind != "bpe":
        raise ValueError(f"unknown tokenizer {kind!r}; choose one of {', '.join(KINDS)}")
    if bpe_model is not None:
        codec = BpeCodec.from_file(bpe_model, lowercase=lowercase, pattern=pattern)
    else:
        codec = BpeCodec.train(
            train_lines,
            vocab_size=bpe_vocab_size,
            min_frequency=min_count,
            lowercase=lowercase,
            pattern=pattern,
        )
    return CorpusTokenizer(words, codec)
