"""The model repository: every model folder under one directory, loaded or failed with a reason.

    repo = ModelRepository.load(Path("models"))
    entry = repo.ready("kjv-5gram")        # ModelNotFound / ModelUnavailable otherwise
    entry.scorer.score_texts([...], ScoreOptions())

A folder that fails (bad manifest, missing file, checksum, malformed model) is kept as FAILED
with `load_error` naming the file and the reason; the other models still serve. Interpolated
models load after every other, since they are built from loaded components. The registry only
loads: serving a loaded model (queues, schedulers, sessions) is `front.models.served_model`'s job.
Each model scores with the codec its manifest's tokenizer names: words (`WordCodec`), characters
(`CharCodec`, from the escaped `vocab.txt`) or BPE subwords (`BpeCodec`, from `tokenizer.json`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from lmserve.server.backends.base import LanguageModelBackend
from lmserve.server.backends.onnx import OnnxOptions
from lmserve.server.decoding.scoring import Scorer
from lmserve.server.errors import ModelLoadError, ModelNotFound, ModelUnavailable, clip
from lmserve.server.families.catalog import (
    find_model_manifest,
    load_families,
    model_components,
    read_model_manifest,
)
from lmserve.server.families.family import LoadContext, LoadedModel, ModelFamily, ServingRules
from lmserve.server.families.loading import load_model
from lmserve.server.manifest import ModelManifest, verify_files
from lmserve.server.settings import Settings
from lmserve.server.text.vocab import Vocabulary

log = logging.getLogger(__name__)


class ModelState(StrEnum):
    READY = "ready"
    FAILED = "failed"


@dataclass(frozen=True)
class ModelEntry:
    """One model of the repository: its manifest and, when READY, the loaded scorer."""

    name: str
    folder: Path
    state: ModelState
    manifest: ModelManifest | None = None
    scorer: Scorer | None = None
    load_error: str = ""
    load_seconds: float = 0.0
    # Whether the model computes without the GIL (ONNX Runtime, torch): a neural model, or a
    # mixture with one.
    neural: bool = False
    # What serves it (`families`), when it loaded, and the rules its family sets for it.
    family: ModelFamily | None = None
    rules: ServingRules = ServingRules()

    @property
    def backend(self) -> LanguageModelBackend | None:
        """The loaded model, when READY and loaded with its weights (`LoadOptions.weights`)."""
        return self.scorer.backend if self.scorer and self.scorer.has_backend else None

    @property
    def vocab(self) -> Vocabulary | None:
        """The model's vocabulary, when READY (with or without its weights)."""
        return self.scorer.vocab if self.scorer else None


@dataclass(frozen=True)
class LoadOptions:
    """What loading takes from the settings: the neural runtimes' options, and whether
    TorchScript models (code from the model file) may load."""

    onnx: OnnxOptions = OnnxOptions()
    allow_torchscript: bool = True
    # False: the vocabulary, codec and manifest only, no model weights (a front whose models
    # compute in engine workers: they load the weights, and report a broken file).
    weights: bool = True
    # Families served beside the built-in ones (`module:attribute`, the `model_families`
    # setting), imported by every process that loads models.
    families: tuple[str, ...] = ()

    @classmethod
    def from_settings(cls, settings: Settings) -> LoadOptions:
        onnx = OnnxOptions(
            intra_op_threads=settings.onnx_intra_op_threads,
            inter_op_threads=settings.onnx_inter_op_threads,
            allow_spinning=settings.onnx_allow_spinning,
            max_chunk_tokens=settings.max_chunk_tokens,
            use_gpu=settings.onnx_use_gpu,
            device_states=settings.onnx_device_states,
        )
        return cls(
            onnx,
            allow_torchscript=settings.allow_torchscript,
            families=tuple(settings.model_families),
        )

    def without_weights(self) -> LoadOptions:
        return dataclasses.replace(self, weights=False)


