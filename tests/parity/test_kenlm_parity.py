"""Parity with KenLM: its own test models and references, the KJV models, and the kenlm module.

Data lives in the shared folder beside the repository (`<repo>/../shared/data`).
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest

from lmserve.server.backends.ngram.arpa import read_arpa
from lmserve.server.backends.ngram.build import build_tables
from lmserve.server.backends.ngram.model import NgramModel
from lmserve.server.backends.ngram.tables import NgramTables
from lmserve.server.text.word import encode_token_lists

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / ".." / "shared" / "data"
KENLM_TESTS = DATA / "kenlm-tests"
KJV = DATA / "kjv"
LN10 = math.log(10.0)

pytestmark = pytest.mark.skipif(not DATA.is_dir(), reason="shared data not present")


@pytest.mark.parametrize("name", ["test.arpa", "test_nounk.arpa"])
def test_kenlm_test_models(name: str) -> None:
    model = NgramModel.from_arpa(KENLM_TESTS / name)
    refs = [json.loads(line) for line in (KENLM_TESTS / "reference.jsonl").open()]
    refs = [r for r in refs if r["model"] == name]
    assert len(refs) == 158 * 4
    for bos in (True, False):
        for eos in (True, False):
            group = [r for r in refs if r["bos"] == bos and r["eos"] == eos]
            batch = encode_token_lists([r["sentence"].split() for r in group], model.vocab)
            got = model.score(batch, bos=bos, eos=eos, per_token=True)
            assert got.token_log_probs is not None and got.token_offsets is not None
            assert got.ngram_lengths is not None
            np.testing.assert_allclose(
                got.totals / LN10, [r["total_log10"] for r in group], atol=1e-4
            )
            want = [t for r in group for t in r["tokens"]]
            np.testing.assert_allclose(
                got.token_log_probs / LN10, [t["log10"] for t in want], atol=1e-4
            )
            assert got.ngram_lengths.tolist() == [t["ngram_length"] for t in want]
            # OOV flags cover the words only (</s> is never OOV).
            flags = [t["oov"] for r in group for t in r["tokens"][: len(r["sentence"].split())]]
            assert batch.oov.tolist() == flags


@pytest.fixture(scope="module")
def kjv5_models(tmp_path_factory: pytest.TempPathFactory) -> list[NgramModel]:
    """The KJV 5-gram from its ARPA (the streaming C import and the numpy reference build) and
    from the binary compiled from it."""
    arpa = KJV / "kenlm" / "kjv.5gram.arpa.gz"
    from_arpa = NgramModel.from_arpa(arpa)
    binary = tmp_path_factory.mktemp("kjv5") / "kjv5.lmbin"
    from_arpa.save(binary)
    # The C kernel (the default) on all, and the numpy reference scoring path.
    numpy_path = NgramModel(from_arpa.tables, kernel="numpy")
    numpy_build = NgramModel(build_tables(read_arpa(arpa)))
    return [from_arpa, NgramModel.load(binary), numpy_path, numpy_build]


def test_kjv5_reference_totals(kjv5_models: list[NgramModel]) -> None:
    rows = [line.split("\t") for line in (KJV / "kenlm" / "reference.tsv").read_text().split("\n")]
    rows = [r for r in rows[1:] if len(r) == 3]
    assert len(rows) == 200
    lines = (KJV / "test.txt").read_text().split("\n")[:200]
    for model in kjv5_models:
        batch = encode_token_lists([line.split() for line in lines], model.vocab)
        got = model.score(batch).totals / LN10
        np.testing.assert_allclose(got, [float(r[1]) for r in rows], atol=1e-4)
        oov = np.add.reduceat(batch.oov.astype(np.int64), batch.offsets[:-1])
        assert oov.tolist() == [int(r[2]) for r in rows]


def test_kjv5_perplexity(kjv5_models: list[NgramModel]) -> None:
    texts = [line.split() for line in (KJV / "test.txt").read_text().splitlines()]
    for model in kjv5_models:
        batch = encode_token_lists(texts, model.vocab)
        s = model.score(batch, per_token=True)
        assert s.token_log_probs is not None
        n_tokens = len(batch.ids) + len(texts)
        assert n_tokens == 41387 and int(batch.oov.sum()) == 230
        assert math.exp(-s.totals.sum() / n_tokens) == pytest.approx(57.3512, abs=1e-3)
        # Without OOVs: drop the OOV words' own scores (KenLM's "Perplexity excluding OOVs").
        is_oov = np.zeros(len(s.token_log_probs), dtype=np.bool_)
        word_pos = np.arange(len(batch.ids)) + np.repeat(
            np.arange(len(texts)), np.diff(batch.offsets)
        )
        is_oov[word_pos[batch.oov]] = True
        no_oov = -s.token_log_probs[~is_oov].sum() / (n_tokens - 230)
        assert math.exp(no_oov) == pytest.approx(54.3300, abs=1e-3)


@pytest.fixture(scope="module")
def kjv3_tables() -> NgramTables:
    return NgramModel.from_arpa(KJV / "kenlm" / "kjv.3gram.arpa").tables


@pytest.fixture(scope="module", params=["c", "numpy"])
def kjv3(kjv3_tables: NgramTables, request: pytest.FixtureRequest) -> NgramModel:
    return NgramModel(kjv3_tables, kernel=request.param)


def test_random_sentences_against_kenlm_module(kjv3: NgramModel) -> None:
    import kenlm

    reference = kenlm.Model(str(KJV / "kenlm" / "kjv.3gram.arpa"))
    rng = random.Random(1234)
    words = list(kjv3.vocab.words)
    extra = ["qwertz", "<unk>", "<s>", "</s>", "zebra"]
    texts = []
    for _ in range(300):
        n = rng.randrange(0, 25)
        texts.append(
            [rng.choice(extra) if rng.random() < 0.08 else rng.choice(words) for _ in range(n)]
        )
    # Real verses too, cut at random points, so that long n-gram matches occur.
    verses = (KJV / "test.txt").read_text().splitlines()
    texts += [v.split()[: rng.randrange(1, 30)] for v in rng.sample(verses, 100)]
    for bos, eos in ((True, True), (False, True), (True, False), (False, False)):
        batch = encode_token_lists(texts, kjv3.vocab)
        got = kjv3.score(batch, bos=bos, eos=eos, per_token=True)
        assert got.token_log_probs is not None and got.ngram_lengths is not None
        want = [r for t in texts for r in reference.full_scores(" ".join(t), bos=bos, eos=eos)]
        np.testing.assert_allclose(got.token_log_probs / LN10, [w[0] for w in want], atol=1e-4)
        assert got.ngram_lengths.tolist() == [w[1] for w in want]
        totals = [reference.score(" ".join(t), bos=bos, eos=eos) for t in texts]
        np.testing.assert_allclose(got.totals / LN10, totals, atol=1e-4)


@pytest.mark.parametrize(
    ("context", "bos"),
    [
        ([], True),
        ([], False),
        (["in", "the"], True),
        (["and", "the", "lord", "said"], True),
        (["qwertz", "of"], True),
        (["the", "zebra"], False),
        (["unto", "moses"], False),
    ],
)
def test_next_token_distribution(kjv3: NgramModel, context: list[str], bos: bool) -> None:
    vocab = kjv3.vocab
    ids = encode_token_lists([context], vocab).ids.tolist()
    dist = kjv3.next_token_log_probs(ids, bos=bos)
    assert dist.shape == (len(vocab),)
    # lmplz's model is normalised; <s> (log10 prob -99 or 0 as context-only) is excluded.
    mask = np.ones(len(vocab), dtype=np.bool_)
    mask[vocab.bos_id] = False
    assert np.exp(dist[mask]).sum() == pytest.approx(1.0, abs=1e-4)
    # Each entry equals scoring that word after the context.
    sample = random.Random(len(context)).sample(range(len(vocab)), 200) + [vocab.eos_id]
    texts = [[*context, vocab.words[w]] for w in sample]
    got = kjv3.score(encode_token_lists(texts, vocab), bos=bos, eos=False, per_token=True)
    assert got.token_log_probs is not None and got.token_offsets is not None
    last = got.token_log_probs[got.token_offsets[1:] - 1]
    np.testing.assert_allclose(dist[sample], last, atol=1e-9)
