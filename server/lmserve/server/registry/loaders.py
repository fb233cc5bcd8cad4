"""Turns a validated manifest into a loaded backend, by the manifest's kind and format.

    codec = read_subword_codec(folder, manifest)        # character/BPE models, else None
    backend = load_backend(folder, manifest, LoadContext(onnx=OnnxOptions()),
                           vocab=codec.vocab if codec else None)

Heavy runtimes (onnxruntime, torch) are imported by the loader that needs them, so a deployment
installs only what its models use. Interpolated models find their components, loaded before
them, in `LoadContext.loaded`. A character or BPE model's tokens are backslash-escaped in
`vocab.txt` (see text/char.py): its vocabulary comes from the codec, and `vocab.txt` must list
exactly the codec's tokens, escaped. An n-gram model over characters or BPE pieces (trained by
`lmserve train-ngram --tokenizer char|bpe`) writes its tokens escaped the same way in the ARPA
file (a space cannot be an ARPA word), unigrams in the codec's id order: its ARPA words must be
exactly the codec's tokens, escaped, which then replace them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmserve.server.backends.base import LanguageModelBackend, Vocabulary
from lmserve.server.backends.onnx import OnnxOptions
from lmserve.server.errors import ModelLoadError
from lmserve.server.manifest import ModelFormat, ModelKind, ModelManifest, TokenizerKind
from lmserve.server.text.bpe import BpeCodec
from lmserve.server.text.char import CharCodec, escape_token, read_vocab_file
from lmserve.server.text.pretrained import PretrainedCodec

# Neural kinds served by the state-in/state-out backends (the feed-forward model's state is its
# window of previous ids).
RECURRENT_KINDS = (ModelKind.RNN, ModelKind.LSTM, ModelKind.GRU, ModelKind.FFNN)


@dataclass(frozen=True)
class LoadedModel:
    """What an interpolated model needs of a component: its backend (None where only its
    vocabulary was read), its manifest and its vocabulary."""

    backend: LanguageModelBackend | None
    manifest: ModelManifest
    vocab: Vocabulary


@dataclass(frozen=True)
class LoadContext:
    """Runtime options from the settings, and the models loaded so far (by name)."""

    onnx: OnnxOptions = field(default_factory=OnnxOptions)
    loaded: Mapping[str, LoadedModel] = field(default_factory=dict)
    # False refuses TorchScript models: loading one runs code from the model file.
    allow_torchscript: bool = True


Loader = Callable[[Path, ModelManifest, LoadContext], LanguageModelBackend]


def _ngram_binary(folder: Path, manifest: ModelManifest, ctx: LoadContext) -> LanguageModelBackend:
    from lmserve.server.backends.ngram import load_model_folder_binary

    # An out-of-date binary falls back to the folder's ARPA copy (with a warning to rebuild).
    return load_model_folder_binary(folder, manifest)


def _ngram_arpa(folder: Path, manifest: ModelManifest, ctx: LoadContext) -> LanguageModelBackend:
    from lmserve.server.backends.ngram import NgramModel

    key = "arpa" if "arpa" in manifest.files else "model"
    return NgramModel.from_arpa(manifest.file_path(folder, key))


def _check_cell(folder: Path, manifest: ModelManifest) -> None:
    cell = manifest.architecture.get("cell", manifest.kind.value)
    if cell != manifest.kind.value:
        raise ModelLoadError(
            str(folder / "model.yaml"),
            f"kind is {manifest.kind.value!r} but architecture.cell is {cell!r}",
        )


def _onnx(folder: Path, manifest: ModelManifest, ctx: LoadContext) -> LanguageModelBackend:
    from lmserve.server.backends.onnx import OnnxBackend

    _check_cell(folder, manifest)
    return OnnxBackend.load(folder, manifest, ctx.onnx)


def _torchscript(folder: Path, manifest: ModelManifest, ctx: LoadContext) -> LanguageModelBackend:
    from lmserve.server.backends.torchscript import TorchScriptBackend

    if not ctx.allow_torchscript:
        raise ModelLoadError(
            str(folder / "model.yaml"),
            "TorchScript models are refused by this server (allow_torchscript is false): "
            "loading one runs code from the model file; export the model to ONNX",
        )
    _check_cell(folder, manifest)
    return TorchScriptBackend.load(folder, manifest, max_chunk_tokens=ctx.onnx.max_chunk_tokens)


def _transformer(folder: Path, manifest: ModelManifest, ctx: LoadContext) -> LanguageModelBackend:
    from lmserve.server.backends.transformer import TransformerBackend

    vocab = transformer_vocabulary(folder, manifest)
    return TransformerBackend.load(folder, manifest, ctx.onnx, vocab)


def transformer_vocabulary(folder: Path, manifest: ModelManifest) -> Vocabulary:
    """A transformer's tokens: its tokenizer.json's (padded to the model's output size), or a
    word model's `vocab.txt`."""
    codec = read_subword_codec(folder, manifest)
    if codec is not None:
        return codec.vocab
    return _vocab_file(folder, manifest, escape=False)


def _vocab_file(folder: Path, manifest: ModelManifest, *, escape: bool) -> Vocabulary:
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


def interpolation_components(folder: Path, manifest: ModelManifest) -> list[tuple[str, float]]:
    """`architecture.components`: [(model name, weight)], weights >= 0 summing to 1."""
    where = str(folder / "model.yaml")
    raw: Any = manifest.architecture.get("components")
    if not isinstance(raw, list) or not raw:
        raise ModelLoadError(where, "architecture.components must list {model, weight} entries")
    try:
        components = [(str(c["model"]), float(c["weight"])) for c in raw]
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelLoadError(where, f"architecture.components: {exc!r}") from exc
    weights = [w for _, w in components]
    if min(weights) < 0 or abs(sum(weights) - 1.0) > 1e-6:
        raise ModelLoadError(where, f"component weights must be >= 0 and sum to 1: {weights}")
    return components


def _interpolated(folder: Path, manifest: ModelManifest, ctx: LoadContext) -> LanguageModelBackend:
    from lmserve.server.backends.interpolated import InterpolatedBackend

    where = str(folder / "model.yaml")
    parts = []
    for name, weight in interpolation_components(folder, manifest):
        component = ctx.loaded.get(name)
        if component is None:
            raise ModelLoadError(where, f"component {name!r} is not a loaded model")
        if component.manifest.tokenizer != manifest.tokenizer:
            raise ModelLoadError(
                where,
                f"component {name!r} has tokenizer {component.manifest.tokenizer.model_dump()}, "
                f"this model {manifest.tokenizer.model_dump()}: components must share it",
            )
        if component.backend is None:
            raise ModelLoadError(where, f"component {name!r} was loaded without its weights")
        parts.append((component.backend, weight))
    return InterpolatedBackend(parts)


LOADERS: dict[tuple[ModelKind, ModelFormat], Loader] = {
    (ModelKind.NGRAM, ModelFormat.NGRAM_BINARY): _ngram_binary,
    (ModelKind.NGRAM, ModelFormat.ARPA): _ngram_arpa,
    **{(kind, ModelFormat.ONNX): _onnx for kind in RECURRENT_KINDS},
    **{(kind, ModelFormat.TORCHSCRIPT): _torchscript for kind in RECURRENT_KINDS},
    (ModelKind.INTERPOLATED, ModelFormat.INTERPOLATION): _interpolated,
    (ModelKind.TRANSFORMER, ModelFormat.ONNX): _transformer,
}


def load_vocabulary(folder: Path, manifest: ModelManifest, ctx: LoadContext) -> Vocabulary:
    """The model's vocabulary without its weights (what a front that tokenizes but does not
    compute needs): a neural model's `vocab.txt`; an n-gram binary's word list (a memory map
    whose tables are never read); an ARPA file's unigrams (ARPA folders hold small models:
    the file is read once and dropped); a mixture's common vocabulary of its components.
    The ids are exactly the ones `load_backend` gives."""
    kind, where = manifest.kind, str(folder / "model.yaml")
    if kind in RECURRENT_KINDS:
        from lmserve.server.backends.recurrent import RecurrentSpec, read_vocab

        spec = RecurrentSpec.from_architecture(manifest.architecture, where)
        return read_vocab(manifest.file_path(folder, "vocab"), spec, manifest.special_tokens)
    if kind is ModelKind.TRANSFORMER:
        return transformer_vocabulary(folder, manifest)
    if kind is ModelKind.NGRAM:
        from lmserve.server.backends.ngram.folder import ngram_vocabulary

        return ngram_vocabulary(folder, manifest)
    if kind is ModelKind.INTERPOLATED:
        from lmserve.server.backends.interpolated import common_vocabulary

        vocabs = []
        for name, _ in interpolation_components(folder, manifest):
            component = ctx.loaded.get(name)
            if component is None:
                raise ModelLoadError(where, f"component {name!r} is not a loaded model")
            vocabs.append(component.vocab)
        return common_vocabulary(vocabs)
    raise ModelLoadError(where, f"kind {kind.value!r} is not supported")


def load_backend(
    folder: Path,
    manifest: ModelManifest,
    context: LoadContext | None = None,
    *,
    vocab: Vocabulary | None = None,
) -> LanguageModelBackend:
    """Loads the model; every failure becomes a `ModelLoadError` naming the file and reason.

    `vocab` (a character or BPE codec's) replaces the tokens the backend read from `vocab.txt`,
    which must be exactly these tokens, escaped.
    """
    loader = LOADERS.get((manifest.kind, manifest.format))
    if loader is None:
        raise ModelLoadError(
            str(folder),
            f"format {manifest.format.value!r} for kind {manifest.kind.value!r} is not supported",
        )
    try:
        backend = loader(folder, manifest, context or LoadContext())
    except ModelLoadError:
        raise
    except Exception as exc:  # the backend's own errors: report them, keep serving the rest
        main_file = next(iter(manifest.files.values()), None)
        where = str(folder / main_file.path) if main_file else str(folder)
        raise ModelLoadError(where, f"cannot be loaded ({type(exc).__name__})", f"{exc}") from exc
    if vocab is not None and manifest.kind is not ModelKind.TRANSFORMER:  # read from its file
        _adopt_vocabulary(backend, vocab, _token_file(folder, manifest))
    return backend


def _token_file(folder: Path, manifest: ModelManifest) -> Path:
    """The file that lists a subword model's tokens: `vocab.txt`, or an n-gram model's ARPA."""
    if manifest.kind is not ModelKind.NGRAM:
        return manifest.file_path(folder, "vocab")
    return manifest.file_path(folder, "arpa" if "arpa" in manifest.files else "model")


def read_subword_codec(
    folder: Path, manifest: ModelManifest
) -> CharCodec | BpeCodec | PretrainedCodec | None:
    """The character or BPE codec of a recurrent or n-gram model, or a transformer's
    `tokenizer.json`, from its files; None for word models and mixtures.

    Character: `vocab.txt`, escaped, with the manifest's special tokens. BPE: the tokenizer file
    (`tokenizer.file`, default key `tokenizer`). Both split words with the manifest's rule.
    """
    spec = manifest.tokenizer
    if spec.kind is TokenizerKind.WORD or manifest.kind is ModelKind.INTERPOLATED:
        return None
    if (spec.kind is TokenizerKind.HUGGINGFACE) != (manifest.kind is ModelKind.TRANSFORMER):
        raise ModelLoadError(
            str(folder / "model.yaml"),
            f"a {spec.kind.value} tokenizer is not served with kind {manifest.kind.value!r} "
            "(transformers take a word or huggingface tokenizer; other kinds word, character "
            "or bpe)",
        )
    if spec.kind is TokenizerKind.HUGGINGFACE:
        return _pretrained_codec(folder, manifest)
    if manifest.kind not in (*RECURRENT_KINDS, ModelKind.NGRAM):
        raise ModelLoadError(
            str(folder / "model.yaml"),
            f"a {spec.kind.value} tokenizer is served with recurrent and n-gram models only, "
            f"not kind {manifest.kind.value!r}",
        )
    if spec.kind is TokenizerKind.CHARACTER:
        vocab = _vocab_file(folder, manifest, escape=True)
        return CharCodec(vocab, lowercase=spec.lowercase, pattern=spec.pattern)
    path = manifest.file_path(folder, spec.file or "tokenizer")
    try:
        return BpeCodec.from_file(path, lowercase=spec.lowercase, pattern=spec.pattern)
    except Exception as exc:  # tokenizers' own errors, or our checks of its vocabulary
        raise ModelLoadError(str(path), f"BPE tokenizer: {type(exc).__name__}", f"{exc}") from exc


def _pretrained_codec(folder: Path, manifest: ModelManifest) -> PretrainedCodec:
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


def _adopt_vocabulary(backend: LanguageModelBackend, vocab: Vocabulary, path: Path) -> None:
    """Gives a recurrent or n-gram backend its codec's tokens after checking its file lists them.

    The backends read `vocab.txt` line by line (or the ARPA's unigrams) as word models need; a
    character or BPE model's entries are those tokens escaped, same ids, so only the strings
    change here.
    """
    from lmserve.server.backends.ngram import NgramModel
    from lmserve.server.backends.recurrent import RecurrentBackend

    if not isinstance(backend, RecurrentBackend | NgramModel):
        raise ModelLoadError(str(path), "only recurrent and n-gram models take a codec's tokens")
    lines = backend.vocab.words
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
    # Not a constructor argument of the backends' load(): same ids, unescaped strings.
    if isinstance(backend, NgramModel):
        backend.rename_tokens(vocab)
    else:
        backend._vocab = vocab
