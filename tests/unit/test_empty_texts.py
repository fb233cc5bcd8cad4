"""Empty texts anywhere in a scoring batch, `</s>` on and off, in every backend.

An empty text without `</s>` scores no positions; as the batch's last text it used to make
`np.add.reduceat` raise IndexError (recurrent and interpolated backends). Each text's total
and per-token scores must equal those of the text scored alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from neural_folders import VOCAB, tiny_model, write_onnx_folder

from lmserve.server.backends.base import EncodedBatch, LanguageModelBackend
from lmserve.server.backends.interpolated import InterpolatedBackend
from lmserve.server.backends.ngram.model import NgramModel
from lmserve.server.backends.onnx import OnnxOptions
from lmserve.server.backends.segments import segment_sums
from lmserve.server.families.family import LoadContext
from lmserve.server.families.loading import load_backend
from lmserve.server.manifest import read_manifest

NGRAMS = ["ngram", "ngram-numpy"]
NAMES = ["lstm", "mix", *NGRAMS]
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "ngram"
WORDS = [3, 4, 5, 6, 7]
LAYOUTS = {
    "last": [WORDS[:3], [9, 10], []],
    "first": [[], WORDS[:3], [9, 10]],
    "middle": [WORDS[:3], [], [], [9, 10]],
    "only": [[]],
    "all": [[], [], []],
    "one word last": [WORDS[:3], [8], []],
}


def _batch(texts: Sequence[Sequence[int]]) -> EncodedBatch:
    ids = np.array([i for t in texts for i in t], dtype=np.int32)
    offsets = np.cumsum([0, *map(len, texts)]).astype(np.int64)
    return EncodedBatch(ids=ids, offsets=offsets, oov=ids == 0)


@pytest.fixture(scope="module")
def backends(tmp_path_factory: pytest.TempPathFactory) -> dict[str, LanguageModelBackend]:
    root = tmp_path_factory.mktemp("empty-texts")
    loaded = {}
    for name, cell, vocab in (("lstm", "lstm", VOCAB), ("gru", "gru", VOCAB[::-1])):
        write_onnx_folder(tiny_model(cell, vocab, seed=4), vocab, root / name, name=name)
        folder = root / name
        context = LoadContext(OnnxOptions(max_chunk_tokens=4))  # chunks carry the state too
        loaded[name] = load_backend(folder, read_manifest(folder), context)
    loaded["mix"] = InterpolatedBackend([(loaded["lstm"], 0.3), (loaded["gru"], 0.7)])
    loaded["ngram"] = NgramModel.from_arpa(FIXTURES / "toy.arpa", kernel="c")
    loaded["ngram-numpy"] = NgramModel.from_arpa(FIXTURES / "toy.arpa", kernel="numpy")
    return loaded


def _ids(backend: LanguageModelBackend, texts: list[list[int]]) -> list[list[int]]:
    """The layout's ids for this backend: the toy n-gram has only a few words."""
    if isinstance(backend, NgramModel):
        n = len(backend.vocab)
        return [[3 + i % (n - 3) for i in t] for t in texts]
    return texts


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("eos", [True, False])
@pytest.mark.parametrize(("name", "bos"), [(n, True) for n in NAMES] + [(n, False) for n in NGRAMS])
def test_each_text_scores_as_it_does_alone(
    backends: dict[str, LanguageModelBackend], name: str, eos: bool, bos: bool, layout: str
) -> None:
    backend = backends[name]  # recurrent models always read <s>: bos off is n-gram only
    texts = _ids(backend, LAYOUTS[layout])
    got = backend.score(_batch(texts), bos=bos, eos=eos, per_token=True)
    totals = backend.score(_batch(texts), bos=bos, eos=eos).totals
    assert got.token_log_probs is not None and got.token_offsets is not None
    assert len(got.totals) == len(totals) == len(texts)
    np.testing.assert_allclose(totals, got.totals, atol=1e-9)
    for i, text in enumerate(texts):
        alone = backend.score(_batch([text]), bos=bos, eos=eos, per_token=True)
        assert alone.token_log_probs is not None
        lo, hi = got.token_offsets[i], got.token_offsets[i + 1]
        assert hi - lo == len(text) + int(eos)
        np.testing.assert_allclose(got.token_log_probs[lo:hi], alone.token_log_probs, atol=1e-5)
        assert got.totals[i] == pytest.approx(float(alone.totals[0]), abs=1e-5)
        if not text and not eos:
            assert got.totals[i] == 0.0
        else:
            assert got.totals[i] < 0.0


def test_segment_sums_match_python_sums() -> None:
    rng = np.random.default_rng(0)
    for _ in range(50):
        lengths = rng.integers(0, 4, size=rng.integers(0, 8))
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        values = rng.normal(size=int(offsets[-1]))
        want = [sum(values[a:b].tolist()) for a, b in zip(offsets[:-1], offsets[1:], strict=True)]
        np.testing.assert_allclose(segment_sums(values, offsets), want, atol=1e-12)
