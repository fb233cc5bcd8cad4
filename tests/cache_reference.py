"""An independent recount of the autocomplete session cache (`decoding.word_cache`), for tests."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable


def cache_reference(
    sentences: list[list[str]], context: list[str], user_words: set[str], user_count: float
) -> Callable[[str], float]:
    """P_cache(word | context) recounted from scratch: Witten-Bell trigram over `sentences`
    (the history kept) and the context, each read from `<s>` (see `decoding.word_cache`)."""
    unigrams: Counter[str] = Counter()
    after: dict[tuple[str, ...], Counter[str]] = {}
    for sentence in [*sentences, context]:
        padded = ["", "<s>", *sentence]
        for i, word in enumerate(sentence):
            unigrams[word] += 1
            for h in ((padded[i + 1],), (padded[i], padded[i + 1])):
                after.setdefault(h, Counter())[word] += 1
    mass = sum(unigrams.values()) + user_count * len(user_words)
    padded = ["", "<s>", *context]
    histories = [(padded[-1],), (padded[-2], padded[-1])]

    def probability(word: str) -> float:
        if not mass:
            return 0.0
        p = (unigrams[word] + (user_count if word in user_words else 0.0)) / mass
        for h in histories:
            following = after.get(h, Counter())
            seen, distinct = sum(following.values()), len(following)
            if seen:
                p = (following[word] + distinct * p) / (seen + distinct)
        return p

    return probability
