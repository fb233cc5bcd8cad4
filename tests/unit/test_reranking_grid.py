"""The local rerank combination and the grid search `rerank-tune` runs on it."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import pytest

from lmserve.client import NBestHypothesis, NBestList, RerankedHypothesis, RerankedList
from lmserve.client.reranking import best_point, combined_score, grid_search, ranking


def _reranked(list_id: str, lm: Sequence[float], lengths: Sequence[int]) -> RerankedList:
    """What a server at lm_weight 1, no bonus, would answer (order does not matter here)."""
    return RerankedList(
        list_id,
        tuple(
            RerankedHypothesis(i, 0, lp, 0.0, n, 0)
            for i, (lp, n) in reversed(list(enumerate(zip(lm, lengths, strict=True))))
        ),
    )


def test_combined_score_by_hand() -> None:
    value = combined_score(
        {"acoustic": -10.0, "other": 2.0},
        -7.0,
        4,
        score_weights={"acoustic": 0.5},
        lm_weight=2.0,
        length_bonus=0.25,
    )
    # 0.5 * -10 + 1 * 2 (no weight given: 1) + 2 * -7 + 0.25 * 4
    assert value == pytest.approx(-5.0 + 2.0 - 14.0 + 1.0)


def test_ranking_breaks_ties_by_lower_index() -> None:
    nbest = NBestList("u", [NBestHypothesis("a", scores={"ac": s}) for s in (-1.0, 0.0, 0.0, -1.0)])
    reranked = _reranked("u", [-1.0, -2.0, -2.0, 0.0], [1, 1, 1, 1])
    # combined: -2, -2, -2, -1 -> index 3 first, then 0, 1, 2 by index.
    order = ranking(nbest, reranked, score_weights={}, lm_weight=1.0, length_bonus=0.0)
    assert order == [3, 0, 1, 2]
    # LM off: acoustic alone, ties 1, 2 then 0, 3.
    assert ranking(nbest, reranked, score_weights={}, lm_weight=0.0, length_bonus=0.0) == [
        1,
        2,
        0,
        3,
    ]


def test_grid_search_matches_brute_force() -> None:
    lists = [
        NBestList(
            "u1",
            [
                NBestHypothesis("the cat", scores={"ac": 0.0}),
                NBestHypothesis("a cat sat", scores={"ac": -1.0}),
            ],
            reference="a cat sat",
        ),
        NBestList(
            "u2",
            [
                NBestHypothesis("dog", scores={"ac": 0.0}),
                NBestHypothesis("the dog", scores={"ac": -2.0}),
            ],
            reference="dog",
        ),
    ]
    reranked = [_reranked("u1", [-3.0, -4.0], [2, 3]), _reranked("u2", [-2.0, -3.0], [1, 2])]

    def errors(refs: Sequence[str], hyps: Sequence[str]) -> float:
        """Share of lists whose 1-best is wrong (enough to tell grid points apart)."""
        return sum(r != h for r, h in zip(refs, hyps, strict=True)) / len(refs)

    lm_weights, bonuses = [0.0, 0.5, 2.0], [0.0, 1.5, 3.0]
    points = grid_search(lists, reranked, lm_weights, bonuses, errors, {"ac": 1.0})
    assert [(p.lm_weight, p.length_bonus) for p in points] == list(
        itertools.product(lm_weights, bonuses)
    )
    for p in points:
        best = []
        for nbest, lm, lengths in (
            (lists[0], [-3.0, -4.0], [2, 3]),
            (lists[1], [-2.0, -3.0], [1, 2]),
        ):
            totals = [
                h.scores["ac"] + p.lm_weight * lm[i] + p.length_bonus * lengths[i]
                for i, h in enumerate(nbest.hypotheses)
            ]
            best.append(nbest.hypotheses[totals.index(max(totals))].display())
        assert p.wer == errors(["a cat sat", "dog"], best)
    chosen = best_point(points)
    assert chosen.wer == min(p.wer for p in points)
    # Both right needs u1's longer hypothesis (b > 1 + w) and u2's shorter one (b <= 2 + w):
    # of this grid only w = 0, b = 1.5.
    assert (chosen.lm_weight, chosen.length_bonus, chosen.wer) == (0.0, 1.5, 0.0)
    assert sum(p.wer == 0.0 for p in points) == 1


def test_grid_search_needs_references() -> None:
    lists = [NBestList("u", [NBestHypothesis("a")])]
    with pytest.raises(ValueError, match="'u' has no reference"):
        grid_search(lists, [_reranked("u", [-1.0], [1])], [1.0], [0.0], lambda r, h: 0.0)
