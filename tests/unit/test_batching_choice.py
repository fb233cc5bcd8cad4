"""Which models get a micro-batcher: "auto" batches GPU models only; True/False force it."""

from __future__ import annotations

from pathlib import Path

import pytest
from neural_folders import VOCAB, tiny_model, write_onnx_folder

from lmserve.server.registry.repository import LoadOptions, load_entry
from lmserve.server.settings import load_settings


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("batching") / "lstm"
    write_onnx_folder(tiny_model("lstm", seed=1), VOCAB, path, name="lstm")
    return path


@pytest.mark.parametrize(
    ("setting", "batched"),
    # This suite runs on CPU-only machines: "auto" must leave the CPU ONNX model unbatched.
    [(None, False), (True, True), (False, False)],
)
def test_batcher_follows_the_setting(folder: Path, setting: bool | None, batched: bool) -> None:
    settings = load_settings({"batching_enabled": setting})
    entry = load_entry(folder, LoadOptions.from_settings(settings))
    assert not entry.load_error, entry.load_error
    assert (entry.batcher is not None) is batched
