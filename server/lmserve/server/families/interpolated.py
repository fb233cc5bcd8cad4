"""The interpolated family: a weighted mixture of models loaded before it, over their common
vocabulary (`backends.interpolated`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lmserve.server.backends.base import LanguageModelBackend, Vocabulary
from lmserve.server.backends.interpolated import InterpolatedBackend, common_vocabulary
from lmserve.server.backends.stepping import InterpolatedStepper, Stepper
from lmserve.server.errors import ModelLoadError
from lmserve.server.families.codecs import manifest_path, word_codec
from lmserve.server.families.family import LoadContext, LoadedModel, ModelFamily, StepperOf
from lmserve.server.manifest import ModelFormat, ModelKind, ModelManifest, TokenizerKind
from lmserve.server.text.char import CharCodec
from lmserve.server.text.codec import TextCodec
from lmserve.v1 import lm_service_pb2 as pb


class InterpolatedFamily(ModelFamily):
    """P(w | h) = sum_i w_i P_i(w | h): its components load first (in its worker too), it
    computes outside the GIL when one of them does, and steps each component's own stepper."""

    name = "interpolated"
    kinds = {ModelKind.INTERPOLATED: pb.MODEL_KIND_INTERPOLATED}
    formats = {ModelFormat.INTERPOLATION: pb.MODEL_FORMAT_INTERPOLATION}
    tokenizers = frozenset({TokenizerKind.WORD, TokenizerKind.CHARACTER})
    backend_types = (InterpolatedBackend,)

    def components(self, folder: Path, manifest: ModelManifest) -> list[str]:
        return [name for name, _ in interpolation_components(folder, manifest)]

    def is_neural(self, manifest: ModelManifest, loaded: Mapping[str, LoadedModel]) -> bool:
        names = [c.get("model") for c in manifest.architecture.get("components", [])]
        return any(loaded[n].neural for n in names if isinstance(n, str) and n in loaded)

    def load(
        self, folder: Path, manifest: ModelManifest, context: LoadContext
    ) -> LanguageModelBackend:
        parts = []
        for name, weight in interpolation_components(folder, manifest):
            component = _component(folder, name, context)
            if component.manifest.tokenizer != manifest.tokenizer:
                raise ModelLoadError(
                    manifest_path(folder),
                    f"component {name!r} has tokenizer "
                    f"{component.manifest.tokenizer.model_dump()}, this model "
                    f"{manifest.tokenizer.model_dump()}: components must share it",
                )
            if component.backend is None:
                raise ModelLoadError(
                    manifest_path(folder), f"component {name!r} was loaded without its weights"
                )
            parts.append((component.backend, weight))
        return InterpolatedBackend(parts)

    def vocabulary(self, folder: Path, manifest: ModelManifest, context: LoadContext) -> Vocabulary:
        names = self.components(folder, manifest)
        return common_vocabulary([_component(folder, n, context).vocab for n in names])

    def codec(
        self, folder: Path, manifest: ModelManifest, vocab: Vocabulary, read: TextCodec | None
    ) -> TextCodec:
        """Words, or characters over the common vocabulary of character components."""
        spec = manifest.tokenizer
        if spec.kind is TokenizerKind.CHARACTER:
            return CharCodec(vocab, lowercase=spec.lowercase, pattern=spec.pattern)
        return word_codec(folder, manifest, vocab)

    def stepper(self, backend: LanguageModelBackend, stepper_of: StepperOf) -> Stepper:
        assert isinstance(backend, InterpolatedBackend)
        return InterpolatedStepper(backend, [stepper_of(b) for b in backend.components])


def interpolation_components(folder: Path, manifest: ModelManifest) -> list[tuple[str, float]]:
    """`architecture.components`: [(model name, weight)], weights >= 0 summing to 1."""
    where = manifest_path(folder)
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


def _component(folder: Path, name: str, context: LoadContext) -> LoadedModel:
    component = context.loaded.get(name)
    if component is None:
        raise ModelLoadError(manifest_path(folder), f"component {name!r} is not a loaded model")
    return component
