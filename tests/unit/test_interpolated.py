"""The interpolated backend mixes per-token probabilities; `lmserve interpolate` tunes by EM."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from neural_folders import VOCAB, tiny_model, write_onnx_folder

from lmserve.export.interpolation import em_weights, mixture_perplexity
from lmserve.server.backends.base import EncodedBatch, Vocabulary
from lmserve.server.backends.interpolated import InterpolatedBackend, common_vocabulary
from lmserve.server.cli import main
from lmserve.server.registry.repository import ModelRepository, ModelState


def _batch(texts: list[list[int]]) -> EncodedBatch:
    ids = np.array([i for t in texts for i in t], dtype=np.int32)
    offsets = np.cumsum([0, *map(len, texts)]).astype(np.int64)
    return EncodedBatch(ids=ids, offsets=offsets, oov=ids == 0)


def test_common_vocabulary_keeps_the_first_order_then_adds() -> None:
    a = Vocabulary.from_words(["<unk>", "<s>", "</s>", "x", "y"])
    b = Vocabulary.from_words(["<s>", "</s>", "<unk>", "z", "y"])
    assert common_vocabulary([a, b]).words == ("<unk>", "<s>", "</s>", "x", "y", "z")


def test_em_finds_the_likelihood_maximum() -> None:
    rng = np.random.default_rng(0)
    lp = np.log(rng.uniform(0.01, 1.0, size=(2, 500)))
    weights, _ = em_weights(lp)
    best = mixture_perplexity(lp, weights)
    for w in (0.0, 0.2, 0.5, 0.8, 1.0):
        assert best <= mixture_perplexity(lp, np.array([w, 1 - w])) + 1e-9
    assert weights.sum() == pytest.approx(1.0)


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mix-models")
    write_onnx_folder(tiny_model("lstm", seed=1), VOCAB, root / "a", name="a")
    write_onnx_folder(tiny_model("gru", seed=2), VOCAB[::-1], root / "b", name="b")
    return root


def test_mixture_equals_hand_mixed_components(repository: Path) -> None:
    repo = ModelRepository.load(repository)
    a, b = repo.get("a").backend, repo.get("b").backend
    assert a is not None and b is not None
    mix = InterpolatedBackend([(a, 0.25), (b, 0.75)])
    words = [[3, 4, 5, 0], [], [9, 9, 10]]
    got = mix.score(_batch(words), per_token=True)
    # b's vocabulary is reversed: the same words under other ids.
    b_ids = [[b.vocab.index[mix.vocab.words[i]] for i in t] for t in words]
    pa = a.score(_batch(words), per_token=True).token_log_probs
    pb = b.score(_batch(b_ids), per_token=True).token_log_probs
    assert pa is not None and pb is not None and got.token_log_probs is not None
    np.testing.assert_allclose(
        got.token_log_probs, np.log(0.25 * np.exp(pa) + 0.75 * np.exp(pb)), atol=1e-6
    )
    nxt = mix.next_token_log_probs([3, 4])
    assert np.exp(nxt).sum() == pytest.approx(1.0, abs=1e-5)


def test_interpolate_command_writes_a_loadable_mixture(repository: Path, tmp_path: Path) -> None:
    heldout = tmp_path / "valid.txt"
    heldout.write_text("the cat sat on the mat\na dog ran to the house\nthe big red dog\n")
    out = repository / "a-b"
    argv = ["interpolate", "--model-repository", str(repository), "--components", "a", "b"]
    assert main([*argv, "--heldout", str(heldout), "--name", "a+b", str(out)]) == 2  # bad name
    assert main([*argv, "--heldout", str(heldout), "--test", str(heldout), str(out)]) == 0
    repo = ModelRepository.load(repository)
    entry = repo.get("a-b")
    assert entry.state is ModelState.READY, entry.load_error
    assert entry.manifest is not None
    metrics = entry.manifest.provenance.metrics
    assert metrics["valid_perplexity"] == pytest.approx(metrics["test_perplexity"])
    assert (
        metrics["valid_perplexity"]
        <= min(metrics["valid_perplexity_a"], metrics["valid_perplexity_b"]) + 1e-9
    )
    weights = [c["weight"] for c in entry.manifest.architecture["components"]]
    assert sum(weights) == pytest.approx(1.0) and 0 <= min(weights)
