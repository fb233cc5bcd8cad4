"""`decoding.word_cache.WordCache` kept incrementally equals a recount from scratch after any
sequence of edits (extend, rollback, reset, a new history, new user words)."""

from __future__ import annotations

import pytest
from cache_reference import cache_reference
from hypothesis import given, settings
from hypothesis import strategies as st

from lmserve.server.decoding.word_cache import CacheConfig, WordCache

WORDS = st.sampled_from(["a", "b", "ab", "c", "ba"])
CONFIG = CacheConfig(weight=0.3, user_word_count=2.0, history_words=6)

EDITS = st.one_of(
    st.tuples(st.just("extend"), st.lists(WORDS, max_size=4)),
    st.tuples(st.just("truncate"), st.integers(0, 6)),
    st.tuples(st.just("reset"), st.none()),
    st.tuples(st.just("history"), st.lists(st.lists(WORDS, min_size=1, max_size=4), max_size=3)),
    st.tuples(st.just("users"), st.lists(WORDS, max_size=3)),
)


def recount(cache: WordCache, words: list[str]) -> list[float]:
    kept: list[list[str]] = []
    total = 0
    for sentence in reversed(cache.history):
        if kept and total + len(sentence) > CONFIG.history_words:
            break
        kept.insert(0, sentence)
        total += len(sentence)
    users = set(cache.user_words)
    probability = cache_reference(kept, cache.context, users, CONFIG.user_word_count)
    return [probability(w) for w in words]


@settings(max_examples=300, deadline=None)
@given(st.lists(EDITS, max_size=12))
def test_incremental_counts_equal_a_recount(edits: list[tuple[str, object]]) -> None:
    vocabulary_ids = {"a": 0, "b": 1, "ab": 2}
    cache = WordCache(CONFIG, word_id=vocabulary_ids.get)
    for kind, value in edits:
        if kind == "extend":
            cache.extend(value)  # type: ignore[arg-type]
        elif kind == "truncate":
            cache.truncate(min(int(value), len(cache.context)))  # type: ignore[call-overload]
        elif kind == "reset":
            cache.commit(cache.context)
            cache.set_context([])
        elif kind == "history":
            cache.set_history(value)  # type: ignore[arg-type]
        else:
            cache.set_user_words(value)  # type: ignore[arg-type]
    # The words held (counted or a user's) are exactly those with a probability.
    vocabulary = ["a", "b", "ab", "c", "ba", "zz"]
    held = cache.words
    probabilities = recount(cache, vocabulary)
    assert held == sorted(w for w, p in zip(vocabulary, probabilities, strict=True) if p > 0)
    assert list(cache.probabilities()) == pytest.approx(recount(cache, held))
    assert cache.ids.tolist() == [vocabulary_ids.get(w, -1) for w in held]
    start, end = cache.prefix_range("a")
    assert held[start:end] == [w for w in held if w.startswith("a")]


def test_the_config_refuses_weights_out_of_range() -> None:
    with pytest.raises(ValueError, match="cache weight"):
        CacheConfig(weight=1.0, user_word_count=1.0, history_words=6)
    with pytest.raises(ValueError, match="cache weight"):
        CacheConfig(weight=-0.1, user_word_count=1.0, history_words=6)
