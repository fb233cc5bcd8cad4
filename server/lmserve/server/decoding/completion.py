"""The k most probable next words that start with a typed prefix: autocomplete's search.

Word models (n-gram, word RNN) give every word's probability in one distribution, so the answer
is a top-k over the words of the prefix's slice (`top_k_words`, with
`text.prefix_index.WordPrefixIndex`). Character and BPE models spell a word over several
tokens, so the answer is a search over token sequences (`top_k_subword_words`).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from lmserve.server.decoding.word_cache import WordCache
from lmserve.server.text.pieces import PieceVocabulary

# Up to this many candidates one sort of them all beats argpartition and its tie handling.
_SORT_ALL = 512

Expand = Callable[[tuple[int, ...]], npt.NDArray[np.floating]]
"""`expand(pieces)` -> log P(next token | context + pieces) in nats for every token id [V]."""


def top_k_words(
    log_probs: npt.NDArray[np.floating], candidate_ids: npt.ArrayLike, k: int
) -> list[tuple[int, float]]:
    """The `k` candidates of highest `log_probs[id]`, best first, ties by lower id.

    One argpartition over the candidates (O(n), not a sort of all of them; a few hundred are
    simply sorted), then a sort of the k kept; the candidates tied at the k-th value are
    settled by id, so the answer is the one a full sort by (-log_prob, id) gives. `log_probs`
    must hold no NaN.
    """
    if k <= 0:
        raise ValueError(f"k must be > 0, got {k}")
    cand = np.asarray(candidate_ids, dtype=np.int64)
    if cand.size == 0:
        return []
    vals = np.asarray(log_probs)[cand]
    if k < cand.size and cand.size > _SORT_ALL:
        part = np.argpartition(vals, cand.size - k)[cand.size - k :]
        threshold = vals[part].min()
        above = np.flatnonzero(vals > threshold)
        tied = np.flatnonzero(vals == threshold)
        need = k - above.size
        if tied.size > need:
            tied = tied[np.argsort(cand[tied], kind="stable")[:need]]
        pick = np.concatenate([above, tied])
    else:
        pick = np.arange(cand.size)
    pick = pick[np.lexsort((cand[pick], -vals[pick]))][:k]
    return [(int(cand[i]), float(vals[i])) for i in pick]


@dataclass(frozen=True)
class SubwordCompletions:
    """What `top_k_subword_words` found: `words` best first as (word, log_prob in nats)."""

    words: list[tuple[str, float]]
    exact: bool
    """True when the search finished within its budget: `words` are then the exact top k."""
    expansions: int
    """How many times `expand` was called."""


def _children(pieces: PieceVocabulary, prefix: str, text: str) -> npt.NDArray[np.int64]:
    """The tokens that may follow a path spelling `text` (a prefix of `prefix`, or a word that
    starts with it) and keep it on the way to a word that starts with `prefix`."""
    if len(text) >= len(prefix):
        return pieces.usable_ids if text else pieces.starting_ids
    rest = prefix[len(text) :]
    # Pieces that reach past the typed prefix (or end exactly on it), boundary or not ...
    found = [pieces.index.ids_with_prefix(rest)]
    # ... and pieces that stop inside it, which may only be continued.
    for cut in range(1, len(rest)):
        inner = [i for i in pieces.by_text.get(rest[:cut], ()) if not pieces.ends_word[i]]
        found.append(np.array(inner, dtype=np.int64))
    return np.concatenate(found)


def top_k_subword_words(
    expand: Expand,
    prefix: str,
    k: int,
    *,
    pieces: PieceVocabulary,
    max_expansions: int = 64,
) -> SubwordCompletions:
    """The `k` most probable words that start with `prefix`, for a model whose tokens are
    pieces of words (BPE with `</w>`, or characters with a space token ending a word).

    A word is a token path from the context whose text starts with `prefix` and whose last
    token is a word-boundary piece (`pieces.ends_word`); its log-probability is the sum of its
    tokens' log-probabilities, the boundary included: log P(word, then its end | context).

    The search is uniform-cost (best first): it always extends the most probable open path,
    one child at a time (each expanded path's children are sorted once; a child is taken only
    when it is the best open path, and then its next sibling becomes open). Log-probabilities
    only fall along a path, so words complete in order of probability: the first k complete
    words are the exact top k, provided no path was left unexpanded. `expand` is called at
    most `max_expansions` times (the root counts); a path popped after that is cut, `exact`
    becomes False, and the search goes on with what is open (complete words of already
    expanded paths), so `words` are then the best found, best first, but a cut path could
    have held a better word. Fewer than k words come back when the search runs out.

    A word spelled by several token paths (BPE `th`+`e</w>` and `the</w>`) is reported once,
    with its most probable path's log-probability (not the sum over paths); `exact` is about
    that definition. After a cut, a word's log-probability is that of the path found, which
    may be below its best path's when that one went through a cut path. `prefix` must already
    be normalised as the model's tokenizer would.
    """
    if k <= 0:
        raise ValueError(f"k must be > 0, got {k}")
    if max_expansions <= 0:
        raise ValueError(f"max_expansions must be > 0, got {max_expansions}")
    tie = itertools.count()
    # Open entries: (-log_prob, tie, parent path, parent text, sorted child ids, their
    # log-probs, which child).
    heap: list[tuple[float, int, tuple[int, ...], str, np.ndarray, np.ndarray, int]] = []
    expansions = 0

    def open_children(path: tuple[int, ...], text: str, log_prob: float) -> None:
        nonlocal expansions
        expansions += 1
        ids = _children(pieces, prefix, text)
        scores = log_prob + np.asarray(expand(path), dtype=np.float64)[ids]
        keep = scores > -np.inf
        ids, scores = ids[keep], scores[keep]
        if ids.size:
            order = np.argsort(-scores, kind="stable")
            ids, scores = ids[order], scores[order]
            heapq.heappush(heap, (-float(scores[0]), next(tie), path, text, ids, scores, 0))

    open_children((), "", 0.0)
    words: list[tuple[str, float]] = []
    seen: set[str] = set()
    exact = True
    while heap and len(words) < k:
        _, _, path, text, ids, scores, j = heapq.heappop(heap)
        if j + 1 < ids.size:
            sibling = (-float(scores[j + 1]), next(tie), path, text, ids, scores, j + 1)
            heapq.heappush(heap, sibling)
        piece, log_prob = int(ids[j]), float(scores[j])
        spelled = text + pieces.texts[piece]
        if pieces.ends_word[piece]:
            if spelled not in seen:
                seen.add(spelled)
                words.append((spelled, log_prob))
        elif expansions < max_expansions:
            open_children((*path, piece), spelled, log_prob)
        else:
            exact = False
    return SubwordCompletions(words, exact, expansions)


@dataclass(frozen=True)
class _CacheTable:
    """Every cache word's mixed log-probability after one context, kept while the cache and the
    base distribution are unchanged: the keystrokes of one word share it."""

    key: tuple[int, float]
    log_probs: npt.NDArray[np.floating]  # the base distribution it was made from
    masked: npt.NDArray[np.floating]  # that distribution without the cache's words
    order: npt.NDArray[np.int64]  # tie order: the vocabulary id, or V + position if outside
    mixed: npt.NDArray[np.float64]  # log P under the mixture (-inf: never offered)


def _cache_table(
    cache: WordCache,
    log_probs: npt.NDArray[np.floating],
    excluded: Collection[str],
) -> _CacheTable:
    key = (cache.version, cache.weight)
    held = cache.derived
    if isinstance(held, _CacheTable) and held.key == key and held.log_probs is log_probs:
        return held
    words, weight, size = cache.words, cache.weight, len(log_probs)
    ids = cache.ids
    inside = ids >= 0
    p_base = np.zeros(len(words))
    p_base[inside] = np.exp(np.asarray(log_probs, dtype=np.float64)[ids[inside]])
    mixed = (1.0 - weight) * p_base + weight * cache.probabilities()
    with np.errstate(divide="ignore"):
        log_mixed = np.log(mixed)
    for word in excluded:
        start, end = cache.prefix_range(word)  # the word itself, if held, comes first
        if start < end and words[start] == word:
            log_mixed[start] = -np.inf
    masked = np.array(log_probs, dtype=np.float64)
    masked[ids[inside]] = -np.inf
    order = np.where(inside, ids, size + np.arange(len(words)))
    table = _CacheTable(key, log_probs, masked, order, log_mixed)
    cache.derived = table
    return table


def top_k_words_with_cache(
    log_probs: npt.NDArray[np.floating],
    candidate_ids: npt.ArrayLike,
    k: int,
    *,
    cache: WordCache,
    prefix: str,
    words: Sequence[str],
    excluded: Collection[str] = (),
) -> list[tuple[str, float]]:
    """The k best words starting with `prefix` under the cache mixture (`word_cache`), best
    first as (word, log P in nats); ties by vocabulary id, then words outside the vocabulary
    by their text.

    Exact without mixing the whole vocabulary: scaling by (1 - weight) keeps the order of the
    words the cache does not hold, so their k best are the base model's k best once the
    cache's words are masked out; the cache's own words are mixed one by one (once per context:
    the keystrokes of a word share the table), then both are merged. The cache knows its
    words' vocabulary ids (`WordCache.ids`); `excluded` words are never offered (the special
    tokens).
    """
    table = _cache_table(cache, log_probs, excluded)
    keep = math.log1p(-cache.weight)
    start, end = cache.prefix_range(prefix)
    base = [(i, lp) for i, lp in top_k_words(table.masked, candidate_ids, k) if lp > -math.inf]
    cached_values, cached_order = table.mixed[start:end], table.order[start:end]
    if cached_values.size > 4 * k:  # only the cache's k best (and any tied with them) can win
        threshold = cached_values[np.argpartition(-cached_values, k - 1)[:k]].min()
        pick = np.flatnonzero(cached_values >= threshold)
        cached_values, cached_order = cached_values[pick], cached_order[pick]
    values = np.concatenate([[lp + keep for _, lp in base], cached_values])
    order = np.concatenate([[i for i, _ in base], cached_order]).astype(np.int64)
    size = len(log_probs)
    best = np.lexsort((order, -values))[:k]
    cached = cache.words
    return [
        (words[o] if o < size else cached[o - size], float(values[j]))
        for j, o in ((j, int(order[j])) for j in best)
        if values[j] > -math.inf
    ]
