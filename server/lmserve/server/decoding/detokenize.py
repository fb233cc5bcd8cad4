"""Incremental detokenization: the text each new token adds, per tokenizer kind.

- word: pieces joined by single spaces (the first without one);
- character: pieces concatenated;
- BPE (and any codec with `decode(ids) -> str`): the codec decodes a window of the growing id
  list and only the new, stable suffix is emitted (vLLM's prefix/read offsets): with
  `prefix = decode(ids[p:r])` and `full = decode(ids[p:])`, the token adds `full[len(prefix):]`
  once `full` extends `prefix` and does not end in U+FFFD (an incomplete UTF-8 sequence); then
  p, r = r, len(ids). Decoding from p, a token boundary before the last emitted piece, keeps
  the spacing between words right while each step decodes only a few tokens.

`<s>` and `</s>` add no text. The concatenation of the pieces equals the codec's `decode` of
all ids (for BPE once the text is stable).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal, Protocol

from lmserve.server.backends.base import Vocabulary

CodecKind = Literal["word", "char", "bpe"]


class Detokenizer(Protocol):
    def add(self, token_id: int) -> str:
        """The text this token adds (may be "" while it is held back)."""
        ...

    def flush(self) -> str:
        """Text still held back at the end of the sequence."""
        ...


class WordDetokenizer:
    """Word models: ' ' + word, no space before the first."""

    def __init__(self, vocab: Vocabulary) -> None:
        self.vocab = vocab
        self._started = False

    def add(self, token_id: int) -> str:
        if token_id in (self.vocab.bos_id, self.vocab.eos_id):
            return ""
        word = self.vocab.words[token_id]
        if self._started:
            return " " + word
        self._started = True
        return word

    def flush(self) -> str:
        return ""


class CharDetokenizer:
    """Character models: each token is its own text."""

    def __init__(self, vocab: Vocabulary) -> None:
        self.vocab = vocab

    def add(self, token_id: int) -> str:
        if token_id in (self.vocab.bos_id, self.vocab.eos_id):
            return ""
        return self.vocab.words[token_id]

    def flush(self) -> str:
        return ""


class DecodeDetokenizer:
    """Any codec's `decode`, applied to a sliding window of the ids (see the module doc)."""

    def __init__(self, decode: Callable[[Sequence[int]], str], vocab: Vocabulary) -> None:
        self.decode = decode
        self.vocab = vocab
        self.ids: list[int] = []
        self._prefix = 0  # window start: a token boundary before the last emitted text
        self._read = 0  # ids up to here are emitted

    def add(self, token_id: int) -> str:
        if token_id in (self.vocab.bos_id, self.vocab.eos_id):
            return ""
        self.ids.append(int(token_id))
        return self._advance(final=False)

    def _advance(self, *, final: bool) -> str:
        prefix = self.decode(self.ids[self._prefix : self._read])
        full = self.decode(self.ids[self._prefix :])
        if len(full) > len(prefix) and full.startswith(prefix):
            if full.endswith("\ufffd") and not final:
                return ""  # an incomplete multi-byte character: wait for the rest
            self._prefix, self._read = self._read, len(self.ids)
            return full[len(prefix) :]
        return ""

    def flush(self) -> str:
        return self._advance(final=True) if self._read < len(self.ids) else ""


def make_detokenizer(
    kind: CodecKind, vocab: Vocabulary, decode: Callable[[Sequence[int]], str] | None = None
) -> Detokenizer:
    """The detokenizer for a codec kind; "bpe" needs the codec's `decode`."""
    if kind == "word":
        return WordDetokenizer(vocab)
    if kind == "char":
        return CharDetokenizer(vocab)
    if decode is None:
        raise ValueError(f"a {kind!r} detokenizer needs the codec's decode")
    return DecodeDetokenizer(decode, vocab)


def detokenizer_factory(codec: object, vocab: Vocabulary) -> Callable[[], Detokenizer]:
    """A maker of fresh detokenizers for a model's codec: characters, BPE (by its `decode`), or
    words for everything else."""
    from lmserve.server.text.bpe import BpeCodec
    from lmserve.server.text.char import CharCodec

    if isinstance(codec, CharCodec):
        return lambda: CharDetokenizer(vocab)
    if isinstance(codec, BpeCodec):
        decode = codec.decode
        return lambda: DecodeDetokenizer(decode, vocab)
    return lambda: WordDetokenizer(vocab)


def detokenize(detokenizer: Detokenizer, ids: Sequence[int]) -> str:
    """The whole text of a finished sequence of ids."""
    return "".join(detokenizer.add(int(i)) for i in ids) + detokenizer.flush()
