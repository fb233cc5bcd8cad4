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
from lmserve.server.text.codec import TextCodec

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


def detokenizer_factory(codec: TextCodec, vocab: Vocabulary) -> Callable[[], Detokenizer]:
    """A maker of fresh detokenizers for a model's codec, by what the codec says of its tokens:
    decoded (BPE, by its `piece_decoder`), words, or characters.

    The choice stays here, not on the codec: the detokenizers belong to this layer, which the
    text layer may not import."""
    decode = codec.piece_decoder()
    if decode is not None:
        return lambda: DecodeDetokenizer(decode, vocab)
    if codec.tokens_are_words:
        return lambda: WordDetokenizer(vocab)
    return lambda: CharDetokenizer(vocab)


def detokenize(detokenizer: Detokenizer, ids: Sequence[int]) -> str:
    """The whole text of a finished sequence of ids."""
    return "".join(detokenizer.add(int(i)) for i in ids) + detokenizer.flush()


def piece_texts(codec: TextCodec, vocab: Vocabulary, ids: Sequence[int]) -> list[str] | None:
    """The text each token of a scored sequence adds (spacing included, `</s>` as itself), so
    that clients never see raw pieces and the pieces join into the decoded text; None when the
    vocabulary entries are already text (words, characters)."""
    decode = codec.piece_decoder()
    if decode is None:
        return None
    detokenizer = DecodeDetokenizer(decode, vocab)
    texts = [
        vocab.words[i] if i in (vocab.bos_id, vocab.eos_id) else detokenizer.add(i)
        for i in (int(t) for t in ids)
    ]
    held = detokenizer.flush()  # an incomplete character's bytes: the last real token's
    if held:
        last = max((k for k, i in enumerate(ids) if int(i) != vocab.eos_id), default=None)
        if last is not None:
            texts[last] += held
    return texts


def token_texts(codec: TextCodec, vocab: Vocabulary) -> list[str]:
    """Each vocabulary entry as text on its own (a BPE piece decoded, its end-of-word mark
    gone; specials as themselves): what alternatives and hypothesis tokens show."""
    decode = codec.piece_decoder()
    words = list(vocab.words)
    if decode is None:
        return words
    specials = {vocab.bos_id, vocab.eos_id, vocab.unk_id}
    return [w if i in specials else decode([i]) for i, w in enumerate(words)]
