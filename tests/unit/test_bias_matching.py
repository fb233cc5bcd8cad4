"""`decoding.bias.PhraseBias` against an independent reference: a regular expression whose
alternatives are the phrases longest first (a regex takes the first alternative that matches at
the leftmost position, so this is leftmost-longest, non-overlapping matching by another road).
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmserve.server.decoding.bias import BiasPhrase, PhraseBias

WORDS = st.sampled_from(["a", "b", "c", "ab", "B", "Ab"])


def reference(phrases: list[tuple[tuple[str, ...], float]], words: list[str]) -> list[int]:
    """Phrase indexes matched in `words`, in order, by a regex over the joined words."""
    folded = [w.casefold() for w in words]
    order = sorted(range(len(phrases)), key=lambda k: (-len(phrases[k][0]), k))
    alternatives = [
        f"(?P<p{k}>" + "\x00".join(re.escape(w.casefold()) for w in phrases[k][0]) + ")"
        for k in order
    ]
    pattern = re.compile("(?:^|(?<=\x00))(?:" + "|".join(alternatives) + ")(?=\x00|$)")
    text = "\x00".join(folded)
    found = []
    position = 0
    while position <= len(text):
        match = pattern.search(text, position)
        if match is None:
            break
        name = match.lastgroup
        assert name is not None
        found.append(int(name[1:]))
        position = match.end() + 1
    return found


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.lists(WORDS, min_size=1, max_size=3).map(tuple),
        min_size=1,
        max_size=6,
        unique_by=lambda p: tuple(w.casefold() for w in p),
    ),
    st.lists(WORDS, max_size=12),
)
def test_matches_equal_the_regex_reference(
    phrases: list[tuple[str, ...]], words: list[str]
) -> None:
    entries = [(p, float(k + 1)) for k, p in enumerate(phrases)]
    bias = PhraseBias([BiasPhrase(p, b) for p, b in entries])
    found = bias.match(words)
    expected = reference(entries, words)
    assert found.phrases == expected
    assert found.boost == pytest.approx(sum(entries[k][1] for k in expected))


def test_longest_phrase_wins_and_words_count_once() -> None:
    bias = PhraseBias(
        [
            BiasPhrase(("new", "york"), 1.0),
            BiasPhrase(("new", "york", "city"), 2.5),
            BiasPhrase(("york",), 0.5),
        ]
    )
    found = bias.match("in new york city and new york and york".split())
    assert found.phrases == [1, 0, 2]
    assert found.boost == pytest.approx(2.5 + 1.0 + 0.5)


def test_matching_is_casefolded() -> None:
    bias = PhraseBias([BiasPhrase(("Straße",), 2.0)])
    assert bias.match(["STRASSE"]).phrases == [0]
    assert bias.match(["strasse", "x"]).boost == 2.0


def test_no_phrase_or_no_word_matches_nothing() -> None:
    assert PhraseBias([]).match(["a"]).phrases == []
    assert PhraseBias([BiasPhrase(("a",), 1.0)]).match([]).boost == 0.0


def test_a_phrase_without_words_is_refused() -> None:
    with pytest.raises(ValueError, match="no words"):
        PhraseBias([BiasPhrase((), 1.0)])
