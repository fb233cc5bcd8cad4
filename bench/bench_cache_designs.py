"""Session-cache designs compared offline: keystroke savings on held-out KJV blocks.

    python bench/bench_cache_designs.py [--split valid] [--documents 8] [--verses 40]

In-process, no server: the held-out blocks and the 5-gram trained without them are
`bench_adaptive_complete`'s (`--heldout-blocks`), each block typed as one document with k=3
(`lmserve.client.savings.type_sentence`), the cache holding the document so far. Designs, each
mixed as (1 - w) P_model + w P_cache:

* `none`: the model alone;
* `served`: what the server runs (`decoding.word_cache.WordCache`, a Witten-Bell trigram of the
  document, w = 0.2, through `decoding.completion.top_k_words_with_cache`);
* `linear-bigram`: P_cache = 0.5 c(v, w) / c(v) + 0.5 c(w) / N (the unigram alone where c(v) is
  0), w = 0.2;
* `context-weights`: the Witten-Bell trigram with w by how much of the context the document
  has continued: 0.4 after a seen two-word context, 0.2 after a seen word, else 0.1;
* `recency`: the Witten-Bell trigram over counts that halve every 200 words;
* `bound`: no model of the cache at all: a word already seen in the document is offered
  before its first letter (one key), any other as the model alone offers it. No cache of the
  document's words can do better.

One JSON record per design (savings, and the gain over `none`).
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
from bench_adaptive_complete import heldout_blocks, train_heldout_model
from common import emit, log, record

from lmserve.client.savings import type_sentence
from lmserve.server.backends.ngram.model import NgramModel
from lmserve.server.decoding.completion import top_k_words, top_k_words_with_cache
from lmserve.server.decoding.word_cache import CacheConfig, WordCache
from lmserve.server.text.prefix_index import WordPrefixIndex

K = 3
Suggest = Callable[[Sequence[str], str, int], list[str]]


class _Counts:
    """The document's (weighted) word events: (two words before, word before, word)."""

    def __init__(self, half_life: float | None = None) -> None:
        self.events: list[tuple[str, str, str]] = []
        self.half_life = half_life

    def weighted(self) -> tuple[dict[str, float], dict[tuple[str, ...], dict[str, float]], float]:
        unigrams: dict[str, float] = defaultdict(float)
        after: dict[tuple[str, ...], dict[str, float]] = defaultdict(lambda: defaultdict(float))
        total = 0.0
        for age, (u, v, w) in enumerate(reversed(self.events)):
            x = 0.5 ** (age / self.half_life) if self.half_life else 1.0
            unigrams[w] += x
            after[(v,)][w] += x
            after[(u, v)][w] += x
            total += x
        return unigrams, after, total


def _witten_bell(counts: _Counts, u: str, v: str) -> dict[str, float]:
    unigrams, after, total = counts.weighted()
    p = {w: c / total for w, c in unigrams.items()}
    for context in ((v,), (u, v)):
        following = after.get(context)
        if following:
            seen, distinct = sum(following.values()), sum(min(1.0, c) for c in following.values())
            p = {
                w: (following.get(w, 0.0) + distinct * q) / (seen + distinct) for w, q in p.items()
            }
    return p


def _linear_bigram(counts: _Counts, u: str, v: str) -> dict[str, float]:
    unigrams, after, total = counts.weighted()
    p = {w: c / total for w, c in unigrams.items()}
    following = after.get((v,))
    if not following:
        return p
    seen = sum(following.values())
    return {w: 0.5 * following.get(w, 0.0) / seen + 0.5 * q for w, q in p.items()}


