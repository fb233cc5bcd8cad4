"""A cache model of a session's own words (Kuhn and De Mori's cache LM, SRILM's `-cache`),
mixed with the base model's next-word distribution for autocomplete.

    cache = WordCache(CacheConfig(weight=0.2, user_word_count=1.0, history_words=5_000))
    cache.set_user_words(["zorblax"])
    cache.commit(["in", "the", "beginning"])    # a finished sentence joins the history
    cache.extend(["and", "the"])                # the sentence being typed
    cache.probabilities()                       # P_cache(w | "and the") for w in cache.words

The cache counts the words of the session's document: its finished sentences (the history,
the last `history_words` of them, whole sentences) and the sentence being typed (the context),
each sentence read from `<s>`. It is a trigram model of those words with Witten-Bell
smoothing, which needs no weights of its own: with c(h, w) the count of w after the words h,
c(h) the words counted after h and T(h) the distinct words seen after h, u(w) =
`user_word_count` for each of the session's user words, N the words counted and U the user
words' total,

    P_uni(w)          = (c(w) + u(w)) / (N + U)
    P_bi(w | v)       = (c(v, w) + T(v) P_uni(w)) / (c(v) + T(v))          (P_uni where c(v) = 0)
    P_cache(w | u, v) = (c(u v, w) + T(u v) P_bi(w | v)) / (c(u v) + T(u v)) (P_bi where 0)
    P(w | context)    = (1 - weight) * P_base(w | context) + weight * P_cache(w | u, v)

where u, v are the context's last two words (`<s>` before the first word). A context the
document has already continued is trusted as far as it was continued consistently: a phrase
typed twice is offered the third time. An empty cache (no words, no user words) leaves the base
model alone. A word outside the base model's vocabulary (a user word, a name the model never
saw) has P_base = 0 and is offered at its cache probability. Every figure is a function of
(history, context, user words, config): a session rebuilt from them on another replica
answers the same words. The design and the weight were chosen on held-out KJV blocks
(`bench/bench_adaptive_complete.py --heldout-blocks --split valid`; bench/README).
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

BOS = "<s>"
START = ""  # the word before `<s>`: the first word's trigram context is (START, BOS)


@dataclass(frozen=True)
class CacheConfig:
    """The mixture's weight and the cache's bounds (settings' `complete_cache_*`, which own
    the defaults)."""

    weight: float
    user_word_count: float
    history_words: int

    def __post_init__(self) -> None:
        if not 0.0 <= self.weight < 1.0:
            raise ValueError(f"cache weight must be in [0, 1), got {self.weight}")


def _contexts(previous2: str, previous: str) -> tuple[tuple[str], tuple[str, str]]:
    return (previous,), (previous2, previous)


class _Counts:
    """The words seen after each one- and two-word context, and how many words, of some
    sentences (each read from `<s>`); the unigram counts are the cache's own (`_counts`)."""

    def __init__(self) -> None:
        self.after: dict[tuple[str, ...], Counter[str]] = {}
        self.total = 0

    def add(self, previous2: str, previous: str, word: str, sign: int = 1) -> None:
        self.total += sign
        for context in _contexts(previous2, previous):
            following = self.after.setdefault(context, Counter())
            following[word] += sign
            if not following[word]:
                del following[word]
                if not following:
                    del self.after[context]

    def add_sentence(self, words: Sequence[str], sign: int = 1) -> None:
        previous2, previous = START, BOS
        for word in words:
            self.add(previous2, previous, word, sign)
            previous2, previous = previous, word


