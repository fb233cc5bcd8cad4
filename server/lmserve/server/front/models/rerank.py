"""Reranking n-best lists: score every hypothesis with the LM, combine, order each list.

    lists = NBestLists(items=["the cat", ["a", "cat"]], scores=[{"am": -3.0}, {"am": -2.5}],
                       list_bounds=[0, 2])
    result = await rerank_lists(served, lists, RerankWeights(), ScoreOptions(), deadline)
    result.rankings[0]          # list 0's hypotheses, best first (indexes within the list)
    result.combined[k], result.lengths[k]   # hypothesis k of the flattened lists

The hypotheses of all lists are scored together, texts and token lists each as one group
(`ServedModel.lm_scores`: equal to Score's totals, shared prefixes computed once on a neural
model), then each list is combined and ranked (`decoding.rerank`). The API layer validates the
request and converts it to and from these plain types.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from lmserve.server.decoding.bias import PhraseBias
from lmserve.server.decoding.rerank import FloatArray, IntArray, RerankWeights, rank, text_length
from lmserve.server.decoding.scoring import ScoreOptions
from lmserve.server.errors import InvalidArgument
from lmserve.server.front.models.biasing import bias_matches
from lmserve.server.front.models.served_model import ServedModel, TextInput


@dataclass(frozen=True)
class NBestLists:
    """Every hypothesis of a request, flattened in list order: each a text or a token list."""

    items: list[str | list[str]]
    scores: list[Mapping[str, float]]
    list_bounds: list[int]  # list i holds hypotheses list_bounds[i]:list_bounds[i + 1]

    def plain_text(self, k: int) -> str:
        """Hypothesis k as text, for word and character lengths."""
        item = self.items[k]
        return item if isinstance(item, str) else " ".join(item)

    def groups(self) -> list[tuple[list[int], TextInput]]:
        """The hypotheses given as text and those given as tokens, each group scored alike."""
        texts = [k for k, item in enumerate(self.items) if isinstance(item, str)]
        tokens = [k for k, item in enumerate(self.items) if not isinstance(item, str)]
        out: list[tuple[list[int], TextInput]] = []
        if texts:
            out.append((texts, TextInput(texts=[str(self.items[k]) for k in texts])))
        if tokens:
            lists = [list(self.items[k]) for k in tokens]
            out.append((tokens, TextInput(token_lists=lists)))
        return out


@dataclass(frozen=True)
class RerankedLists:
    """Per flattened hypothesis: LM total (nats), combined score, length, OOV count, bias
    (nats) and matched bias phrases; per list its ranking; and the token positions the
    request held against those computed."""

    lm_log_probs: FloatArray
    combined: FloatArray
    lengths: IntArray
    oov_counts: IntArray
    bias: FloatArray
    bias_phrases: list[list[int]]
    rankings: list[list[int]]  # list i's hypothesis indexes (within the list), best first
    list_bounds: list[int]
    request_tokens: int
    computed_tokens: int


async def rerank_lists(
    served: ServedModel,
    lists: NBestLists,
    weights: RerankWeights,
    options: ScoreOptions,
    deadline: float | None,
    bias: PhraseBias | None = None,
) -> RerankedLists:
    """Scores, combines and ranks every list; a scoring error names its list and hypothesis.
    With a bias list each hypothesis's matched phrases' boosts are added to its combined score."""
    total = len(lists.items)
    log_probs = np.zeros(total, dtype=np.float64)
    token_counts = np.zeros(total, dtype=np.int64)
    oov_counts = np.zeros(total, dtype=np.int64)
    request_tokens = computed_tokens = 0
    biases = np.zeros(total, dtype=np.float64)
    bias_phrases: list[list[int]] = [[] for _ in range(total)]
    for positions, group in lists.groups():
        if bias is not None:
            for k, found in zip(positions, bias_matches(served.codec, bias, group), strict=True):
                biases[k], bias_phrases[k] = found.boost, found.phrases
        try:
            lm = await served.lm_scores(group, options, deadline)
        except InvalidArgument as exc:
            raise _located(exc, lists, positions) from None
        log_probs[positions] = lm.log_probs
        token_counts[positions] = lm.token_counts
        oov_counts[positions] = lm.oov_counts
        request_tokens += lm.request_tokens
        computed_tokens += lm.computed_tokens
    unit = weights.length_unit
    lengths = np.fromiter(
        (text_length(lists.plain_text(k), unit, int(token_counts[k])) for k in range(total)),
        dtype=np.int64,
        count=total,
    )
    combined = weights.combine(log_probs, lists.scores, lengths) + biases
    bounds = lists.list_bounds
    rankings = [rank(combined[bounds[i] : bounds[i + 1]]).tolist() for i in range(len(bounds) - 1)]
    return RerankedLists(
        log_probs,
        combined,
        lengths,
        oov_counts,
        biases,
        bias_phrases,
        rankings,
        bounds,
        request_tokens,
        computed_tokens,
    )


def _located(exc: InvalidArgument, lists: NBestLists, positions: list[int]) -> InvalidArgument:
    """A scoring error on `texts[k]` of a group renamed to its list and hypothesis, the
    caller's own field path."""
    field = exc.field
    for prefix in ("texts[", "token_lists["):
        if field.startswith(prefix):
            k = positions[int(field[len(prefix) : field.index("]")])]
            i = int(np.searchsorted(lists.list_bounds, k, side="right")) - 1
            j = k - lists.list_bounds[i]
            rest = field[field.index("]") + 1 :]
            return InvalidArgument(f"lists[{i}].hypotheses[{j}]{rest}", exc.problem)
    return exc