class Typist:
    """Types documents with one design; `savings()` afterwards."""

    def __init__(self, model: NgramModel, design: str) -> None:
        self.model, self.design = model, design
        vocab = model.vocab
        self.specials = {vocab.bos_id, vocab.eos_id, vocab.unk_id, vocab.pad_id} - {-1}
        self.index = WordPrefixIndex.from_vocab(vocab, self.specials)
        self.keys = self.characters = 0

    def base(self, context: Sequence[str]) -> npt.NDArray[np.float64]:
        vocab = self.model.vocab
        ids = [vocab.index.get(w, vocab.unk_id) for w in context]
        return np.asarray(self.model.next_token_log_probs(ids), dtype=np.float64)

    def type_document(self, verses: list[str]) -> None:
        cache = WordCache(
            CacheConfig(weight=0.2, user_word_count=1.0, history_words=5_000),
            word_id=self.model.vocab.index.get,
        )
        counts = _Counts(200.0 if self.design == "recency" else None)
        seen: set[str] = set()
        for verse in verses:
            words = verse.split()
            suggest = self._suggest(cache, counts, seen, words)
            keys, _ = type_sentence(words, suggest, K)
            self.keys += keys
            self.characters += len(" ".join(words))
            cache.extend(words)
            cache.commit(cache.context)
            cache.set_context([])
            padded = ["", "<s>", *words]
            counts.events += [(padded[i], padded[i + 1], w) for i, w in enumerate(words)]
            seen.update(words)

    def _suggest(
        self, cache: WordCache, counts: _Counts, seen: set[str], verse: list[str]
    ) -> Suggest:
        """The design's suggestions for one verse; the cache follows the verse's context."""
        memo: dict[tuple[str, ...], tuple[npt.NDArray[np.float64], dict[str, float]]] = {}
        words = self.model.vocab.words

        def suggest(context: Sequence[str], partial: str, k: int) -> list[str]:
            context = list(context)
            if self.design == "served":
                if cache.context != context:
                    cache.set_context(context)
                base = self.base(context)
                found = top_k_words_with_cache(
                    base, self.index.ids_with_prefix(partial), k, cache=cache,
                    prefix=partial, words=words,
                )  # fmt: skip
                return [w for w, _ in found]
            if self.design == "bound":
                target = verse[len(context)]
                if not partial and (target in seen or target in context):
                    return [target]  # a word the document has is offered at once
                candidates = self.index.ids_with_prefix(partial)
                return [words[i] for i, _ in top_k_words(self.base(context), candidates, k)]
            key = tuple(context)
            if key not in memo:
                memo[key] = self._mixture(counts, context)
            p, outside = memo[key]
            ids = self.index.ids_with_prefix(partial)
            best = [
                (float(p[i]), words[int(i)]) for i in ids[np.argsort(-p[ids], kind="stable")[:k]]
            ]
            best += [(q, w) for w, q in outside.items() if w.startswith(partial)]
            best.sort(key=lambda item: -item[0])
            return [w for _, w in best[:k]]

        return suggest

    def _mixture(
        self, counts: _Counts, context: list[str]
    ) -> tuple[npt.NDArray[np.float64], dict[str, float]]:
        """The mixed distribution (vocabulary ids) and the cache's words outside it."""
        p = np.exp(self.base(context))
        if self.design == "none" or not counts.events:
            return p, {}
        padded = ["", "<s>", *context]
        u, v = padded[-2], padded[-1]
        sentence = _Counts(counts.half_life)
        sentence.events = counts.events + [
            (padded[i], padded[i + 1], w) for i, w in enumerate(context)
        ]
        if self.design == "linear-bigram":
            p_cache, weight = _linear_bigram(sentence, u, v), 0.2
        else:
            p_cache = _witten_bell(sentence, u, v)
            weight = 0.2
            if self.design == "context-weights":
                _, after, _ = sentence.weighted()
                weight = 0.4 if after.get((u, v)) else 0.2 if after.get((v,)) else 0.1
        p *= 1.0 - weight
        outside: dict[str, float] = {}
        vocab = self.model.vocab
        for word, q in p_cache.items():
            i = vocab.index.get(word)
            if i is None:
                outside[word] = weight * q
            elif i not in self.specials:
                p[i] += weight * q
        return p, outside

    def savings(self) -> float:
        return 1.0 - self.keys / self.characters


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", choices=("valid", "test"), default="valid")
    parser.add_argument("--documents", type=int, default=8)
    parser.add_argument("--verses", type=int, default=40)
    parser.add_argument(
        "--designs", default="none,served,linear-bigram,context-weights,recency,bound"
    )
    args = parser.parse_args()
    dev, test, rest = heldout_blocks(args.documents, args.verses)
    blocks = dev if args.split == "valid" else test
    with tempfile.TemporaryDirectory() as tmp:
        log(f"training a 5-gram without {2 * len(blocks)} blocks of {args.verses} verses")
        name = train_heldout_model(rest, Path(tmp))
        model = NgramModel.load(Path(tmp) / name / "model.lmbin")
        results: dict[str, float] = {}
        for design in args.designs.split(","):
            typist = Typist(model, design)
            for block in blocks:
                typist.type_document(block)
            results[design] = typist.savings()
            gain = results[design] - results.get("none", math.nan)
            emit(
                record(
                    f"cache_design_{design}_{args.split}",
                    "fraction",
                    [results[design]],
                    gain_over_none=gain,
                    documents=len(blocks),
                    keys=typist.keys,
                    characters=typist.characters,
                )
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
