"""Contextual biasing: phrases a caller expects (names, product terms) boost a text's score.

    bias = PhraseBias([BiasPhrase(("nebuchadnezzar",), 3.0), BiasPhrase(("new", "york"), 2.0)])
    found = bias.match(["to", "new", "york", "and", "nebuchadnezzar"])
    found.boost, found.phrases          # 5.0, [1, 0]: nats added, phrase indexes in text order

A phrase is a sequence of words; a text is its words (the model's word tokenizer's, compared
casefolded: `fold`). Matching is leftmost-longest and non-overlapping: scanning from the first
word, the longest phrase that starts at the current word is taken and the scan goes on after
it; where none starts, it moves one word on. Each word so counts toward at most one phrase
("new york city" wins over "new york" where both match), and a text's boost is the sum of its
matched phrases' boosts, in nats. This is the ranking rule of phrase hints in speech decoders
(a boost per occurrence) applied to whole hypotheses, so that Rerank and Score give one figure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


def fold(word: str) -> str:
    """The form words are compared in: Unicode casefolding (`Straße` matches `STRASSE`)."""
    return word.casefold()


@dataclass(frozen=True)
class BiasPhrase:
    """One phrase: its words (as the model's word tokenizer splits it) and its boost (nats)."""

    words: tuple[str, ...]
    boost: float


@dataclass(frozen=True)
class BiasMatch:
    """What a text matched: the summed boost (nats) and each match's phrase index, in order."""

    boost: float
    phrases: list[int]


NO_MATCH = BiasMatch(0.0, [])


class PhraseBias:
    """A compiled phrase list: phrases by their first (folded) word, longest first."""

    def __init__(self, phrases: Sequence[BiasPhrase]) -> None:
        self.phrases = list(phrases)
        starts: dict[str, list[tuple[tuple[str, ...], int]]] = {}
        for index, phrase in enumerate(self.phrases):
            if not phrase.words:
                raise ValueError(f"phrase {index} has no words")
            folded = tuple(fold(w) for w in phrase.words)
            starts.setdefault(folded[0], []).append((folded, index))
        for candidates in starts.values():
            candidates.sort(key=lambda item: (-len(item[0]), item[1]))
        self._starts = starts

    def __len__(self) -> int:
        return len(self.phrases)

    def match(self, words: Sequence[str]) -> BiasMatch:
        """The leftmost-longest, non-overlapping matches of the phrases in `words`."""
        if not self._starts or not words:
            return NO_MATCH
        folded = [fold(w) for w in words]
        starts = self._starts
        found: list[int] = []
        i, n = 0, len(folded)
        while i < n:
            candidates = starts.get(folded[i])
            taken = 0
            if candidates is not None:
                for phrase, index in candidates:
                    size = len(phrase)
                    if i + size <= n and tuple(folded[i : i + size]) == phrase:
                        found.append(index)
                        taken = size
                        break
            i += taken or 1
        if not found:
            return NO_MATCH
        return BiasMatch(sum(self.phrases[k].boost for k in found), found)