class WordCache:
    """The cache of one session (see the module doc); words as the model's tokenizer gives
    them. Also keeps the sorted distinct words, so the words that start with a typed prefix
    are found by bisection, and beside them (numpy arrays) their unigram counts (user words'
    pseudo-counts included) and their ids in the base model's vocabulary (`word_id`, -1
    outside it), so a keystroke's table is a few vector operations."""

    def __init__(
        self, config: CacheConfig, word_id: Callable[[str], int | None] = lambda word: None
    ) -> None:
        self.config = config
        self._word_id = word_id
        self._counts = np.zeros(0)
        self._ids = np.zeros(0, dtype=np.int64)
        self.weight = config.weight
        self.history: list[list[str]] = []
        self.context: list[str] = []  # the sentence being typed
        self.user_words: tuple[str, ...] = ()
        self._history = _Counts()
        self._context = _Counts()
        self._sorted: list[str] = []
        # Bumped by every edit: what is derived from the cache (a keystroke's table) is kept
        # while it is unchanged.
        self.version = 0
        self.derived: object = None  # opaque here: its deriver (decoding.completion) checks it
        self._measured = (-1, 0)  # (version, nbytes)
        self._listed: Counter[str] = Counter()  # how many sources hold each listed word

    # -- edits ---------------------------------------------------------------------------------

    def set_history(self, sentences: Iterable[Sequence[str]]) -> None:
        """The finished sentences, oldest first (the last `history_words` words are kept)."""
        self.version += 1
        for sentence in self.history:
            self._history.add_sentence(sentence, -1)
            self._unlist(sentence)
        self.history = []
        for finished in sentences:
            self._commit_history(list(finished))

    def commit(self, sentence: Sequence[str]) -> None:
        """A finished sentence joins the history (a session's reset)."""
        if sentence:
            self.version += 1
            self._commit_history(list(sentence))

    def _commit_history(self, sentence: list[str]) -> None:
        self.history.append(sentence)
        self._history.add_sentence(sentence)
        self._list(sentence)
        while self._history.total > self.config.history_words and len(self.history) > 1:
            oldest = self.history.pop(0)
            self._history.add_sentence(oldest, -1)
            self._unlist(oldest)

    def set_context(self, words: Sequence[str]) -> None:
        self.truncate(0)
        self.extend(words)

    def _previous(self, i: int) -> tuple[str, str]:
        """The two words before context position i."""
        context = self.context
        previous = context[i - 1] if i >= 1 else BOS
        previous2 = context[i - 2] if i >= 2 else (BOS if i == 1 else START)
        return previous2, previous

    def extend(self, words: Sequence[str]) -> None:
        if not words:
            return
        self.version += 1
        previous2, previous = self._previous(len(self.context))
        for word in words:
            self._context.add(previous2, previous, word)
            previous2, previous = previous, word
        self.context.extend(words)
        self._list(words)

    def truncate(self, length: int) -> None:
        """Keeps the context's first `length` words (a rollback)."""
        if length >= len(self.context):
            return
        self.version += 1
        removed = list(self.context[length:])
        for i in range(len(self.context) - 1, length - 1, -1):
            self._context.add(*self._previous(i), self.context[i], -1)
        del self.context[length:]
        self._unlist(removed)

    def set_user_words(self, words: Sequence[str]) -> None:
        self.version += 1
        user = self.config.user_word_count
        self._unlist(self.user_words, user)
        self.user_words = tuple(dict.fromkeys(words))
        self._list(self.user_words, user)

    def _list(self, words: Iterable[str], count: float = 1.0) -> None:
        """Counts occurrences (or user words, `count` each) into the sorted words' arrays."""
        for word in words:
            position = bisect.bisect_left(self._sorted, word)
            if not self._listed[word]:
                self._sorted.insert(position, word)
                self._counts = np.insert(self._counts, position, 0.0)
                word_id = self._word_id(word)
                self._ids = np.insert(self._ids, position, -1 if word_id is None else word_id)
            self._listed[word] += 1
            self._counts[position] += count

    def _unlist(self, words: Iterable[str], count: float = 1.0) -> None:
        for word in words:
            position = bisect.bisect_left(self._sorted, word)
            self._listed[word] -= 1
            if self._listed[word]:
                self._counts[position] -= count
                continue
            del self._listed[word]
            del self._sorted[position]
            self._counts = np.delete(self._counts, position)
            self._ids = np.delete(self._ids, position)

    # -- the model -----------------------------------------------------------------------------

    @property
    def active(self) -> bool:
        """Whether the cache changes anything: a weight, and words or user words."""
        return self.weight > 0.0 and bool(self._sorted)

    @property
    def words(self) -> list[str]:
        """The cache's distinct words, sorted (do not modify)."""
        return self._sorted

    @property
    def ids(self) -> npt.NDArray[np.int64]:
        """Each of `words`' id in the base model's vocabulary, -1 outside it (read only)."""
        return self._ids

    def prefix_range(self, prefix: str) -> tuple[int, int]:
        """The slice of `words` that start with `prefix`."""
        words = self._sorted
        start = bisect.bisect_left(words, prefix)
        end = bisect.bisect_left(words, prefix + "\U0010ffff") if prefix else len(words)
        return start, end

    def probabilities(self) -> npt.NDArray[np.float64]:
        """P_cache(word | the context's last two words) of every word of `words` (aligned),
        vectorised: every word gets the unigram, then each context level rescales all of them
        by its back-off share and adds its few followers' counts."""
        words = self._sorted
        user = self.config.user_word_count
        mass = self._history.total + self._context.total + user * len(self.user_words)
        if mass <= 0:
            return np.zeros(len(words))
        p = self._counts / mass
        for context in _contexts(*self._previous(len(self.context))):
            after_h, after_c, seen, distinct = self._followers(context)
            if seen:
                p *= distinct / (seen + distinct)
                for following in (after_h, after_c):
                    for word, count in following.items():
                        p[bisect.bisect_left(words, word)] += count / (seen + distinct)
        return p

    def _followers(self, context: tuple[str, ...]) -> tuple[Counter[str], Counter[str], int, int]:
        """The words counted after `context` (history, sentence), how many, how many distinct."""
        after_h = self._history.after.get(context) or Counter()
        after_c = self._context.after.get(context) or Counter()
        distinct = len(after_h.keys() | after_c.keys())
        return after_h, after_c, after_h.total() + after_c.total(), distinct

    @property
    def nbytes(self) -> int:
        """A rough size for the session cache's memory bound (Python objects per word),
        recounted only after an edit (sessions are measured at every keystroke)."""
        if self._measured[0] != self.version:
            words = len(self._sorted) + sum(len(s) for s in self.history) + len(self.context)
            pairs = sum(len(c) for c in self._history.after.values())
            self._measured = (self.version, 120 * words + 200 * pairs)
        return self._measured[1]
