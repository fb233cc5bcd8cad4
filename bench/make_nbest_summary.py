"""The two reference points of an n-best set: each list's acoustic 1-best and its oracle (the
hypothesis closest to the reference in words)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from nbest.make_nbest import edit_distance

if TYPE_CHECKING:
    from lmserve.client import NBestList


def acoustic_and_oracle(lists: Sequence[NBestList]) -> tuple[list[str], list[str]]:
    acoustic, oracle = [], []
    for nb in lists:
        reference = (nb.reference or "").split()
        texts = [h.display() for h in nb.hypotheses]
        scores = [h.scores.get("acoustic", 0.0) for h in nb.hypotheses]
        acoustic.append(texts[max(range(len(texts)), key=lambda i: (scores[i], -i))])
        oracle.append(min(texts, key=lambda t: edit_distance(t.split(), reference)))
    return acoustic, oracle
