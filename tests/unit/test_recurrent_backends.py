"""ONNX Runtime and TorchScript backends against the PyTorch model they were exported from."""

from __future__ import annotations

import shutil
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from neural_folders import (
    VOCAB,
    eager_token_log_probs,
    tiny_model,
    write_onnx_folder,
    write_torchscript_folder,
)

from lmserve.export.rnn.model import RecurrentLM
from lmserve.server.backends.base import EncodedBatch
from lmserve.server.backends.onnx import OnnxBackend, OnnxOptions
from lmserve.server.backends.recurrent import RecurrentBackend
from lmserve.server.backends.torchscript import TorchScriptBackend
from lmserve.server.errors import ModelLoadError, Unimplemented
from lmserve.server.families.family import LoadContext
from lmserve.server.families.loading import load_backend
from lmserve.server.manifest import read_manifest, sha256_of

TEXTS = [[3, 4, 5], [], [6, 7, 8, 9, 10, 3, 4, 5, 6, 7, 8], [0, 3], [9] * 30]


def _batch(texts: Sequence[Sequence[int]]) -> EncodedBatch:
    ids = np.array([i for t in texts for i in t], dtype=np.int32)
    offsets = np.cumsum([0, *map(len, texts)]).astype(np.int64)
    return EncodedBatch(ids=ids, offsets=offsets, oov=ids == 0)


