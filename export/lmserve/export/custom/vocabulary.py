"""A brought model's vocabulary: a token list (or `vocab.txt`), or a `tokenizer.json`.

The model folder stores it the way the server reads every neural model: `vocab.txt` (one token a
line, id = line index; escaped for character and BPE models) and, for BPE, the `tokenizer.json`
itself. The special tokens are the model's own (`<s>`, `</s>`, `<unk>` unless named otherwise).
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from lmserve.export.custom.contract import ContractError
from lmserve.server.manifest import SpecialTokensSpec, TokenizerKind, TokenizerSpec
from lmserve.server.text.char import read_vocab_file, write_vocab_file
from lmserve.server.text.vocab import Vocabulary

VOCAB_FILE = "vocab.txt"
TOKENIZER_FILE = "tokenizer.json"
TokenizerName = Literal["word", "character", "bpe"]


@dataclass(frozen=True)
class BroughtVocabulary:
    """The tokens (id order), how texts become them, and the special tokens."""

    tokens: tuple[str, ...]
    tokenizer: TokenizerSpec
    specials: SpecialTokensSpec
    tokenizer_json: Path | None = None

    @property
    def vocab(self) -> Vocabulary:
        s = self.specials
        return Vocabulary.from_words(self.tokens, unk=s.unk, bos=s.bos, eos=s.eos, pad=s.pad)

    def write(self, folder: Path) -> dict[str, str]:
        """Writes the files into the folder; returns {files key: name} for the manifest."""
        kind = self.tokenizer.kind
        write_vocab_file(folder / VOCAB_FILE, self.tokens, escape=kind is not TokenizerKind.WORD)
        files = {"vocab": VOCAB_FILE}
        if self.tokenizer_json is not None:
            shutil.copyfile(self.tokenizer_json, folder / TOKENIZER_FILE)
            files["tokenizer"] = TOKENIZER_FILE
        return files


def read_vocabulary(
    vocab: Sequence[str] | Path | str,
    *,
    tokenizer: TokenizerName = "word",
    lowercase: bool = False,
    pattern: str | None = None,
    bos: str = "<s>",
    eos: str = "</s>",
    unk: str = "<unk>",
) -> BroughtVocabulary:
    """A list of tokens, a `vocab.txt`-style file (one token a line, as it is), or a
    `tokenizer.json` (BPE as `lmserve train-rnn --tokenizer bpe` writes it, ids dense from 0)."""
    specials = SpecialTokensSpec(bos=bos, eos=eos, unk=unk)
    json_file: Path | None = None
    if isinstance(vocab, str | Path):
        path = Path(vocab)
        if not path.is_file():
            raise ContractError("vocabulary", f"{path}: no such vocabulary file")
        if path.suffix == ".json":
            tokens, json_file, tokenizer = _tokenizer_json(path, lowercase, pattern), path, "bpe"
        else:
            tokens = tuple(read_vocab_file(path, escape=False))
    else:
        tokens = tuple(str(t) for t in vocab)
    if tokenizer == "bpe" and json_file is None:
        raise ContractError("vocabulary", "a BPE model needs its tokenizer.json as the vocabulary")
    if len(set(tokens)) != len(tokens):
        seen: set[str] = set()
        repeated = next(t for t in tokens if t in seen or seen.add(t))  # type: ignore[func-returns-value]
        raise ContractError("vocabulary", f"the vocabulary lists {repeated!r} twice")
    for role, token in (("bos", bos), ("eos", eos), ("unk", unk)):
        if token not in tokens:
            raise ContractError(
                "vocabulary",
                f"the vocabulary has no {token!r} ({role}): add it, or name the model's own "
                f"{role} token ({role}=...)",
            )
    if bos == eos:
        raise ContractError(
            "vocabulary",
            f"bos and eos are both {bos!r}: the server needs distinct start and end tokens",
        )
    spec = TokenizerSpec(
        kind=TokenizerKind(tokenizer),
        lowercase=lowercase,
        pattern=pattern,
        file="tokenizer" if json_file is not None else None,
    )
    return BroughtVocabulary(tokens, spec, specials, json_file)


def _tokenizer_json(path: Path, lowercase: bool, pattern: str | None) -> tuple[str, ...]:
    from lmserve.server.text.bpe import BpeCodec

    try:
        codec = BpeCodec.from_file(path, lowercase=lowercase, pattern=pattern)
    except Exception as exc:  # tokenizers' own errors, or the codec's checks of its ids
        raise ContractError("vocabulary", f"{path}: not a usable tokenizer.json ({exc})") from exc
    return codec.vocab.words
