"""Keystroke savings: how many key presses an autocomplete saves a typist, simulated.

The typist knows the sentence and types it letter by letter. Before each letter (and before
the first one of each word) they look at the k suggestions; as soon as the word they want is
among them they take it with one tap, and the space after it comes free. A word never offered
is typed out, then the space (none after the sentence's last word). Typing with no help
costs exactly the sentence's characters, spaces included, so

    savings = 1 - keys pressed / characters of the sentences

is 0 for no help and approaches 1 - words/characters for a perfect oracle (one tap a word).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

SuggestFn = Callable[[Sequence[str], str, int], Sequence[str]]
"""`suggest(context words, partial word, k)` -> up to k suggested words, best first."""


@dataclass(frozen=True)
class Savings:
    keys: int
    characters: int
    words: int
    accepted: int
    """Words taken from the suggestions (the rest were typed out)."""

    @property
    def savings(self) -> float:
        return 1.0 - self.keys / self.characters if self.characters else 0.0


def type_sentence(words: Sequence[str], suggest: SuggestFn, k: int) -> tuple[int, int]:
    """(keys pressed, words accepted) for one sentence given as its words."""
    keys = accepted = 0
    for i, word in enumerate(words):
        context = words[:i]
        typed = ""
        while True:
            if word in suggest(context, typed, k):
                keys += 1
                accepted += 1
                break
            if typed == word:
                keys += 1 if i + 1 < len(words) else 0  # the space, unless it is the end
                break
            typed = word[: len(typed) + 1]
            keys += 1
    return keys, accepted


def keystroke_savings(sentences: Sequence[str], suggest: SuggestFn, k: int) -> Savings:
    """Savings over `sentences` (each split on whitespace into the words to type)."""
    keys = characters = words = accepted = 0
    for sentence in sentences:
        split = sentence.split()
        sentence_keys, sentence_accepted = type_sentence(split, suggest, k)
        keys += sentence_keys
        accepted += sentence_accepted
        characters += len(" ".join(split))
        words += len(split)
    return Savings(keys, characters, words, accepted)
