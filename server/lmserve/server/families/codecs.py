"""How a model's manifest and files become its codec: the readers every family picks from.

A word model's codec splits words over its vocabulary (`word_codec`). A character model's
tokens are backslash-escaped in `vocab.txt` (see text/char.py) and a BPE model's are in its
`tokenizer.json` (`subword_codec`); the backend, which read `vocab.txt` (or an n-gram model's
ARPA unigrams) line by line, must list exactly the codec's tokens, escaped, and takes their
unescaped strings (`check_escaped_tokens`). A transformer's codec is its checkpoint's
`tokenizer.json` as it is (`pretrained_codec`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from lmserve.server.backends.base import Vocabulary
from lmserve.server.errors import ModelLoadError
from lmserve.server.manifest import ModelManifest, TokenizerKind
from lmserve.server.text.bpe import BpeCodec
from lmserve.server.text.char import CharCodec, escape_token, read_vocab_file
from lmserve.server.text.codec import TextCodec, WordCodec
from lmserve.server.text.pretrained import PretrainedCodec
from lmserve.server.text.word import WordTokenizer


def manifest_path(folder: Path) -> str:
    """Where load errors about the manifest's contents point."""
    return str(folder / "model.yaml")


def make_tokenizer(folder: Path, manifest: ModelManifest) -> WordTokenizer:
    """The word splitter the manifest asks for (every codec splits words with it first)."""
    spec = manifest.tokenizer
    try:
        return WordTokenizer(lowercase=spec.lowercase, pattern=spec.pattern)
    except re.error as exc:
        raise ModelLoadError(str(folder), f"tokenizer.pattern {spec.pattern!r}: {exc}") from exc


def word_codec(folder: Path, manifest: ModelManifest, vocab: Vocabulary) -> TextCodec:
    """Words over the model's vocabulary (built once per model: the C word index when the
    tokenizer's rule allows it)."""
    spec = manifest.tokenizer
    if spec.kind is not TokenizerKind.WORD:
        raise ModelLoadError(
            manifest_path(folder),
            f"a {spec.kind.value} tokenizer is not served for {manifest.kind} models",
        )
    return WordCodec(make_tokenizer(folder, manifest), vocab)


def vocab_file(folder: Path, manifest: ModelManifest, *, escape: bool) -> Vocabulary:
    """`vocab.txt` with the manifest's special tokens (a character model's lines escaped)."""
    path = manifest.file_path(folder, "vocab")
    specials = manifest.special_tokens
    what = "character vocabulary" if escape else "vocabulary"
    try:
        return Vocabulary.from_words(
            read_vocab_file(path, escape=escape),
            unk=specials.unk,
            bos=specials.bos,
            eos=specials.eos,
            pad=specials.pad,
        )
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelLoadError(str(path), "unreadable vocabulary", f"{exc}") from exc
    except (KeyError, ValueError) as exc:  # a bad escape, a duplicate, a missing special
        raise ModelLoadError(str(path), f"{what}: {exc}") from exc


def subword_codec(folder: Path, manifest: ModelManifest) -> CharCodec | BpeCodec | None:
    """A character model's codec (escaped `vocab.txt`) or a BPE model's (`tokenizer.file`,
    default key `tokenizer`); None for a word model. Both split words with the manifest's
    rule."""
    spec = manifest.tokenizer
    if spec.kind is TokenizerKind.CHARACTER:
        vocab = vocab_file(folder, manifest, escape=True)
        return CharCodec(vocab, lowercase=spec.lowercase, pattern=spec.pattern)
    if spec.kind is not TokenizerKind.BPE:
        return None
    path = manifest.file_path(folder, spec.file or "tokenizer")
    try:
        return BpeCodec.from_file(path, lowercase=spec.lowercase, pattern=spec.pattern)
    except Exception as exc:  # tokenizers' own errors, or our checks of its vocabulary
        raise ModelLoadError(str(path), f"BPE tokenizer: {type(exc).__name__}", f"{exc}") from exc


def pretrained_codec(folder: Path, manifest: ModelManifest) -> PretrainedCodec:
    """A checkpoint's `tokenizer.json` as it is, with the manifest's special tokens, padded to
    the model's output size (`architecture.vocab_size`)."""
    path = manifest.file_path(folder, manifest.tokenizer.file or "tokenizer")
    specials = manifest.special_tokens
    size = manifest.architecture.get("vocab_size")
    try:
        return PretrainedCodec.from_file(
            path,
            bos=specials.bos,
            eos=specials.eos,
            unk=specials.unk,
            vocab_size=int(size) if isinstance(size, int) else None,
        )
    except Exception as exc:  # tokenizers' own errors, or a special token it lacks
        raise ModelLoadError(
            str(path), f"tokenizer.json: {type(exc).__name__}: {exc}", f"{exc}"
        ) from exc


def check_escaped_tokens(lines: Sequence[str], vocab: Vocabulary, path: Path) -> None:
    """A backend's token lines must be exactly the codec's tokens, escaped, in its id order."""
    if len(lines) != len(vocab):
        raise ModelLoadError(
            str(path), f"has {len(lines)} tokens, the model's tokenizer has {len(vocab)}"
        )
    for i, (line, token) in enumerate(zip(lines, vocab.words, strict=True)):
        if line != escape_token(token):
            raise ModelLoadError(
                str(path),
                f"token {i} is {line!r}, the tokenizer's is {token!r} "
                f"(written {escape_token(token)!r})",
            )
