"""`RepositoryScanner`: which folders a rescan loads anew, keeps, drops or reports as failed."""

from __future__ import annotations

from pathlib import Path

import yaml

from lmserve.server.manifest import ModelManifest, sha256_of, write_manifest
from lmserve.server.registry.repository import ModelRepository, ModelState
from lmserve.server.registry.rescan import RepositoryScanner

_ARPA = "\\data\\\nngram 1=4\n\n\\1-grams:\n-1.0\t<unk>\n-99\t<s>\n-0.5\t</s>\n-0.3\ta\n\n\\end\\\n"


def _model(folder: Path, name: str) -> None:
    folder.mkdir(parents=True)
    (folder / "model.arpa").write_text(_ARPA)
    sha = sha256_of(folder / "model.arpa")
    write_manifest(
        folder,
        ModelManifest.model_validate(
            {
                "name": name,
                "kind": "ngram",
                "format": "arpa",
                "files": {"arpa": {"path": "model.arpa", "sha256": sha}},
                "ngram": {"order": 1},
            }
        ),
    )


def test_unchanged_folders_keep_their_entry_and_a_manifest_edit_reloads(tmp_path: Path) -> None:
    _model(tmp_path / "one", "one")
    _model(tmp_path / "two", "two")
    repository = ModelRepository.load(tmp_path)
    scanner = RepositoryScanner(tmp_path)
    result = scanner.rescan(repository)
    assert not result.changed
    assert result.repository.get("one") is repository.get("one")

    manifest = yaml.safe_load((tmp_path / "two" / "model.yaml").read_text())
    manifest["version"] = "2"  # the files are the same; the manifest alone changed
    (tmp_path / "two" / "model.yaml").write_text(yaml.safe_dump(manifest))
    result = scanner.rescan(repository)
    assert result.replaced == ["two"] and not result.added and not result.removed
    assert result.repository.get("one") is repository.get("one")
    two = result.repository.ready("two")
    assert two.manifest is not None and two.manifest.version == "2"


def test_a_renamed_model_is_added_and_its_old_name_removed(tmp_path: Path) -> None:
    _model(tmp_path / "one", "one")
    repository = ModelRepository.load(tmp_path)
    scanner = RepositoryScanner(tmp_path)
    manifest = yaml.safe_load((tmp_path / "one" / "model.yaml").read_text())
    manifest["name"] = "uno"
    (tmp_path / "one" / "model.yaml").write_text(yaml.safe_dump(manifest))
    result = scanner.rescan(repository)
    assert (result.added, result.removed) == (["uno"], ["one"])
    assert result.repository.names() == ["uno"]


def test_a_new_broken_folder_is_listed_as_failed(tmp_path: Path) -> None:
    _model(tmp_path / "one", "one")
    repository = ModelRepository.load(tmp_path)
    scanner = RepositoryScanner(tmp_path)
    _model(tmp_path / "bad", "bad")
    (tmp_path / "bad" / "model.arpa").write_text("garbage")
    result = scanner.rescan(repository)
    assert list(result.failed) == ["bad"] and "sha256" in result.failed["bad"]
    assert result.repository.get("bad").state is ModelState.FAILED
    assert result.repository.ready("one") is repository.get("one")
