"""Which family serves a model: the built-in families, and those registered beside them.

    family = family_of(manifest)                  # by its kind; ModelLoadError when none
    manifest = read_model_manifest(folder)        # model.yaml, or a layout a family reads
    stepper = make_stepper(backend)               # the family of a loaded backend
    register(MyFamily())                          # or the `model_families` setting:
    load_families(["my_package.family:FAMILY"])   # imported in the front and every worker

Everything that differs between kinds of model is asked of the family (`family.ModelFamily`);
nothing else names a kind.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Sequence
from pathlib import Path

from lmserve.server.backends.base import LanguageModelBackend
from lmserve.server.backends.stepping import ContextStepper, HistoryKey, Stepper
from lmserve.server.errors import ManifestError, ModelLoadError
from lmserve.server.families.family import ModelFamily
from lmserve.server.families.interpolated import InterpolatedFamily
from lmserve.server.families.ngram import NgramFamily
from lmserve.server.families.recurrent import RecurrentFamily
from lmserve.server.families.transformer import TransformerFamily
from lmserve.server.manifest import MANIFEST_NAMES, ModelManifest, find_manifest, read_manifest

_FAMILIES: list[ModelFamily] = [
    NgramFamily(),
    RecurrentFamily(),
    TransformerFamily(),
    InterpolatedFamily(),
]


def families() -> list[ModelFamily]:
    """Every family served, the built-in ones first."""
    return list(_FAMILIES)


def register(family: ModelFamily) -> None:
    """Serves `family`'s kinds from now on (in this process; a worker loads the same families
    from the `model_families` setting). Registering the same family again does nothing."""
    if any(type(known) is type(family) for known in _FAMILIES):
        return
    for known in _FAMILIES:
        taken = set(known.kinds) & set(family.kinds)
        if taken:
            raise ValueError(
                f"family {family.name!r}: kind '{sorted(taken)[0]}' is served by the "
                f"{known.name!r} family already"
            )
    _FAMILIES.append(family)


def load_families(specs: Iterable[str]) -> None:
    """Imports and registers each `module:attribute` family (the `model_families` setting);
    a spec that names no family is refused with the reason."""
    for spec in specs:
        module_name, _, attribute = spec.partition(":")
        try:
            found = getattr(importlib.import_module(module_name), attribute or "FAMILY")
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"model family {spec!r} cannot be imported: {exc}") from exc
        family = found() if isinstance(found, type) else found
        if not isinstance(family, ModelFamily):
            raise ValueError(f"model family {spec!r} is not a ModelFamily: {found!r}")
        register(family)


def family_of(manifest: ModelManifest, where: str = "model.yaml") -> ModelFamily:
    """The family that serves the manifest's kind and loads its format."""
    for family in _FAMILIES:
        if manifest.kind in family.kinds:
            if manifest.format not in family.formats:
                raise ModelLoadError(
                    where,
                    f"format {manifest.format!r} for kind {manifest.kind!r} is not supported "
                    f"(the {family.name} family loads {', '.join(family.formats)})",
                )
            return family
    known = ", ".join(kind for family in _FAMILIES for kind in family.kinds)
    raise ModelLoadError(where, f"kind {manifest.kind!r} is not served (kinds: {known})")


def family_of_backend(backend: LanguageModelBackend) -> ModelFamily | None:
    """The family whose backend class this is (None for a backend no family loads)."""
    for family in _FAMILIES:
        if isinstance(backend, family.backend_types):
            return family
    return None


def make_stepper(backend: LanguageModelBackend) -> Stepper:
    """The stepper of a loaded backend, chosen by its family (any other backend is stepped
    through its `next_token_log_probs`)."""
    family = family_of_backend(backend)
    if family is None:
        return ContextStepper(backend)
    return family.stepper(backend, make_stepper)


def history_key(backend: LanguageModelBackend) -> HistoryKey | None:
    """What a loaded backend's distributions depend on, for merging lattice histories exactly
    (its family's `history_key`); None where its state is its whole history."""
    family = family_of_backend(backend)
    return None if family is None else family.history_key(backend)


def find_model_manifest(folder: Path) -> Path | None:
    """The file that describes a model folder (what a rescan fingerprints): its manifest, or
    what a family reads in its place (an optimum export's `config.json`); None for a folder
    that holds no model."""
    found = find_manifest(folder)
    for family in _FAMILIES:
        found = found or family.manifest_file(folder)
    return found


def read_model_manifest(folder: Path) -> ModelManifest:
    """The folder's manifest: its manifest file, or one a family reads from the folder's own
    layout."""
    if find_manifest(folder) is not None:
        return read_manifest(folder)
    for family in _FAMILIES:
        if family.manifest_file(folder) is not None:
            return family.folder_manifest(folder)
    raise ManifestError(str(folder), f"no manifest ({' or '.join(MANIFEST_NAMES)})")


def model_components(folder: Path, manifest: ModelManifest) -> Sequence[str]:
    """The models `manifest`'s model is built from (a mixture's components), loaded first."""
    return family_of(manifest, str(folder)).components(folder, manifest)
