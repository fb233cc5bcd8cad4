"""Model folders from untrusted hands: manifest paths stay in the folder, load errors shown to
clients carry no absolute path and no file content, TorchScript can be refused, and export's
checkpoints load without unpickling code."""

from __future__ import annotations

import logging
import pickle
from pathlib import Path

import pytest
import torch
import yaml
from neural_folders import VOCAB, tiny_model, write_torchscript_folder

from lmserve.export.trainers.recurrent import load_checkpoint
from lmserve.server.errors import ManifestError
from lmserve.server.manifest import read_manifest, sha256_of, verify_files
from lmserve.server.registry.repository import LoadOptions, ModelState, load_entry
from lmserve.server.settings import load_settings

SECRET = b"root:x:0:0:secret-token-1234\n"


def _arpa_folder(root: Path, name: str, path: str) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    manifest = {"name": name, "kind": "ngram", "format": "arpa", "files": {"arpa": {"path": path}}}
    (folder / "model.yaml").write_text(yaml.safe_dump(manifest))
    return folder


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    secret = tmp_path / "etc" / "passwd"
    secret.parent.mkdir()
    secret.write_bytes(SECRET)
    return secret


@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink", "symlinked-dir"])
def test_manifest_paths_must_stay_in_the_model_folder(
    tmp_path: Path, outside: Path, how: str
) -> None:
    root = tmp_path / "models"
    if how == "dotdot":
        path = "../../etc/passwd"
        folder = _arpa_folder(root, "m", path)
    elif how == "absolute":
        path = str(outside)
        folder = _arpa_folder(root, "m", path)
    elif how == "symlink":
        path = "model.arpa"
        folder = _arpa_folder(root, "m", path)
        (folder / "model.arpa").symlink_to(outside)
    else:
        path = "sub/passwd"
        folder = _arpa_folder(root, "m", path)
        (folder / "sub").symlink_to(outside.parent)
    with pytest.raises(ManifestError, match="leaves the model folder"):
        verify_files(folder, read_manifest(folder))
    with pytest.raises(ManifestError, match="leaves the model folder"):
        read_manifest(folder).file_path(folder, "arpa")
    entry = load_entry(folder)
    assert entry.state is ModelState.FAILED
    assert f"files.arpa.path {path!r} leaves the model folder" in entry.load_error
    assert str(tmp_path) not in entry.load_error.replace(repr(path), "")
    assert "secret" not in entry.load_error


def test_a_symlink_inside_the_folder_is_fine(tmp_path: Path, shared_data: Path) -> None:
    folder = _arpa_folder(tmp_path, "m", "link.arpa")
    (folder / "real.arpa").write_bytes((shared_data / "kenlm-tests" / "test.arpa").read_bytes())
    (folder / "link.arpa").symlink_to(folder / "real.arpa")
    assert load_entry(folder).state is ModelState.READY


def test_load_errors_for_clients_have_no_paths_or_content(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = _arpa_folder(tmp_path, "broken", "model.arpa")
    lines = [
        b"\\data\\",
        b"ngram 1=2",
        b"",
        b"\\1-grams:",
        b"-1.0\t<s>",
        b"secret-token-1234\t</s>",
    ]
    (folder / "model.arpa").write_bytes(b"\n".join([*lines, b"\\end\\", b""]))
    with caplog.at_level(logging.ERROR):
        entry = load_entry(folder)
    assert entry.state is ModelState.FAILED
    assert entry.load_error.startswith("broken/model.arpa: line 6: ")
    assert str(tmp_path) not in entry.load_error and "secret" not in entry.load_error
    # The server log keeps everything: the absolute path and what the line held.
    assert str(folder / "model.arpa") in caplog.text and "secret" in caplog.text


def test_unreadable_manifest_error_has_no_content(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "model.yaml").write_text("name: [unclosed secret-token-1234\n")
    entry = load_entry(folder)
    assert entry.load_error == "m/model.yaml: unreadable"


@pytest.fixture(scope="module")
def torchscript_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("ts") / "tiny-ts"
    write_torchscript_folder(tiny_model("lstm"), VOCAB, folder, name="tiny-ts")
    return folder


def test_allow_torchscript_false_refuses_torchscript_models(torchscript_folder: Path) -> None:
    assert LoadOptions.from_settings(load_settings()).allow_torchscript is True
    assert load_entry(torchscript_folder).state is ModelState.READY
    options = LoadOptions.from_settings(load_settings({"allow_torchscript": False}))
    entry = load_entry(torchscript_folder, options)
    assert entry.state is ModelState.FAILED
    assert "allow_torchscript is false" in entry.load_error


class _Trap:
    """Unpickling this calls `_sprung` (what a hostile checkpoint would do with os.system)."""

    def __reduce__(self) -> tuple[object, tuple[()]]:
        return (_sprung, ())


SPRUNG: list[bool] = []


def _sprung() -> dict[str, object]:
    SPRUNG.append(True)
    return {}


def test_checkpoints_load_without_running_pickled_code(tmp_path: Path) -> None:
    path = tmp_path / "evil.pt"
    torch.save({"model_config": _Trap(), "state_dict": {}}, path)
    with pytest.raises(pickle.UnpicklingError):
        load_checkpoint(path)
    assert not SPRUNG


def test_file_checksums_are_unchanged_by_confinement(tmp_path: Path, shared_data: Path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "sub").mkdir()
    (folder / "sub" / "model.arpa").write_bytes(
        (shared_data / "kenlm-tests" / "test.arpa").read_bytes()
    )
    manifest = {
        "name": "m",
        "kind": "ngram",
        "format": "arpa",
        "files": {
            "arpa": {"path": "sub/./model.arpa", "sha256": sha256_of(folder / "sub" / "model.arpa")}
        },
    }
    (folder / "model.yaml").write_text(yaml.safe_dump(manifest))
    assert load_entry(folder).state is ModelState.READY
