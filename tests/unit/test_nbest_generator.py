"""The n-best generator of bench/nbest: reproducible by seed, and shaped as documented."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
from bench_modules import load_bench_module

from lmserve.client import nbest as nbest_io

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "tests" / "data" / "nbest" / "kjv-test.jsonl"


@pytest.fixture(scope="module")
def make_nbest() -> ModuleType:
    return load_bench_module("nbest/make_nbest.py")


@pytest.fixture(scope="module")
def regenerated(make_nbest: ModuleType) -> str:
    text: str = make_nbest.to_jsonl(make_nbest.generate("test", 150, 1))
    return text


def test_seed_reproduces_the_committed_set_byte_for_byte(regenerated: str) -> None:
    assert regenerated.encode("utf-8") == COMMITTED.read_bytes()


def test_another_seed_gives_another_set(make_nbest: ModuleType, regenerated: str) -> None:
    assert make_nbest.to_jsonl(make_nbest.generate("test", 150, 2)) != regenerated


def test_lists_are_shaped_as_documented(make_nbest: ModuleType) -> None:
    lists = list(nbest_io.read_jsonl(COMMITTED.open(encoding="utf-8"), str(COMMITTED)))
    assert len(lists) == 150
    test_lines = (REPO / "export/lmserve/export/corpora/kjv/test.txt").read_text().splitlines()
    with_truth = 0
    for nb in lists:
        assert nb.reference == test_lines[int(nb.id.removeprefix("test-"))]
        assert 5 <= len(nb.reference.split()) <= 16
        assert 10 <= len(nb.hypotheses) <= 50
        texts = [h.display() for h in nb.hypotheses]
        assert len(set(texts)) == len(texts) and all(texts)
        acoustic = [h.scores["acoustic"] for h in nb.hypotheses]
        assert acoustic == sorted(acoustic, reverse=True)
        distances = [make_nbest.edit_distance(t.split(), nb.reference.split()) for t in texts]
        assert max(distances) <= make_nbest.MAX_ERRORS
        with_truth += nb.reference in texts
    # The truth is in the list about 80% of the time, never always.
    assert 0.7 < with_truth / len(lists) < 0.9


def test_confusions_are_close_vocabulary_words(make_nbest: ModuleType) -> None:
    from collections import Counter

    counts = Counter("their there the then they thee rejoice rejoiced nations nation".split())
    confusions = make_nbest.Confusions(counts)
    assert "there" in confusions.of("their") or "their" in confusions.of("there")
    assert set(confusions.of("the")) == {"then", "they", "thee"}
    assert "rejoiced" in confusions.of("rejoice") and "nation" in confusions.of("nations")
    assert "the" not in confusions.of("the")


def test_acoustic_only_wer_is_well_above_oracle(make_nbest: ModuleType) -> None:
    import json

    records = [json.loads(line) for line in COMMITTED.read_text().splitlines()]
    summary = make_nbest.summary(records)
    assert summary["acoustic_only_wer"] > 3 * summary["oracle_wer"] > 0
