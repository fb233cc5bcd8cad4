"""Rerank: n-best lists in, each list's hypotheses reordered by combined score out.

    response = await rerank(served_models, limits, request, deadline)

Every field is checked before any work starts, and a bad one is named by its path
(`lists[3].hypotheses[7].scores["acoustic"]`). The hypotheses of all lists are scored together
(`ServedModel.lm_scores`: equal to Score's totals, shared prefixes computed once on a neural
model), then each list is combined and ranked (`decoding.rerank`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from lmserve.server.api.model_use import use_model
from lmserve.server.api.validation import check_no_empty_token, check_text_bytes, validate_options
from lmserve.server.decoding.params import finite
from lmserve.server.decoding.rerank import LengthUnit, RerankWeights, rank, text_length
from lmserve.server.engine.limits import RequestLimits
from lmserve.server.engine.served_model import ServedModel, TextInput
from lmserve.server.engine.served_models import ServedModels
from lmserve.server.errors import InvalidArgument, RequestTooLarge
from lmserve.v1 import lm_service_pb2 as pb

_UNITS = {
    pb.LENGTH_UNIT_UNSPECIFIED: LengthUnit.WORDS,
    pb.LENGTH_UNIT_TOKENS: LengthUnit.TOKENS,
    pb.LENGTH_UNIT_WORDS: LengthUnit.WORDS,
    pb.LENGTH_UNIT_CHARACTERS: LengthUnit.CHARACTERS,
}


@dataclass(frozen=True)
class _Hypotheses:
    """Every hypothesis of a request, flattened in list order: each a text or a token list."""

    items: list[str | list[str]]
    scores: list[Mapping[str, float]]
    list_bounds: list[int]  # list i holds hypotheses list_bounds[i]:list_bounds[i + 1]

    def plain_text(self, i: int) -> str:
        item = self.items[i]
        return item if isinstance(item, str) else " ".join(item)

    def groups(self) -> list[tuple[list[int], TextInput]]:
        """The hypotheses given as text and those given as tokens, each group scored alike."""
        texts = [i for i, item in enumerate(self.items) if isinstance(item, str)]
        tokens = [i for i, item in enumerate(self.items) if not isinstance(item, str)]
        out: list[tuple[list[int], TextInput]] = []
        if texts:
            out.append((texts, TextInput(texts=[str(self.items[i]) for i in texts])))
        if tokens:
            lists = [list(self.items[i]) for i in tokens]
            out.append((tokens, TextInput(token_lists=lists)))
        return out


def rerank_weights(request: pb.RerankRequest) -> RerankWeights:
    """The combination's weights and length unit, checked."""
    weights = {
        name: finite(f"score_weights[{json.dumps(name)}]", value)
        for name, value in request.score_weights.items()
    }
    lm_weight = request.lm_weight if request.HasField("lm_weight") else 1.0
    unit = _UNITS.get(request.length_unit)
    if unit is None:
        raise InvalidArgument(
            "length_unit",
            f"{request.length_unit} is not a length unit; use LENGTH_UNIT_TOKENS, "
            "LENGTH_UNIT_WORDS or LENGTH_UNIT_CHARACTERS",
        )
    return RerankWeights(
        score_weights=weights,
        lm_weight=finite("lm_weight", lm_weight),
        length_bonus=finite("length_bonus", request.length_bonus),
        length_unit=unit,
    )


