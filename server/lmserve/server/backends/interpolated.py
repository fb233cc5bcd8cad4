"""Linear interpolation of loaded models: P(w | h) = sum_i w_i P_i(w | h), in natural logs.

    mix = InterpolatedBackend([(lstm_backend, 0.6), (ngram_backend, 0.4)])
    mix.score(batch, per_token=True)   # log sum_i w_i p_i per token, by logsumexp

The components must share a tokenizer (the registry checks that); their vocabularies are mapped
by token string onto a common one: the first component's words, then any word only a later
component knows. A word a component lacks is its `<unk>` for that component (as KenLM scores
an unknown word), so the mixed distribution is normalised only over words every component has.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from lmserve.server.backends.base import (
    BatchScores,
    EncodedBatch,
    FloatArray,
    LanguageModelBackend,
    Vocabulary,
)
from lmserve.server.backends.segments import segment_sums


def common_vocabulary(vocabs: Sequence[Vocabulary]) -> Vocabulary:
    """The first vocabulary's words in order, then the words only later ones have."""
    first = vocabs[0]
    words = list(first.words)
    seen = set(words)
    for vocab in vocabs[1:]:
        for word in vocab.words:
            if word not in seen:
                seen.add(word)
                words.append(word)
    return Vocabulary.from_words(
        words,
        unk=first.words[first.unk_id],
        bos=first.words[first.bos_id],
        eos=first.words[first.eos_id],
    )


class InterpolatedBackend:
    """A weighted mixture of backends; scores are log sum_i w_i p_i, natural logs."""

    def __init__(self, components: Sequence[tuple[LanguageModelBackend, float]]) -> None:
        if not components:
            raise ValueError("an interpolated model needs at least one component")
        weights = np.array([w for _, w in components], dtype=np.float64)
        if (weights < 0).any() or not np.isclose(weights.sum(), 1.0, atol=1e-6):
            raise ValueError(f"weights must be >= 0 and sum to 1, got {weights.tolist()}")
        self.components = [b for b, _ in components]
        self.weights = weights
        with np.errstate(divide="ignore"):
            self._log_weights = np.log(weights)
        self._vocab = common_vocabulary([b.vocab for b in self.components])
        # common id -> component id (the component's <unk> where it lacks the word)
        self._maps = [
            np.array(
                [b.vocab.index.get(w, b.vocab.unk_id) for w in self._vocab.words], dtype=np.int32
            )
            for b in self.components
        ]

    @property
    def vocab(self) -> Vocabulary:
        return self._vocab

    def component_batch(self, batch: EncodedBatch, k: int) -> EncodedBatch:
        ids = self._maps[k][batch.ids] if len(batch.ids) else batch.ids
        return EncodedBatch(ids=ids, offsets=batch.offsets, oov=batch.oov)

    def score(
        self, batch: EncodedBatch, *, bos: bool = True, eos: bool = True, per_token: bool = False
    ) -> BatchScores:
        """log sum_i w_i P_i(token | history) summed per text (natural logs)."""
        per_component: list[FloatArray] = []
        offsets: npt.NDArray[np.int64] | None = None
        for k, backend in enumerate(self.components):
            scores = backend.score(self.component_batch(batch, k), bos=bos, eos=eos, per_token=True)
            assert scores.token_log_probs is not None and scores.token_offsets is not None
            per_component.append(scores.token_log_probs + self._log_weights[k])
            offsets = scores.token_offsets
        assert offsets is not None
        mixed = np.logaddexp.reduce(np.stack(per_component), axis=0)
        totals = segment_sums(mixed, offsets)  # empty texts (any place) sum to 0
        if not per_token:
            return BatchScores(totals=totals)
        return BatchScores(totals=totals, token_log_probs=mixed, token_offsets=offsets)

    def next_token_log_probs(self, context: Sequence[int], *, bos: bool = True) -> FloatArray:
        """log sum_i w_i P_i(w | context) for every common id w (natural logs)."""
        ids = np.asarray(context, dtype=np.int64)
        mixed: FloatArray | None = None
        for k, backend in enumerate(self.components):
            lp = backend.next_token_log_probs(self._maps[k][ids].tolist(), bos=bos)
            term = lp[self._maps[k]] + self._log_weights[k]
            mixed = term if mixed is None else np.logaddexp(mixed, term)
        assert mixed is not None
        return mixed
