"""How every export writes a served model folder: staged, checked, then moved in whole.

    folder = write_served_folder(model_dir, write=..., check=..., manifest=...)

The files are written into a staging folder beside MODEL_DIR, checked against the model they
came from (parity), described by a manifest with every file's sha256 (verified as read back),
and only then renamed into place, so a failed export never leaves a half-written model where a
server would load it. MODEL_DIR may be absent or an empty folder; `overwrite` replaces a model
folder, never another folder (`check_writable`).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Generic, TypeVar

from lmserve.server.manifest import (
    FileEntry,
    ModelManifest,
    find_manifest,
    read_manifest,
    sha256_of,
    verify_files,
    write_manifest,
)

if TYPE_CHECKING:
    from lmserve.export.quantize import Quantize

R = TypeVar("R")

# Manifest key -> file name in the folder, as each export writes them.
Files = dict[str, str]


def copy_listed_files(source: Path, manifest: ModelManifest, staging: Path) -> Files:
    """Copies the files `manifest` lists from the folder `source` into `staging` (a command
    that rewrites a served folder, `lmserve quantize` or `lmserve optimize`, starts from its
    copy); returns their keys and paths, as a `write` step does."""
    for entry in manifest.files.values():
        target = staging / entry.path
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / entry.path, target)
    return {key: entry.path for key, entry in manifest.files.items()}


def check_writable(model_dir: Path, *, overwrite: bool = False) -> None:
    """Raises FileExistsError unless MODEL_DIR is absent, an empty folder, or (with
    `overwrite`) a model folder: an export never replaces some other directory."""
    if not model_dir.exists():
        return
    if model_dir.is_dir() and not any(model_dir.iterdir()):
        return
    if not overwrite:
        raise FileExistsError(
            f"{model_dir} exists and is not an empty folder "
            "(pass --overwrite to replace a model folder)"
        )
    if not model_dir.is_dir() or find_manifest(model_dir) is None:
        raise FileExistsError(
            f"{model_dir} exists and is not a model folder (no manifest): "
            "--overwrite replaces model folders only"
        )


@dataclass(frozen=True)
class ServedFolder(Generic[R]):
    """What was written: the folder, its manifest, the parity it passed, each file's size,
    and how long writing and checking took."""

    folder: Path
    manifest: ModelManifest
    parity: R
    sizes: dict[str, int]
    write_seconds: float
    check_seconds: float


def write_served_folder(
    model_dir: Path,
    *,
    write: Callable[[Path], Files],
    check: Callable[[Path], R],
    manifest: Callable[[Path, Files, R], ModelManifest],
    overwrite: bool = False,
    quantize: Quantize | None = None,
) -> ServedFolder[R]:
    """Stages the folder, then moves it to MODEL_DIR (replacing a model folder there).

    `write(staging)` writes the model's files and names them; `check(staging)` compares them
    with the model (raising to refuse) and returns its figures; `manifest(staging, files,
    parity)` describes the folder (checksums are filled in here). With `quantize`, the checked
    float graphs are then quantized in place and measured against themselves
    (`lmserve.export.quantize`: refused over its bound), and the manifest records it.
    """
    check_writable(model_dir, overwrite=overwrite)
    model_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{model_dir.name}.partial-", dir=model_dir.parent))
    try:
        began = time.monotonic()
        files = write(staging)
        written = time.monotonic()
        parity = check(staging)
        checked = time.monotonic()
        described = _with_checksums(staging, manifest(staging, files, parity))
        if quantize is not None:
            from lmserve.export.quantize import quantize_folder

            write_manifest(staging, described)  # the float folder, loaded to measure it
            block = quantize_folder(staging, described, quantize)
            described = _with_checksums(
                staging, described.model_copy(update={"quantization": block})
            )
        write_manifest(staging, described)
        verify_files(staging, read_manifest(staging))
        sizes = {e.path: (staging / e.path).stat().st_size for e in described.files.values()}
        if model_dir.exists():
            shutil.rmtree(model_dir)
        staging.rename(model_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return ServedFolder(model_dir, described, parity, sizes, written - began, checked - written)


def _with_checksums(folder: Path, manifest: ModelManifest) -> ModelManifest:
    """The manifest with every listed file's sha256, as written."""
    files = {
        key: FileEntry(path=entry.path, sha256=sha256_of(folder / entry.path))
        for key, entry in manifest.files.items()
    }
    return manifest.model_copy(update={"files": files})