def load_entry(
    folder: Path,
    options: LoadOptions | None = None,
    loaded: dict[str, ModelEntry] | None = None,
) -> ModelEntry:
    """Validates, verifies and loads one model folder; never raises for a broken model.

    Without weights (`options.weights` False) only the manifest, the tokenizer files and the
    vocabulary are read: checksums and the model files are the loading worker's to check."""
    options = options or LoadOptions()
    started = time.perf_counter()
    manifest: ModelManifest | None = None
    try:
        _load_families(folder, options.families)
        manifest = read_model_manifest(folder)
        if options.weights:
            verify_files(folder, manifest)
        components = {
            e.name: LoadedModel(e.backend, e.manifest, e.vocab, e.neural)
            for e in (loaded or {}).values()
            if e.vocab is not None and e.manifest is not None
        }
        context = LoadContext(options.onnx, components, allow_torchscript=options.allow_torchscript)
        parts = load_model(folder, manifest, context, weights=options.weights)
    except ModelLoadError as exc:
        name = manifest.name if manifest else folder.name
        log.error("model %s failed to load: %s", name, exc)
        error = client_load_error(folder, exc)
        return ModelEntry(name, folder, ModelState.FAILED, manifest, load_error=error)
    seconds = time.perf_counter() - started
    what = "loaded" if options.weights else "read (vocabulary and codec; weights in its worker)"
    log.info("model %s %s from %s in %.2f s", manifest.name, what, folder, seconds)
    return ModelEntry(
        manifest.name,
        folder,
        ModelState.READY,
        manifest,
        scorer=Scorer(parts.backend, parts.codec),
        load_seconds=seconds,
        neural=parts.neural,
        family=parts.family,
        rules=parts.rules,
    )


def client_load_error(folder: Path, exc: ModelLoadError) -> str:
    """What clients see of a load error (ListModels, GetModel, UNAVAILABLE): the file relative
    to the repository (`kjv3/model.arpa`) and the reason, without the detail (a line of the file,
    a library's message with absolute paths) that only the server log gets."""
    return f"{_shown_path(folder, Path(exc.path))}: {clip(exc.reason, 300)}"


def _shown_path(folder: Path, path: Path) -> str:
    for base in (folder, folder.resolve()):
        try:
            relative = path.relative_to(base)
        except ValueError:
            continue
        return str(Path(folder.name) / relative) if relative.parts else folder.name
    return path.name or folder.name


def _load_families(folder: Path, specs: tuple[str, ...]) -> None:
    """The `model_families` beside the built-in ones (a spec that names none fails the model
    with the reason; `ModelRepository.load` refuses to start with it first)."""
    try:
        load_families(specs)
    except ValueError as exc:
        raise ModelLoadError(str(folder), str(exc)) from exc


def has_components(folder: Path) -> bool:
    """Whether the folder's model is built from others (a mixture), so loads after them."""
    try:
        return bool(model_components(folder, read_model_manifest(folder)))
    except ModelLoadError:
        return False


class ModelRepository:
    """The models of one repository folder, by name."""

    def __init__(self, root: Path, entries: list[ModelEntry]) -> None:
        self.root = root
        self._entries = {e.name: e for e in sorted(entries, key=lambda e: e.name)}

    @classmethod
    def load(
        cls,
        root: Path,
        on_loaded: Callable[[ModelEntry], None] | None = None,
        options: LoadOptions | None = None,
    ) -> ModelRepository:
        """Loads every subfolder that has a manifest (folders without one are ignored)."""
        if not root.is_dir():
            raise FileNotFoundError(f"model repository {root} is not a directory")
        load_families((options or LoadOptions()).families)  # ValueError: a bad setting
        entries: dict[str, ModelEntry] = {}
        folders = []
        for folder in sorted(p for p in root.iterdir() if p.is_dir()):
            if find_model_manifest(folder) is None:
                log.warning("ignoring %s: no model.yaml or model.json", folder)
                continue
            folders.append(folder)
        # Mixtures last: they are built from the models loaded before them.
        folders.sort(key=has_components)
        for folder in folders:
            entry = load_entry(folder, options, entries)
            if entry.name in entries:
                first = entries[entry.name].folder
                entry = ModelEntry(
                    f"{entry.name}@{folder.name}",
                    folder,
                    ModelState.FAILED,
                    entry.manifest,
                    load_error=f"{folder.name}: model name {entry.name!r} already used by "
                    f"{first.name}",
                )
                log.error("%s: model name %r already used by %s", folder, entry.name, first)
            entries[entry.name] = entry
            if on_loaded is not None:
                on_loaded(entry)
        return cls(root, list(entries.values()))

    def entries(self) -> list[ModelEntry]:
        """Every model, sorted by name."""
        return list(self._entries.values())

    def names(self) -> list[str]:
        return list(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def get(self, name: str) -> ModelEntry:
        entry = self._entries.get(name)
        if entry is None:
            raise ModelNotFound(name, self.names())
        return entry

    def ready(self, name: str) -> ModelEntry:
        """The model if it serves; ModelNotFound or ModelUnavailable (with its load error)."""
        entry = self.get(name)
        if entry.state is not ModelState.READY:
            raise ModelUnavailable(f"model {name!r} failed to load: {entry.load_error}")
        return entry
