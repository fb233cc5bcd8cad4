"""Writes an n-gram model folder: `model.lmbin`, optionally the source ARPA and a tokenizer file,
and `model.yaml`; loads one (whole, or its vocabulary alone)."""

from __future__ import annotations

import shutil
from pathlib import Path

from lmserve.server.backends.base import Vocabulary
from lmserve.server.backends.ngram.arpa_import import import_arpa
from lmserve.server.backends.ngram.binary import BinaryVersionError, load_tables
from lmserve.server.backends.ngram.model import Kernel, NgramModel
from lmserve.server.backends.ngram.tables import BOS, EOS, UNK
from lmserve.server.manifest import (
    FileEntry,
    ModelFormat,
    ModelKind,
    ModelManifest,
    NgramSpec,
    NgramStorage,
    Provenance,
    TokenizerSpec,
    sha256_of,
    write_manifest,
)

BINARY_NAME = "model.lmbin"


def load_model_folder_binary(
    folder: Path, manifest: ModelManifest, *, kernel: Kernel | None = None
) -> NgramModel:
    """Loads an `ngram_binary` folder's `files["model"]`.

    When that binary has an older format version and the folder holds its ARPA copy
    (`files["arpa"]`), the ARPA is compiled in memory instead, with a logged warning to rebuild;
    without the copy, ModelLoadError names the file and both versions.
    """
    folder = Path(folder)
    arpa = manifest.file_path(folder, "arpa") if "arpa" in manifest.files else None
    return NgramModel.load(manifest.file_path(folder, "model"), kernel=kernel, arpa_fallback=arpa)


def ngram_vocabulary(folder: Path, manifest: ModelManifest) -> Vocabulary:
    """The model's vocabulary without its tables (a front that only tokenizes): a binary's
    word list from its memory map (the tables' pages are never read), or an ARPA file's
    unigrams (read once and dropped). The same ids `NgramModel` gives."""
    if manifest.format == ModelFormat.NGRAM_BINARY:
        try:
            words = load_tables(manifest.file_path(folder, "model")).vocab
        except BinaryVersionError:
            if "arpa" not in manifest.files:
                raise
            words = import_arpa(manifest.file_path(folder, "arpa")).vocab
    else:
        key = "arpa" if "arpa" in manifest.files else "model"
        words = import_arpa(manifest.file_path(folder, key)).vocab
    return Vocabulary.from_words(words, unk=UNK, bos=BOS, eos=EOS, distinct=True)


def storage_of(model: NgramModel) -> NgramStorage:
    """What the manifest says of the binary: layout, size, and quantization's errors."""
    tables = model.tables
    prob_error, backoff_error = tables.max_value_errors()
    return NgramStorage(
        layout="probing-q8" if tables.quantized else "probing",
        counts=list(tables.counts),
        bytes=tables.nbytes(),
        bytes_per_ngram=round(tables.nbytes() / max(1, tables.n_entries()), 3),
        max_prob_error=prob_error,
        max_backoff_error=backoff_error,
        max_token_error=tables.max_token_error(),
    )


def write_model_folder(
    model: NgramModel,
    out_dir: Path,
    *,
    name: str,
    tokenizer: TokenizerSpec,
    provenance: Provenance,
    smoothing: str | None = None,
    arpa_source: Path | None = None,
    description: str = "",
    tokenizer_files: dict[str, Path] | None = None,
) -> ModelManifest:
    """Saves the model's binary (and a copy of its ARPA) with a manifest listing their sha256.

    The manifest says kind=ngram, format=ngram_binary, files["model"] = model.lmbin, and
    files["arpa"] = model.arpa[.gz] when `arpa_source` is given (kept for inspection and for
    rebuilding the binary with a newer format). `tokenizer_files` (manifest key -> a file already
    in `out_dir`: a character model's `vocab.txt`, a BPE model's `tokenizer.json`) are listed too.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {"model": FileEntry(path=BINARY_NAME, sha256=model.save(out_dir / BINARY_NAME))}
    if arpa_source is not None:
        arpa_source = Path(arpa_source)
        with arpa_source.open("rb") as f:
            gzipped = f.read(2) == b"\x1f\x8b"
        arpa_name = "model.arpa.gz" if gzipped else "model.arpa"
        target = out_dir / arpa_name
        if arpa_source.resolve() != target.resolve():
            shutil.copyfile(arpa_source, target)
        files["arpa"] = FileEntry(path=arpa_name, sha256=sha256_of(target))
    for key, path in (tokenizer_files or {}).items():
        files[key] = FileEntry(path=path.name, sha256=sha256_of(out_dir / path.name))
    manifest = ModelManifest(
        name=name,
        kind=ModelKind.NGRAM,
        format=ModelFormat.NGRAM_BINARY,
        description=description,
        files=files,
        tokenizer=tokenizer,
        ngram=NgramSpec(order=model.order, smoothing=smoothing, storage=storage_of(model)),
        provenance=provenance,
    )
    write_manifest(out_dir, manifest)
    return manifest
