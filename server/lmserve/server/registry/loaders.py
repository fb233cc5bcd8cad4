"""Turns a validated manifest into a loaded backend, by the manifest's kind and format.

    backend = load_backend(folder, manifest, LoadContext(onnx=OnnxOptions()))

Heavy runtimes (onnxruntime, torch) are imported by the loader that needs them, so a deployment
installs only what its models use. Interpolated models find their components, loaded before
them, in `LoadContext.loaded`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmserve.server.backends.base import LanguageModelBackend
from lmserve.server.backends.onnx import OnnxOptions
from lmserve.server.errors import ModelLoadError
from lmserve.server.registry.manifest import ModelFormat, ModelKind, ModelManifest


@dataclass(frozen=True)
class LoadedModel:
    """What an interpolated model needs of a component: its backend and its manifest."""

    backend: LanguageModelBackend
    manifest: ModelManifest


@dataclass(frozen=True)
class LoadContext:
    """Runtime options from the settings, and the models loaded so far (by name)."""

    onnx: OnnxOptions = field(default_factory=OnnxOptions)
    loaded: Mapping[str, LoadedModel] = field(default_factory=dict)


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

    _check_cell(folder, manifest)
    return TorchScriptBackend.load(folder, manifest, max_chunk_tokens=ctx.onnx.max_chunk_tokens)


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
        parts.append((component.backend, weight))
    return InterpolatedBackend(parts)


LOADERS: dict[tuple[ModelKind, ModelFormat], Loader] = {
    (ModelKind.NGRAM, ModelFormat.NGRAM_BINARY): _ngram_binary,
    (ModelKind.NGRAM, ModelFormat.ARPA): _ngram_arpa,
    **{(kind, ModelFormat.ONNX): _onnx for kind in (ModelKind.RNN, ModelKind.LSTM, ModelKind.GRU)},
    **{
        (kind, ModelFormat.TORCHSCRIPT): _torchscript
        for kind in (ModelKind.RNN, ModelKind.LSTM, ModelKind.GRU)
    },
    (ModelKind.INTERPOLATED, ModelFormat.INTERPOLATION): _interpolated,
}


def load_backend(
    folder: Path, manifest: ModelManifest, context: LoadContext | None = None
) -> LanguageModelBackend:
    """Loads the model; every failure becomes a `ModelLoadError` naming the file and reason."""
    loader = LOADERS.get((manifest.kind, manifest.format))
    if loader is None:
        raise ModelLoadError(
            str(folder),
            f"format {manifest.format.value!r} for kind {manifest.kind.value!r} is not supported",
        )
    try:
        return loader(folder, manifest, context or LoadContext())
    except ModelLoadError:
        raise
    except Exception as exc:  # the backend's own errors: report them, keep serving the rest
        main_file = next(iter(manifest.files.values()), None)
        where = str(folder / main_file.path) if main_file else str(folder)
        raise ModelLoadError(where, f"{type(exc).__name__}: {exc}") from exc
