"""Manifests, checksums and the repository's handling of broken model folders."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import yaml

from lmserve.server.errors import ChecksumMismatch, ManifestError, ModelNotFound, ModelUnavailable
from lmserve.server.manifest import (
    ModelFormat,
    ModelKind,
    read_manifest,
    sha256_of,
    verify_files,
)
from lmserve.server.registry.repository import ModelRepository, ModelState


def _folder(root: Path, name: str, manifest: dict[str, object], files: dict[str, bytes]) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    for path, data in files.items():
        (folder / path).write_bytes(data)
    (folder / "model.yaml").write_text(yaml.safe_dump(manifest))
    return folder


def _onnx_manifest(name: str, sha: str | None) -> dict[str, object]:
    entry: dict[str, object] = {"path": "model.onnx"}
    if sha:
        entry["sha256"] = sha
    return {"name": name, "kind": "lstm", "format": "onnx", "files": {"model": entry}}


def test_read_manifest_and_verify(tmp_path: Path) -> None:
    data = b"weights"
    (tmp_path / "model.onnx").write_bytes(data)
    sha = sha256_of(tmp_path / "model.onnx")
    (tmp_path / "model.json").write_text(
        '{"name": "m", "kind": "lstm", "format": "onnx", '
        f'"files": {{"model": {{"path": "model.onnx", "sha256": "{sha}"}}}}}}'
    )
    manifest = read_manifest(tmp_path)
    assert (manifest.kind, manifest.format) == (ModelKind.LSTM, ModelFormat.ONNX)
    verify_files(tmp_path, manifest)
    (tmp_path / "model.onnx").write_bytes(b"tampered")
    with pytest.raises(ChecksumMismatch, match="model.onnx"):
        verify_files(tmp_path, manifest)


def test_invalid_manifest_names_the_field(tmp_path: Path) -> None:
    (tmp_path / "model.yaml").write_text("name: m\nkind: Mamba 2\nformat: onnx\nfiles: {}\n")
    with pytest.raises(ManifestError, match="kind"):
        read_manifest(tmp_path)


def test_a_kind_no_family_serves_fails_the_model_naming_the_kinds_served(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "model.yaml").write_text("name: m\nkind: mamba\nformat: onnx\nfiles: {}\n")
    [entry] = ModelRepository.load(tmp_path).entries()
    assert entry.state is ModelState.FAILED
    assert "kind 'mamba' is not served" in entry.load_error
    assert all(kind in entry.load_error for kind in ("ngram", "lstm", "transformer"))


def test_repository_keeps_broken_models_as_failed(tmp_path: Path) -> None:
    good_bytes = b"weights"
    sha = hashlib.sha256(good_bytes).hexdigest()
    _folder(tmp_path, "unsupported", _onnx_manifest("unsupported", sha), {"model.onnx": good_bytes})
    _folder(tmp_path, "checksum", _onnx_manifest("checksum", "0" * 64), {"model.onnx": good_bytes})
    _folder(tmp_path, "missing", _onnx_manifest("missing", None), {})
    (tmp_path / "invalid").mkdir()
    (tmp_path / "invalid" / "model.yaml").write_text("name: [unclosed\n")
    (tmp_path / "not-a-model").mkdir()  # no manifest: ignored

    repo = ModelRepository.load(tmp_path)
    assert repo.names() == ["checksum", "invalid", "missing", "unsupported"]
    errors = {e.name: e.load_error for e in repo.entries()}
    assert all(e.state is ModelState.FAILED for e in repo.entries())
    assert "model.onnx" in errors["checksum"] and "sha256" in errors["checksum"]
    assert "model.onnx" in errors["missing"] and "missing" in errors["missing"]
    assert "model.yaml" in errors["invalid"] and "unreadable" in errors["invalid"]
    assert "model.yaml" in errors["unsupported"] and "architecture" in errors["unsupported"]

    with pytest.raises(ModelNotFound, match="available: checksum"):
        repo.get("nope")
    with pytest.raises(ModelUnavailable, match="sha256"):
        repo.ready("checksum")


def test_missing_repository_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        ModelRepository.load(tmp_path / "absent")
