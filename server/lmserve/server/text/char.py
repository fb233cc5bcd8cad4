"""Character-level tokenization: one token per Unicode character, the space between words included.

A character model reads the same words a word model does: the text is split into words with the
word tokenizer's rule (KenLM's ASCII whitespace, or the model's lowercase/pattern), and the words
are joined by single spaces. So "In  the\tbeginning" is the 16 characters "In the beginning", and
the number of words behind a text (for per-word perplexity) is exactly what the word tokenizer
counts: `count_words(text) == len(words)`, every space being the one between two words.

In `vocab.txt` each line is one token, id = line index. Specials (`<unk>`, `<s>`, `</s>`) are
written as they are; characters are backslash-escaped (`escape_token`) so that a space, a newline
or any non-printable character stays on one visible line: `\\\\` backslash, `\\s` space, `\\n`,
`\\r`, `\\t`, `\\uXXXX` / `\\UXXXXXXXX` for any other character that `str.isprintable()` rejects.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np

from lmserve.server.text.pieces import PieceVocabulary
from lmserve.server.text.vocab import EncodedBatch, Vocabulary
from lmserve.server.text.word import WordTokenizer

SPECIALS = ("<unk>", "<s>", "</s>")
_ESCAPES = {"\\": "\\\\", " ": "\\s", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_UNESCAPES = {"\\": "\\", "s": " ", "n": "\n", "r": "\r", "t": "\t"}


def escape_token(token: str) -> str:
    """One vocabulary entry as it is written on its line of `vocab.txt`."""
    out = []
    for ch in token:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif not ch.isprintable():
            code = ord(ch)
            out.append(f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}")
        else:
            out.append(ch)
    return "".join(out)


def unescape_token(line: str) -> str:
    """Inverse of `escape_token`."""
    out, i = [], 0
    while i < len(line):
        ch = line[i]
        if ch != "\\":
            out.append(ch)
            i += 1
            continue
        code = line[i + 1 : i + 2]
        if code in _UNESCAPES:
            out.append(_UNESCAPES[code])
            i += 2
        elif code in ("u", "U"):
            width = 4 if code == "u" else 8
            out.append(chr(int(line[i + 2 : i + 2 + width], 16)))
            i += 2 + width
        else:
            raise ValueError(f"bad escape {line[i : i + 2]!r} in vocabulary entry {line!r}")
    return "".join(out)


def write_vocab_file(path: Path, words: Sequence[str], *, escape: bool) -> None:
    """One token a line; escaped (character and BPE models) or literal (word models)."""
    lines = [escape_token(w) if escape else w for w in words]
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def read_vocab_file(path: Path, *, escape: bool) -> list[str]:
    # Split on "\n" only: str.splitlines() would also split at \x85 or \u2028 inside a word.
    lines = path.read_text(encoding="utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [unescape_token(line) for line in lines] if escape else lines


def _encode_strings(strings: Sequence[str], vocab: Vocabulary) -> EncodedBatch:
    """Each string's characters -> ids; characters outside the vocabulary become `<unk>` (OOV)."""
    lengths = np.fromiter(map(len, strings), dtype=np.int64, count=len(strings))
    offsets = np.zeros(len(strings) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    get = vocab.index.get
    joined = "".join(strings)
    ids = np.fromiter((get(ch, -1) for ch in joined), dtype=np.int32, count=len(joined))
    oov = ids < 0
    ids[oov] = vocab.unk_id
    return EncodedBatch(ids=ids, offsets=offsets, oov=oov)


class CharCodec:
    """Texts <-> character ids, words joined by single spaces.

    >>> codec = CharCodec.train(["in the beginning"])
    >>> codec.decode(codec.encode_texts(["in  the\\tbeginning"]).ids.tolist())
    'in the beginning'
    >>> codec.count_words("in  the\\tbeginning")
    3
    """

    kind = "character"
    tokens_are_words = False

    def __init__(
        self, vocab: Vocabulary, *, lowercase: bool = False, pattern: str | None = None
    ) -> None:
        self.vocab = vocab
        self.tokenizer = WordTokenizer(lowercase=lowercase, pattern=pattern)

    @classmethod
    def train(
        cls,
        texts: Iterable[str],
        *,
        lowercase: bool = False,
        pattern: str | None = None,
        min_count: int = 1,
        max_size: int | None = None,
    ) -> CharCodec:
        """Specials first, then characters by falling frequency (ties by code point)."""
        from collections import Counter

        tokenizer = WordTokenizer(lowercase=lowercase, pattern=pattern)
        counts: Counter[str] = Counter()
        for text in texts:
            counts.update(" ".join(tokenizer.split(text)))
        chars = sorted(
            (c for c, n in counts.items() if n >= min_count), key=lambda c: (-counts[c], c)
        )
        if max_size is not None:
            chars = chars[: max(0, max_size - len(SPECIALS))]
        return cls(Vocabulary.from_words([*SPECIALS, *chars]), lowercase=lowercase, pattern=pattern)

    @classmethod
    def from_vocab_file(
        cls, path: Path, *, lowercase: bool = False, pattern: str | None = None
    ) -> CharCodec:
        return cls(
            Vocabulary.from_words(read_vocab_file(path, escape=True)),
            lowercase=lowercase,
            pattern=pattern,
        )

    def save_vocab(self, path: Path) -> None:
        write_vocab_file(path, self.vocab.words, escape=True)

    def normalize(self, text: str) -> str:
        """The text the model reads: the word tokenizer's words joined by single spaces."""
        return " ".join(self.tokenizer.split(text))

    def count_words(self, text: str) -> int:
        """Words as the word tokenizer counts them (per-word perplexity adds one `</s>` a line)."""
        return len(self.tokenizer.split(text))

    def split_batch(self, texts: Sequence[str]) -> list[list[str]]:
        """The words of each text (what its characters spell, joined by single spaces)."""
        return self.tokenizer.split_batch(texts)

    def word_separator_id(self) -> int | None:
        """The space: it is dropped at the end of an encoded text, so a caller that appends
        whole words adds it."""
        return self.vocab.index.get(" ")

    def piece_vocabulary(self) -> PieceVocabulary | None:
        """The space ends a word and adds nothing to it; every other character adds itself."""
        return PieceVocabulary.for_characters(self.vocab)

    def piece_decoder(self) -> Callable[[Sequence[int]], str] | None:
        return None  # each entry is its character

    def token_names(self, text: str, ids: Sequence[int]) -> list[str]:
        """The characters as the vocabulary writes them (the text is not needed)."""
        names = self.vocab.words
        return [names[i] for i in ids]

    def encode_texts(self, texts: Sequence[str]) -> EncodedBatch:
        """Normalises each text and maps its characters to ids (`<s>`/`</s>` not added)."""
        return _encode_strings([self.normalize(t) for t in texts], self.vocab)

    def encode_token_lists(self, token_lists: Sequence[Sequence[str]]) -> EncodedBatch:
        """Already split words (taken as they are), joined by single spaces -> character ids."""
        return _encode_strings([" ".join(words) for words in token_lists], self.vocab)

    def decode(self, ids: Iterable[int]) -> str:
        """Ids -> text; `<s>`/`</s>` are dropped, an unknown character shows as `<unk>`."""
        v = self.vocab
        return "".join(v.words[i] for i in ids if i != v.bos_id and i != v.eos_id)
