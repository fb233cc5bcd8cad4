"""Rescanning a model repository for hot reload: which folders were added, changed or removed.

    scanner = RepositoryScanner(root, options)        # fingerprints the folders as they are
    result = scanner.rescan(current_repository)        # blocking: run it off the event loop
    result.repository, result.added, result.replaced, result.removed, result.failed

A folder's fingerprint is the sha256 of its manifest plus the size and mtime of every file in
it, so editing the manifest or replacing a model file (new ARPA, new ONNX) both count as a
change; an unchanged folder keeps its `ModelEntry` (the same object, so the engine keeps its
`ServedModel`). A changed folder that fails to load keeps its previous READY entry serving and
is reported in `failed`; its fingerprint is remembered, so a broken folder is not retried on
every poll, only once it changes again. Interpolated models are rebuilt whenever anything else
changed, since they hold their components' backends.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from pathlib import Path

from lmserve.server.errors import ModelLoadError
from lmserve.server.families.catalog import find_model_manifest, model_components
from lmserve.server.registry.repository import (
    LoadOptions,
    ModelEntry,
    ModelRepository,
    ModelState,
    has_components,
    load_entry,
)

log = logging.getLogger(__name__)


@dataclass
class RescanResult:
    """The repository after a rescan and the model names each outcome touched."""

    repository: ModelRepository
    added: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # name -> load error

    @property
    def changed(self) -> bool:
        return bool(self.added or self.replaced or self.removed or self.failed)


def fingerprint(folder: Path) -> str:
    """The manifest's sha256 and every file's size and mtime (cheap: no model file is read)."""
    digest = hashlib.sha256()
    manifest = find_model_manifest(folder)
    if manifest is not None:
        try:
            digest.update(hashlib.sha256(manifest.read_bytes()).digest())
        except OSError:
            digest.update(b"unreadable")
    for path in sorted(folder.rglob("*")):
        try:
            stat = path.stat()
        except OSError:
            continue  # removed while we looked: the next rescan sees it
        digest.update(f"{path.relative_to(folder)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def model_folders(root: Path) -> list[Path]:
    """The subfolders of `root` with a manifest, sorted."""
    return sorted(p for p in root.iterdir() if p.is_dir() and find_model_manifest(p) is not None)


class RepositoryScanner:
    """Remembers each folder's fingerprint between rescans (not thread-safe: one at a time)."""

    def __init__(self, root: Path, options: LoadOptions | None = None) -> None:
        self.root = root
        self.options = options or LoadOptions()
        folders = model_folders(root) if root.is_dir() else []
        self._prints = {folder: fingerprint(folder) for folder in folders}

    def rescan(self, current: ModelRepository) -> RescanResult:
        """Loads new and changed folders; keeps unchanged ones as they are (blocking)."""
        folders = model_folders(self.root) if self.root.is_dir() else []
        prints = {folder: fingerprint(folder) for folder in folders}
        old_by_folder = {entry.folder: entry for entry in current.entries()}
        changed = {f for f in folders if prints[f] != self._prints.get(f)}
        gone = set(old_by_folder) - set(folders)
        anything = bool(changed or gone)
        # Mixtures last (built from the models before them), rebuilt when anything changed.
        folders.sort(key=has_components)
        result = RescanResult(current)
        entries: dict[str, ModelEntry] = {}
        for folder in folders:
            old = old_by_folder.get(folder)
            mixture = _built_from_others(old)
            if old is not None and folder not in changed and not (mixture and anything):
                entries[old.name] = old
                continue
            entry = load_entry(folder, self.options, entries)
            if entry.name in entries:
                log.error("%s: model name %r already used; not loaded", folder, entry.name)
                result.failed[entry.name] = f"{folder.name}: model name already used"
                continue
            if entry.state is ModelState.FAILED:
                result.failed[entry.name] = entry.load_error
                if old is not None and old.state is ModelState.READY:
                    log.error("reload of %s failed; the loaded version keeps serving", old.name)
                    entries[old.name] = old
                    continue
                entries[entry.name] = entry
                if old is not None and old.name != entry.name:
                    result.removed.append(old.name)
                continue
            if old is None or old.name != entry.name:
                result.added.append(entry.name)
                if old is not None:
                    result.removed.append(old.name)
            else:
                result.replaced.append(entry.name)
            entries[entry.name] = entry
        for folder in gone:
            name = old_by_folder[folder].name
            if name not in entries:
                result.removed.append(name)
        self._prints = prints
        result.repository = ModelRepository(self.root, list(entries.values()))
        return result


def _built_from_others(entry: ModelEntry | None) -> bool:
    """Whether a loaded entry is a mixture (rebuilt when any model changed)."""
    if entry is None or entry.manifest is None:
        return False
    try:
        return bool(model_components(entry.folder, entry.manifest))
    except ModelLoadError:
        return False
