"""Turns a validated manifest into a loaded backend, by the manifest's kind and format.

    backend = load_backend(folder, manifest)

Neural formats arrive in a later release; until then they fail with "not supported yet".
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from lmserve.server.backends.base import LanguageModelBackend
from lmserve.server.errors import ModelLoadError
from lmserve.server.registry.manifest import ModelFormat, ModelKind, ModelManifest

Loader = Callable[[Path, ModelManifest], LanguageModelBackend]


def _ngram_binary(folder: Path, manifest: ModelManifest) -> LanguageModelBackend:
    from lmserve.server.backends.ngram import NgramModel

    return NgramModel.load(manifest.file_path(folder, "model"))


def _ngram_arpa(folder: Path, manifest: ModelManifest) -> LanguageModelBackend:
    from lmserve.server.backends.ngram import NgramModel

    key = "arpa" if "arpa" in manifest.files else "model"
    return NgramModel.from_arpa(manifest.file_path(folder, key))


LOADERS: dict[tuple[ModelKind, ModelFormat], Loader] = {
    (ModelKind.NGRAM, ModelFormat.NGRAM_BINARY): _ngram_binary,
    (ModelKind.NGRAM, ModelFormat.ARPA): _ngram_arpa,
}


def load_backend(folder: Path, manifest: ModelManifest) -> LanguageModelBackend:
    """Loads the model; every failure becomes a `ModelLoadError` naming the file and reason."""
    loader = LOADERS.get((manifest.kind, manifest.format))
    if loader is None:
        raise ModelLoadError(
            str(folder),
            f"format {manifest.format.value!r} for kind {manifest.kind.value!r} "
            "is not supported yet",
        )
    try:
        return loader(folder, manifest)
    except ModelLoadError:
        raise
    except Exception as exc:  # the backend's own errors: report them, keep serving the rest
        main_file = next(iter(manifest.files.values()), None)
        where = str(folder / main_file.path) if main_file else str(folder)
        raise ModelLoadError(where, f"{type(exc).__name__}: {exc}") from exc
