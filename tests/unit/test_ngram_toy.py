"""Hand-computed scores on a tiny trigram (tests/fixtures/ngram/toy.arpa), in log10.

Every expected value below is worked out by hand from the ARPA lines with the back-off rule
log p(w | h) = log p(longest n-gram) + backoffs of the longer contexts KenLM's state holds.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from lmserve.server.backends.ngram.model import NgramModel
from lmserve.server.text.word import encode_token_lists

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "ngram"
LN10 = math.log(10.0)


@pytest.fixture(scope="module")
def toy() -> NgramModel:
    return NgramModel.from_arpa(FIXTURES / "toy.arpa")


def score(
    model: NgramModel, text: str, *, bos: bool = True, eos: bool = True
) -> tuple[float, list[float], list[int]]:
    batch = encode_token_lists([text.split()], model.vocab)
    s = model.score(batch, bos=bos, eos=eos, per_token=True)
    assert s.token_log_probs is not None and s.ngram_lengths is not None
    per_token = (s.token_log_probs / LN10).tolist()
    assert sum(per_token) == pytest.approx(s.totals[0] / LN10, abs=1e-9)
    return float(s.totals[0] / LN10), per_token, s.ngram_lengths.tolist()


CASES = [
    # text, bos, eos, per-token log10, n-gram lengths
    ("a b c", True, True, [-0.2, -0.05, -0.1, -0.15 + 0.0], [2, 3, 3, 2]),
    # "<s> c", "c a", "a </s>" all missing: unigram + the context backoffs.
    ("c a", True, True, [-0.8 - 0.5, -0.6 - 0.1, -0.5 - 0.3], [1, 1, 1]),
    # b after "a b": no "a b b", no "b b" -> p(b) + bo(a b) + bo(b); then "b </s>" + bo(b b)=0.
    ("a b b", True, True, [-0.2, -0.05, -0.7 - 0.25 - 0.2, -0.45], [2, 3, 1, 2]),
    # OOV -> <unk>: p(<unk>) + bo(<s> a) + bo(a); then </s> after <unk>: + bo(<unk>) = 0.
    ("a zzz", True, True, [-0.2, -1.0 - 0.4 - 0.3, -0.5], [2, 1, 1]),
    # No <s>: a from the empty context; </s> after "a b": "b </s>" + bo(a b).
    ("a b", False, True, [-0.6, -0.3, -0.45 - 0.25], [1, 2, 2]),
    ("a b", True, False, [-0.2, -0.05], [2, 3]),
    ("a b", False, False, [-0.6, -0.3], [1, 2]),
    # The empty text is just </s> after <s>: p(</s>) + bo(<s>).
    ("", True, True, [-0.5 - 0.5], [1]),
    ("", False, True, [-0.5], [1]),
    ("", True, False, [], []),
]


@pytest.mark.parametrize(("text", "bos", "eos", "expected", "lengths"), CASES)
def test_hand_computed(
    toy: NgramModel, text: str, bos: bool, eos: bool, expected: list[float], lengths: list[int]
) -> None:
    total, per_token, got_lengths = score(toy, text, bos=bos, eos=eos)
    assert per_token == pytest.approx(expected, abs=1e-6)
    assert total == pytest.approx(sum(expected), abs=1e-6)
    assert got_lengths == lengths


def test_batch_equals_one_by_one(toy: NgramModel) -> None:
    texts = [c[0].split() for c in CASES] * 3
    for bos in (True, False):
        for eos in (True, False):
            batch = toy.score(encode_token_lists(texts, toy.vocab), bos=bos, eos=eos)
            single = [
                toy.score(encode_token_lists([t], toy.vocab), bos=bos, eos=eos).totals[0]
                for t in texts
            ]
            np.testing.assert_allclose(batch.totals, single, atol=1e-9)


def test_missing_context_is_filled(tmp_path: Path) -> None:
    # "c a b" exists but its context "c a" does not: "c a" becomes a fill-in entry with the
    # backed-off probability p(a) + bo(c) and no backoff.
    model = NgramModel.from_arpa(FIXTURES / "toy_pruned.arpa")
    _, per_token, lengths = score(model, "c a b")
    assert per_token == pytest.approx([-0.8 - 0.5, -0.6 - 0.1, -0.02, -0.45 - 0.25], abs=1e-6)
    assert lengths == [1, 2, 3, 2]
    assert model.ngram_counts() == [6, 5, 3]


def test_next_token_hand_computed(toy: NgramModel) -> None:
    v = toy.vocab.index
    dist = toy.next_token_log_probs([v["a"], v["b"]]) / LN10
    assert dist[v["c"]] == pytest.approx(-0.1, abs=1e-6)
    assert dist[v["</s>"]] == pytest.approx(-0.45 - 0.25, abs=1e-6)
    assert dist[v["a"]] == pytest.approx(-0.6 - 0.25 - 0.2, abs=1e-6)
    assert dist[v["b"]] == pytest.approx(-0.7 - 0.25 - 0.2, abs=1e-6)
    empty = toy.next_token_log_probs([], bos=False) / LN10
    assert empty[v["a"]] == pytest.approx(-0.6, abs=1e-6)


def test_next_token_matches_score(toy: NgramModel) -> None:
    ids = toy.vocab.index
    for context in (["a"], ["a", "b"], ["c", "a"], [], ["b", "b", "c"]):
        for bos in (True, False):
            dist = toy.next_token_log_probs([ids[w] for w in context], bos=bos)
            for word in ("a", "b", "c", "</s>", "<unk>"):
                batch = encode_token_lists([[*context, word]], toy.vocab)
                s = toy.score(batch, bos=bos, eos=False, per_token=True)
                assert s.token_log_probs is not None
                assert dist[ids[word]] == pytest.approx(s.token_log_probs[-1], abs=1e-6)


def test_probing_table_finds_every_key_and_no_other() -> None:
    from lmserve.server.backends.ngram.hashing import EMPTY, ProbingTable

    rng = np.random.default_rng(3)
    keys = np.unique(rng.integers(0, 2**40, size=5000, dtype=np.uint64))
    rng.shuffle(keys)
    probs = rng.standard_normal(len(keys)).astype(np.float32)
    table, placed = ProbingTable.build(keys, probs, -probs)
    assert table.slots["key"][-1] == EMPTY and len(table.slots) > table.n_home
    slots = table.lookup(keys)
    np.testing.assert_array_equal(slots, placed)
    assert (slots >= 0).all()
    np.testing.assert_array_equal(table.slots["key"][slots], keys)
    np.testing.assert_array_equal(table.slots["prob"][slots], probs)
    np.testing.assert_array_equal(table.slots["backoff"][slots], -probs)
    absent = np.setdiff1d(rng.integers(0, 2**40, size=5000, dtype=np.uint64), keys)
    assert (table.lookup(absent) == -1).all()
    assert [table.get(int(k)) for k in keys[:50]] == slots[:50].tolist()
    assert table.get(int(absent[0])) == -1