@pytest.fixture(scope="module", params=["lstm", "gru", "rnn"])
def exported(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[RecurrentLM, Path, Path]:
    cell = request.param
    model = tiny_model(cell)
    root = tmp_path_factory.mktemp(cell)
    write_onnx_folder(model, VOCAB, root / "onnx", name=f"{cell}-onnx")
    write_torchscript_folder(model, VOCAB, root / "ts", name=f"{cell}-ts")
    return model, root / "onnx", root / "ts"


def _load(folder: Path, chunk: int = 256) -> RecurrentBackend:
    backend = load_backend(
        folder, read_manifest(folder), LoadContext(OnnxOptions(max_chunk_tokens=chunk))
    )
    assert isinstance(backend, RecurrentBackend)
    return backend


@pytest.mark.parametrize("fmt", ["onnx", "ts"])
@pytest.mark.parametrize("eos", [True, False])
def test_scores_equal_the_pytorch_model(
    exported: tuple[RecurrentLM, Path, Path], fmt: str, eos: bool
) -> None:
    model, onnx_dir, ts_dir = exported
    backend = _load(onnx_dir if fmt == "onnx" else ts_dir)
    scores = backend.score(_batch(TEXTS), eos=eos, per_token=True)
    assert scores.token_log_probs is not None and scores.token_offsets is not None
    for i, text in enumerate(TEXTS):
        expected = eager_token_log_probs(model, text, eos=eos)
        lo, hi = scores.token_offsets[i], scores.token_offsets[i + 1]
        np.testing.assert_allclose(scores.token_log_probs[lo:hi], expected, atol=1e-4)
        assert scores.totals[i] == pytest.approx(sum(expected), abs=1e-4)
    assert np.diff(scores.token_offsets)[1] == (1 if eos else 0)  # the empty text: </s> alone


@pytest.mark.parametrize("fmt", ["onnx", "ts"])
def test_batch_equals_one_by_one_and_chunks_equal_whole(
    exported: tuple[RecurrentLM, Path, Path], fmt: str
) -> None:
    folder = exported[1] if fmt == "onnx" else exported[2]
    whole = _load(folder).score(_batch(TEXTS), per_token=True)
    alone = np.array([_load(folder).score(_batch([t])).totals[0] for t in TEXTS])
    np.testing.assert_allclose(whole.totals, alone, atol=1e-5)
    chunked = _load(folder, chunk=4).score(_batch(TEXTS), per_token=True)
    assert chunked.token_log_probs is not None and whole.token_log_probs is not None
    np.testing.assert_allclose(chunked.token_log_probs, whole.token_log_probs, atol=1e-5)


def test_next_token_and_step_agree_with_pytorch(exported: tuple[RecurrentLM, Path, Path]) -> None:
    model, onnx_dir, ts_dir = exported
    with torch.no_grad():
        logits, _ = model(torch.tensor([[1, 3, 4, 5]]), model.initial_state(1))
        expected = torch.log_softmax(logits[0].double(), dim=-1).numpy()
    for folder in (onnx_dir, ts_dir):
        backend = _load(folder, chunk=2)
        np.testing.assert_allclose(backend.next_token_log_probs([3, 4, 5]), expected[-1], atol=1e-4)
        assert np.exp(backend.next_token_log_probs([])).sum() == pytest.approx(1.0, abs=1e-4)
        # Token by token with the state carried equals one call over the sequence.
        state = backend.initial_state(1)
        for t, token in enumerate([1, 3, 4, 5]):
            lp, state = backend.step(np.array([[token]]), state)
            np.testing.assert_allclose(lp[0, 0], expected[t], atol=1e-4)


def test_bos_off_is_refused(exported: tuple[RecurrentLM, Path, Path]) -> None:
    with pytest.raises(Unimplemented, match="bos"):
        _load(exported[1]).score(_batch(TEXTS), bos=False)


def test_torchscript_load_is_quiet(exported: tuple[RecurrentLM, Path, Path]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        TorchScriptBackend.load(exported[2], read_manifest(exported[2]), max_chunk_tokens=8)


def _rewrite(folder: Path, edit: dict[str, object]) -> None:
    path = folder / "model.yaml"
    manifest = yaml.safe_load(path.read_text())
    for key, value in edit.items():
        target = manifest
        *parents, last = key.split(".")
        for p in parents:
            target = target[p]
        target[last] = value
    for entry in manifest["files"].values():
        entry["sha256"] = sha256_of(folder / entry["path"])
    path.write_text(yaml.safe_dump(manifest))


def test_broken_folders_are_refused_naming_file_and_reason(
    exported: tuple[RecurrentLM, Path, Path], tmp_path: Path
) -> None:
    model, onnx_dir, ts_dir = exported
    cell = model.config.cell

    corrupt = tmp_path / "corrupt"
    shutil.copytree(onnx_dir, corrupt)
    (corrupt / "score.onnx").write_bytes(b"\x08garbage")
    _rewrite(corrupt, {})
    with pytest.raises(ModelLoadError, match=r"score\.onnx: ONNX Runtime cannot load it"):
        _load(corrupt)

    bigger = tmp_path / "vocab"
    shutil.copytree(onnx_dir, bigger)
    (bigger / "vocab.txt").write_text("\n".join([*VOCAB, "extra"]) + "\n")
    _rewrite(bigger, {"architecture.vocab_size": len(VOCAB) + 1})
    with pytest.raises(ModelLoadError, match=r"step\.onnx: output 'log_probs' has size"):
        _load(bigger)

    short = tmp_path / "short-vocab"
    shutil.copytree(onnx_dir, short)
    (short / "vocab.txt").write_text("\n".join(VOCAB[:-1]) + "\n")
    _rewrite(short, {})
    with pytest.raises(ModelLoadError, match=r"vocab\.txt: has 17 tokens"):
        _load(short)

    ts_big = tmp_path / "ts-vocab"
    shutil.copytree(ts_dir, ts_big)
    (ts_big / "vocab.txt").write_text("\n".join([*VOCAB, "extra"]) + "\n")
    _rewrite(ts_big, {"architecture.vocab_size": len(VOCAB) + 1})
    with pytest.raises(ModelLoadError, match=r"model\.ts: step\(\) gives 18 log-probs"):
        _load(ts_big)

    if cell != "lstm":  # an h-only graph declared as an LSTM lacks the c input
        lying = tmp_path / "no-c"
        shutil.copytree(onnx_dir, lying)
        _rewrite(lying, {"kind": "lstm", "architecture.cell": "lstm"})
        _rewrite(lying, {"architecture.state_names": ["h", "c"]})
        with pytest.raises(ModelLoadError, match=r"score\.onnx: graph has no input 'c'"):
            _load(lying)


def test_onnx_options_reach_the_session(exported: tuple[RecurrentLM, Path, Path]) -> None:
    folder = exported[1]
    backend = OnnxBackend.load(folder, read_manifest(folder), OnnxOptions(intra_op_threads=1))
    assert backend.providers[-1] == "CPUExecutionProvider"
