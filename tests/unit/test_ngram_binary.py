"""The `.lmbin` format: identical scores after a round trip; damaged files are refused."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lmserve.server.backends.ngram.folder import write_model_folder
from lmserve.server.backends.ngram.model import NgramModel
from lmserve.server.errors import ModelLoadError
from lmserve.server.manifest import (
    Provenance,
    TokenizerSpec,
    read_manifest,
    verify_files,
)
from lmserve.server.text.word import encode_token_lists

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "ngram"
TEXTS = [["a", "b", "c"], ["c", "a"], [], ["zzz", "b", "b", "a"], ["a"] * 9]


@pytest.fixture(params=["toy.arpa", "toy_pruned.arpa"])
def arpa(request: pytest.FixtureRequest) -> Path:
    return FIXTURES / request.param


def test_round_trip_scores_identically(arpa: Path, tmp_path: Path) -> None:
    model = NgramModel.from_arpa(arpa)
    model.save(tmp_path / "m.lmbin")
    loaded = NgramModel.load(tmp_path / "m.lmbin")
    assert loaded.order == model.order
    assert loaded.vocab.words == model.vocab.words
    assert loaded.ngram_counts() == model.ngram_counts()
    batch = encode_token_lists(TEXTS, model.vocab)
    for bos in (True, False):
        for eos in (True, False):
            a = model.score(batch, bos=bos, eos=eos, per_token=True)
            b = loaded.score(batch, bos=bos, eos=eos, per_token=True)
            assert a.totals.tolist() == b.totals.tolist()
            assert a.token_log_probs is not None and b.token_log_probs is not None
            assert a.token_log_probs.tolist() == b.token_log_probs.tolist()
    ids = [model.vocab.index["a"], model.vocab.index["b"]]
    np.testing.assert_array_equal(model.next_token_log_probs(ids), loaded.next_token_log_probs(ids))


def test_arrays_are_aligned_and_mapped(tmp_path: Path) -> None:
    NgramModel.from_arpa(FIXTURES / "toy.arpa").save(tmp_path / "m.lmbin")
    tables = NgramModel.load(tmp_path / "m.lmbin").tables
    mapped: list[np.ndarray[Any, Any]] = [tables.uni_prob, tables.uni_backoff]
    mapped += [t.slots for t in tables.tables]
    for arr in mapped:
        assert not arr.flags.owndata  # a view over the mapped file, not a copy
        assert arr.ctypes.data % 8 == 0


@pytest.mark.parametrize(
    ("damage", "words"),
    [
        (lambda b: b"NOTMODEL" + b[8:], "not an lmserve n-gram binary"),
        (lambda b: b[: len(b) // 2], "truncated"),
        (lambda b: b[:30] + bytes([b[30] ^ 0xFF]) + b[31:], "corrupt header"),
        (lambda b: b[:10], "too short"),
        (lambda b: b"", "cannot map"),
        (lambda b: b[:8] + (99).to_bytes(4, "little") + b[12:], "version 99"),
    ],
)
def test_damaged_files_are_refused(
    tmp_path: Path, damage: Callable[[bytes], bytes], words: str
) -> None:
    path = tmp_path / "m.lmbin"
    NgramModel.from_arpa(FIXTURES / "toy.arpa").save(path)
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(ModelLoadError, match=words):
        NgramModel.load(path)


def test_payload_corruption_found_when_verifying(tmp_path: Path) -> None:
    from lmserve.server.backends.ngram.binary import load_tables

    path = tmp_path / "m.lmbin"
    NgramModel.from_arpa(FIXTURES / "toy.arpa").save(path)
    data = bytearray(path.read_bytes())
    header = json.loads(data[24 : 24 + int.from_bytes(data[12:16], "little")])
    prob = next(e for e in header["arrays"] if e["name"] == "table.2")
    data[prob["offset"]] ^= 0x55
    path.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match="crc32"):
        load_tables(path, verify=True)


def test_write_model_folder(tmp_path: Path) -> None:
    model = NgramModel.from_arpa(FIXTURES / "toy.arpa")
    folder = tmp_path / "toy"
    manifest = write_model_folder(
        model,
        folder,
        name="toy-3gram",
        tokenizer=TokenizerSpec(),
        provenance=Provenance(trained_by="hand"),
        smoothing="none",
        arpa_source=FIXTURES / "toy.arpa",
        description="hand-made",
    )
    assert read_manifest(folder) == manifest
    verify_files(folder, manifest)
    assert manifest.kind == "ngram" and manifest.format == "ngram_binary"
    assert manifest.files["model"].path == "model.lmbin"
    assert manifest.files["arpa"].path == "model.arpa"
    assert manifest.ngram is not None and manifest.ngram.order == 3
    loaded = NgramModel.load(manifest.file_path(folder, "model"))
    batch = encode_token_lists(TEXTS, model.vocab)
    assert loaded.score(batch).totals.tolist() == model.score(batch).totals.tolist()


def _set_version(path: Path, version: int) -> None:
    data = bytearray(path.read_bytes())
    data[8:12] = version.to_bytes(4, "little")
    path.write_bytes(bytes(data))


def test_older_binary_falls_back_to_the_arpa_copy(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from lmserve.server.backends.ngram.binary import VERSION
    from lmserve.server.backends.ngram.folder import load_model_folder_binary

    model = NgramModel.from_arpa(FIXTURES / "toy.arpa")
    folder = tmp_path / "toy"
    manifest = write_model_folder(
        model,
        folder,
        name="toy-3gram",
        tokenizer=TokenizerSpec(),
        provenance=Provenance(trained_by="hand"),
        arpa_source=FIXTURES / "toy.arpa",
    )
    _set_version(folder / "model.lmbin", VERSION - 1)
    with caplog.at_level("WARNING"):
        loaded = load_model_folder_binary(folder, manifest)
    assert "rebuild" in caplog.text.lower() and "import-arpa" in caplog.text
    batch = encode_token_lists(TEXTS, model.vocab)
    assert loaded.score(batch).totals.tolist() == model.score(batch).totals.tolist()

    # Without the ARPA copy: a clear error naming the file and both versions.
    del manifest.files["arpa"]
    with pytest.raises(ModelLoadError, match=f"version {VERSION - 1}, expected {VERSION}") as err:
        load_model_folder_binary(folder, manifest)
    assert "model.lmbin" in str(err.value)
    # A current binary loads without the fallback.
    _set_version(folder / "model.lmbin", VERSION)
    assert load_model_folder_binary(folder, manifest).score(batch).totals.tolist() == (
        model.score(batch).totals.tolist()
    )


def test_damaged_bigram_lists_are_refused(tmp_path: Path) -> None:
    """Next-word distributions read the bigram lists: offsets that leave the list are refused
    when loading, not met inside the C kernel."""
    path = tmp_path / "m.lmbin"
    NgramModel.from_arpa(FIXTURES / "toy.arpa").save(path)
    data = bytearray(path.read_bytes())
    header = json.loads(data[24 : 24 + int.from_bytes(data[12:16], "little")])
    start = next(e for e in header["arrays"] if e["name"] == "bigram_start")
    data[start["offset"] + 4 * 2] = 0xFF  # one offset past the end of the list
    path.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match="bigram lists"):
        NgramModel.load(path)
