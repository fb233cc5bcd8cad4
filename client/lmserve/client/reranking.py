"""The combination Rerank ranks by, computed locally, and a grid search of its weights.

The LM log-probability, the caller's scores and the length of a hypothesis do not depend on the
weights, so a tuner asks the server once (lm_weight 1, length bonus 0) and recombines here for
every grid point: the same formula and tie rule as the server,

    combined = sum_k score_weights.get(k, 1) * scores[k] + lm_weight * lm_log_prob
               + length_bonus * length,   best first, equal scores by lower index.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from lmserve.client.rerank_types import NBestList, RerankedList


def combined_score(
    scores: Mapping[str, float],
    lm_log_prob: float,
    length: int,
    *,
    score_weights: Mapping[str, float],
    lm_weight: float,
    length_bonus: float,
) -> float:
    weighted = sum(score_weights.get(k, 1.0) * v for k, v in scores.items())
    return weighted + lm_weight * lm_log_prob + length_bonus * length


def ranking(
    nbest: NBestList,
    reranked: RerankedList,
    *,
    score_weights: Mapping[str, float],
    lm_weight: float,
    length_bonus: float,
) -> list[int]:
    """The list's indices best first under these weights, from the server's `lm_log_prob` and
    `length` of each hypothesis (any weights the server used do not matter)."""
    by_index = {r.index: r for r in reranked.hypotheses}
    combined = [
        combined_score(
            h.scores,
            by_index[i].lm_log_prob,
            by_index[i].length,
            score_weights=score_weights,
            lm_weight=lm_weight,
            length_bonus=length_bonus,
        )
        for i, h in enumerate(nbest.hypotheses)
    ]
    return sorted(range(len(combined)), key=lambda i: (-combined[i], i))


@dataclass(frozen=True, slots=True)
class GridPoint:
    lm_weight: float
    length_bonus: float
    wer: float


WerFunction = Callable[[Sequence[str], Sequence[str]], float]


def grid_search(
    lists: Sequence[NBestList],
    reranked: Sequence[RerankedList],
    lm_weights: Sequence[float],
    length_bonuses: Sequence[float],
    wer: WerFunction,
    score_weights: Mapping[str, float] | None = None,
) -> list[GridPoint]:
    """The corpus WER of the 1-best under every (lm_weight, length_bonus) pair, in grid order.
    `wer(references, hypotheses)`; every list needs a reference."""
    weights = dict(score_weights or {})
    references = []
    for nbest in lists:
        if nbest.reference is None:
            raise ValueError(f"list {nbest.id!r} has no reference: tuning needs one per list")
        references.append(nbest.reference)
    points = []
    for lm_weight in lm_weights:
        for length_bonus in length_bonuses:
            best = [
                nbest.hypotheses[
                    ranking(
                        nbest,
                        r,
                        score_weights=weights,
                        lm_weight=lm_weight,
                        length_bonus=length_bonus,
                    )[0]
                ].display()
                for nbest, r in zip(lists, reranked, strict=True)
            ]
            points.append(GridPoint(lm_weight, length_bonus, wer(references, best)))
    return points


def best_point(points: Sequence[GridPoint]) -> GridPoint:
    """The lowest WER; among equals the first in grid order."""
    return min(points, key=lambda p: p.wer)
