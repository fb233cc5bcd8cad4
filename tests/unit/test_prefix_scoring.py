"""Prefix-shared scoring equals scoring every sequence alone, and computes each prefix once."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from lmserve.server.backends.base import EncodedBatch, LanguageModelBackend
from lmserve.server.backends.ngram.model import NgramModel
from lmserve.server.decoding.prefix_scoring import PrefixScoring, PrefixTrie
from lmserve.server.families.catalog import make_stepper

TOY = Path(__file__).resolve().parents[1] / "fixtures" / "ngram" / "toy.arpa"


def _sequences(rng: np.random.Generator, ids: list[int], count: int) -> list[list[int]]:
    base = rng.choice(ids, size=8).tolist()
    out = []
    for _ in range(count):  # n-best-like: a shared start, then branches
        keep = int(rng.integers(0, 9))
        tail = rng.choice(ids, size=int(rng.integers(0, 5))).tolist()
        out.append(base[:keep] + tail)
    return out


def _distinct_prefixes(sequences: list[list[int]]) -> int:
    return len({tuple(s[:k]) for s in sequences for k in range(len(s) + 1)})


def test_trie_nodes_are_the_distinct_prefixes_in_breadth_first_order() -> None:
    rng = np.random.default_rng(0)
    for _ in range(30):
        seqs = _sequences(rng, [3, 4, 5, 6], int(rng.integers(1, 20)))
        trie = PrefixTrie.build(seqs)
        assert trie.nodes == _distinct_prefixes(seqs)
        assert np.all(np.diff(trie.depth) >= 0)
        for i, seq in enumerate(seqs):  # walking up from the end spells the sequence
            node, spelled = int(trie.end[i]), []
            while node != 0:
                spelled.append(int(trie.token[node]))
                node = int(trie.parent[node])
            assert spelled[::-1] == seq


def _alone(backend: LanguageModelBackend, seqs: list[list[int]], eos: bool) -> np.ndarray:
    offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
    np.cumsum([len(s) for s in seqs], out=offsets[1:])
    ids = np.asarray([t for s in seqs for t in s], dtype=np.int32)
    batch = EncodedBatch(ids=ids, offsets=offsets, oov=np.zeros(len(ids), dtype=bool))
    return np.asarray(backend.score(batch, eos=eos).totals)


@pytest.mark.parametrize("eos", [True, False])
@pytest.mark.parametrize("rows_per_step", [1, 3, 256])
def test_ngram_prefix_scores_equal_scoring_alone(eos: bool, rows_per_step: int) -> None:
    model = NgramModel.from_arpa(TOY)
    words = [model.vocab.index[w] for w in ("a", "b", "c")] + [model.vocab.unk_id]
    seqs = _sequences(np.random.default_rng(3), words, 25) + [[]]
    scoring = PrefixScoring(
        make_stepper(model), PrefixTrie.build(seqs), eos=eos, rows_per_step=rows_per_step
    )
    calls = sum(1 for _ in scoring.steps())
    np.testing.assert_allclose(scoring.totals, _alone(model, seqs, eos), atol=1e-5)
    assert scoring.computed <= _distinct_prefixes(seqs)
    assert calls >= 2


def test_recurrent_prefix_scores_equal_scoring_alone(tmp_path: Path) -> None:
    from neural_folders import VOCAB, tiny_model, write_onnx_folder

    from lmserve.server.backends.onnx import OnnxOptions
    from lmserve.server.families.family import LoadContext
    from lmserve.server.families.loading import load_backend
    from lmserve.server.manifest import read_manifest

    folder = tmp_path / "lstm"
    write_onnx_folder(tiny_model("lstm"), VOCAB, folder, name="lstm")
    backend = load_backend(folder, read_manifest(folder), LoadContext(OnnxOptions()))
    ids = list(range(3, len(VOCAB)))
    seqs = _sequences(np.random.default_rng(5), ids, 40)
    scoring = PrefixScoring(make_stepper(backend), PrefixTrie.build(seqs), eos=True)
    for _ in scoring.steps():
        pass
    np.testing.assert_allclose(scoring.totals, _alone(backend, seqs, True), atol=1e-4)
    tokens = sum(len(s) + 1 for s in seqs)
    assert scoring.computed < tokens  # shared prefixes were computed once
