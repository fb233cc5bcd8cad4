"""The keystroke-savings simulation against brute-force suggesters over a tiny vocabulary."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import pytest

from lmserve.client.savings import keystroke_savings

SENTENCES = ["in the beginning god created the heaven", "and god said", "the zz earth"]
VOCAB = ["in", "the", "then", "beginning", "god", "good", "created", "heaven", "and", "said"]
COUNTS = Counter(w for s in SENTENCES for w in s.split() if w in VOCAB)


def by_frequency(context: Sequence[str], partial: str, k: int) -> list[str]:
    """Brute force: every vocabulary word with the prefix, most frequent first (ties: a-z)."""
    hits = [w for w in VOCAB if w.startswith(partial)]
    return sorted(hits, key=lambda w: (-COUNTS[w], w))[:k]


def never(context: Sequence[str], partial: str, k: int) -> list[str]:
    return []


def oracle(sentences: Sequence[str]):  # type: ignore[no-untyped-def]
    """Always suggests the word the typist wants next (knows the sentence from the context)."""
    lookup = {tuple(s.split()[:i]): w for s in sentences for i, w in enumerate(s.split())}
    return lambda context, partial, k: [lookup[tuple(context)]]


def test_no_suggestions_save_nothing() -> None:
    got = keystroke_savings(SENTENCES, never, 3)
    assert got.keys == got.characters == sum(len(s) for s in SENTENCES)
    assert got.savings == 0.0 and got.accepted == 0


def test_a_perfect_oracle_costs_one_tap_a_word() -> None:
    for sentence in SENTENCES:
        got = keystroke_savings([sentence], oracle([sentence]), 1)
        assert got.keys == got.words == got.accepted == len(sentence.split())
        assert got.savings == pytest.approx(1 - got.words / got.characters)


def brute_force_keys(sentence: str, k: int) -> int:
    """Counted by hand's rule: the shortest typed prefix whose suggestions hold the word
    costs len(prefix) + 1 taps; a word never suggested costs its letters + a space."""
    words = sentence.split()
    total = 0
    for i, w in enumerate(words):
        lengths = [n for n in range(len(w) + 1) if w in by_frequency(words[:i], w[:n], k)]
        total += lengths[0] + 1 if lengths else len(w) + (1 if i + 1 < len(words) else 0)
    return total


@pytest.mark.parametrize("k", [1, 2, 3, 10])
def test_savings_match_a_word_by_word_count(k: int) -> None:
    got = keystroke_savings(SENTENCES, by_frequency, k)
    assert got.keys == sum(brute_force_keys(s, k) for s in SENTENCES)
    assert got.characters == sum(len(s) for s in SENTENCES)


def test_a_hand_counted_case() -> None:
    # k=1: "the" (more frequent) is offered until "then" is typed out: t, h, e, n and a tap
    # (5 keys, its space free); "said" is offered once "s" is typed: 2 keys. 7 of 9.
    got = keystroke_savings(["then said"], by_frequency, 1)
    assert (got.keys, got.characters) == (7, 9)