def _hypotheses(request: pb.RerankRequest, limits: RequestLimits) -> _Hypotheses:
    """The hypotheses of every list, each with exactly one of text and tokens, finite scores,
    and the lists within the limits."""
    if not request.lists:
        raise InvalidArgument("lists", "no n-best lists given")
    if len(request.lists) > limits.max_rerank_lists:
        raise RequestTooLarge("lists", len(request.lists), limits.max_rerank_lists, "lists")
    items: list[str | list[str]] = []
    scores: list[Mapping[str, float]] = []
    bounds = [0]
    for i, nbest in enumerate(request.lists):
        where = f"lists[{i}]"
        if not nbest.hypotheses:
            raise InvalidArgument(f"{where}.hypotheses", "the list is empty")
        if len(nbest.hypotheses) > limits.max_rerank_hypotheses:
            raise RequestTooLarge(
                f"{where}.hypotheses",
                len(nbest.hypotheses),
                limits.max_rerank_hypotheses,
                "hypotheses",
            )
        for j, hyp in enumerate(nbest.hypotheses):
            at = f"{where}.hypotheses[{j}]"
            has_tokens = hyp.HasField("tokens")
            if has_tokens == bool(hyp.text):
                raise InvalidArgument(
                    at,
                    "set exactly one of text and tokens"
                    + (" (both set)" if has_tokens else "; an empty hypothesis is an empty tokens"),
                )
            if has_tokens:
                tokens = list(hyp.tokens.tokens)
                check_no_empty_token(f"{at}.tokens", tokens)
                items.append(tokens)
            else:
                check_text_bytes(f"{at}.text", hyp.text, limits)
                items.append(hyp.text)
            scores.append(
                {
                    name: finite(f"{at}.scores[{json.dumps(name)}]", value)
                    for name, value in hyp.scores.items()
                }
            )
        bounds.append(len(scores))
    total = len(scores)
    if total > limits.max_texts_per_request:
        raise RequestTooLarge("lists", total, limits.max_texts_per_request, "hypotheses in all")
    return _Hypotheses(items, scores, bounds)


async def rerank(
    models: ServedModels, limits: RequestLimits, request: pb.RerankRequest, deadline: float | None
) -> pb.RerankResponse:
    """One Rerank request, checked, scored and answered (lists in request order)."""
    with use_model(models, request.model) as served:
        return await _rerank(served, limits, request, deadline)


async def _rerank(
    served: ServedModel, limits: RequestLimits, request: pb.RerankRequest, deadline: float | None
) -> pb.RerankResponse:
    weights = rerank_weights(request)
    options = validate_options(request)
    hyps = _hypotheses(request, limits)
    total = len(hyps.items)
    log_probs = np.zeros(total, dtype=np.float64)
    token_counts = np.zeros(total, dtype=np.int64)
    oov_counts = np.zeros(total, dtype=np.int64)
    response = pb.RerankResponse(model=served.name)
    for positions, group in hyps.groups():
        try:
            lm = await served.lm_scores(group, options, deadline)
        except InvalidArgument as exc:
            raise _located(exc, hyps, positions) from None
        log_probs[positions] = lm.log_probs
        token_counts[positions] = lm.token_counts
        oov_counts[positions] = lm.oov_counts
        response.request_tokens += lm.request_tokens
        response.computed_tokens += lm.computed_tokens
    unit = weights.length_unit
    lengths = np.fromiter(
        (text_length(hyps.plain_text(i), unit, int(token_counts[i])) for i in range(total)),
        dtype=np.int64,
        count=total,
    )
    combined = weights.combine(log_probs, hyps.scores, lengths)
    for i, nbest in enumerate(request.lists):
        lo, hi = hyps.list_bounds[i], hyps.list_bounds[i + 1]
        out = response.lists.add(id=nbest.id)
        for position, local in enumerate(rank(combined[lo:hi]).tolist()):
            k = lo + local
            out.hypotheses.add(
                index=local,
                rank=position,
                lm_log_prob=float(log_probs[k]),
                combined_score=float(combined[k]),
                length=int(lengths[k]),
                oov_count=int(oov_counts[k]),
            )
    return response


def _located(exc: InvalidArgument, hyps: _Hypotheses, positions: list[int]) -> InvalidArgument:
    """A scoring error on `texts[k]` of a group renamed to its list and hypothesis."""
    field = exc.field
    for prefix in ("texts[", "token_lists["):
        if field.startswith(prefix):
            k = positions[int(field[len(prefix) : field.index("]")])]
            i = int(np.searchsorted(hyps.list_bounds, k, side="right")) - 1
            j = k - hyps.list_bounds[i]
            rest = field[field.index("]") + 1 :]
            return InvalidArgument(f"lists[{i}].hypotheses[{j}]{rest}", exc.problem)
    return exc
