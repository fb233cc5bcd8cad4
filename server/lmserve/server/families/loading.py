"""One model folder's manifest to what serves it: backend (or vocabulary alone), codec, family.

    loaded = load_model(folder, manifest, LoadContext(onnx=OnnxOptions()), weights=True)
    loaded.backend, loaded.codec, loaded.family

Each step is asked of the model's family (`catalog.family_of`); the rules every family shares
are here: the tokenizer must be one the family takes, a bad word pattern fails before anything
loads, a backend's own exceptions become a `ModelLoadError` naming the file, and the special
tokens must be the vocabulary's. Heavy runtimes (onnxruntime, torch) are imported by the
backend that needs them, so a deployment installs only what its models use.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lmserve.server.backends.base import LanguageModelBackend, Vocabulary
from lmserve.server.errors import ModelLoadError
from lmserve.server.families.catalog import family_of
from lmserve.server.families.codecs import make_tokenizer, manifest_path
from lmserve.server.families.family import LoadContext, ModelFamily, ServingRules
from lmserve.server.manifest import ModelManifest
from lmserve.server.text.codec import TextCodec


@dataclass(frozen=True)
class LoadedParts:
    """A loaded model: its family, backend (None when loaded without weights), vocabulary,
    codec, whether it computes outside the GIL, and its serving rules."""

    family: ModelFamily
    backend: LanguageModelBackend | None
    vocab: Vocabulary
    codec: TextCodec
    neural: bool
    rules: ServingRules


def load_model(
    folder: Path, manifest: ModelManifest, context: LoadContext, *, weights: bool = True
) -> LoadedParts:
    """Loads the model (or, without `weights`, reads its vocabulary and codec only, and maps
    weights every process shares: `ModelFamily.maps_weights`); every failure is a
    `ModelLoadError` naming the file and the reason."""
    family = family_of(manifest, manifest_path(folder))
    spec = manifest.tokenizer
    if spec.kind not in family.tokenizers:
        taken = ", ".join(sorted(kind.value for kind in family.tokenizers))
        raise ModelLoadError(
            manifest_path(folder),
            f"a {spec.kind.value} tokenizer is not served with kind {manifest.kind!r} "
            f"(the {family.name} family takes {taken})",
        )
    make_tokenizer(folder, manifest)  # a bad pattern fails before anything loads
    read = family.read_codec(folder, manifest)
    # Shared pages cost a process nothing to map: loaded even where only the codec is asked.
    mapped = weights or family.maps_weights(manifest)
    backend = _load_weights(family, folder, manifest, context) if mapped else None
    if backend is not None:
        if read is not None:
            family.adopt_codec_tokens(folder, manifest, backend, read.vocab)
        vocab = backend.vocab
    elif read is not None:
        vocab = read.vocab
    else:
        vocab = family.vocabulary(folder, manifest, context)
    check_special_tokens(folder, manifest, vocab)
    codec = family.codec(folder, manifest, vocab, read)
    neural = family.is_neural(manifest, context.loaded)
    return LoadedParts(family, backend, vocab, codec, neural, family.rules(manifest, neural))


def load_backend(
    folder: Path, manifest: ModelManifest, context: LoadContext | None = None
) -> LanguageModelBackend:
    """The model's backend alone (tools and tests): `load_model`'s, with its codec's tokens."""
    backend = load_model(folder, manifest, context or LoadContext()).backend
    assert backend is not None
    return backend


def _load_weights(
    family: ModelFamily, folder: Path, manifest: ModelManifest, context: LoadContext
) -> LanguageModelBackend:
    """The family's backend; its own exceptions reported as a load error of the main file."""
    try:
        return family.load(folder, manifest, context)
    except ModelLoadError:
        raise
    except Exception as exc:  # the backend's own errors: report them, keep serving the rest
        main_file = next(iter(manifest.files.values()), None)
        where = str(folder / main_file.path) if main_file else str(folder)
        raise ModelLoadError(where, f"cannot be loaded ({type(exc).__name__})", f"{exc}") from exc


def check_special_tokens(folder: Path, manifest: ModelManifest, vocab: Vocabulary) -> None:
    """The manifest's `<s>` and `</s>` must be the vocabulary's own."""
    specials = manifest.special_tokens
    for role, word, model_id in (
        ("bos", specials.bos, vocab.bos_id),
        ("eos", specials.eos, vocab.eos_id),
    ):
        if vocab.index.get(word) != model_id:
            raise ModelLoadError(
                str(folder), f"special token {role}={word!r} is not the model's {role} token"
            )
