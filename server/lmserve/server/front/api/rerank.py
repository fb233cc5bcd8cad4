"""Rerank: n-best lists in, each list's hypotheses reordered by combined score out.

    response = await rerank(served_models, limits, request, deadline)

Every field is checked before any work starts, and a bad one is named by its path
(`lists[3].hypotheses[7].scores["acoustic"]`). The work (scoring all lists together, combining,
ranking) is the engine's (`front.models.rerank.rerank_lists`); this module converts the message to
its plain `NBestLists` and the result back to a `RerankResponse`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from lmserve.server.decoding.params import finite
from lmserve.server.decoding.rerank import LengthUnit, RerankWeights
from lmserve.server.errors import InvalidArgument, RequestTooLarge
from lmserve.server.front.api.bias import StreamBias
from lmserve.server.front.api.model_use import use_model
from lmserve.server.front.api.validation import (
    check_no_empty_token,
    check_text_bytes,
    validate_options,
)
from lmserve.server.front.models.rerank import NBestLists, rerank_lists
from lmserve.server.front.models.served_model import ServedModel
from lmserve.server.front.models.served_models import ServedModels
from lmserve.server.settings import RequestLimits
from lmserve.v1 import lm_service_pb2 as pb

_UNITS = {
    pb.LENGTH_UNIT_UNSPECIFIED: LengthUnit.WORDS,
    pb.LENGTH_UNIT_TOKENS: LengthUnit.TOKENS,
    pb.LENGTH_UNIT_WORDS: LengthUnit.WORDS,
    pb.LENGTH_UNIT_CHARACTERS: LengthUnit.CHARACTERS,
}


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


def _hypotheses(request: pb.RerankRequest, limits: RequestLimits) -> NBestLists:
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
    return NBestLists(items, scores, bounds)


async def rerank(
    models: ServedModels,
    limits: RequestLimits,
    request: pb.RerankRequest,
    deadline: float | None,
    stream_bias: StreamBias | None = None,
) -> pb.RerankResponse:
    """One Rerank request, checked, scored and answered (lists in request order). On
    RerankStream, `stream_bias` holds the stream's bias list for messages that send none."""
    with use_model(models, request.model) as served:
        return await _rerank(served, limits, request, deadline, stream_bias or StreamBias())


async def _rerank(
    served: ServedModel,
    limits: RequestLimits,
    request: pb.RerankRequest,
    deadline: float | None,
    stream_bias: StreamBias,
) -> pb.RerankResponse:
    weights = rerank_weights(request)
    options = validate_options(request)
    lists = _hypotheses(request, limits)
    bias = stream_bias.bias(request, served, limits)
    result = await rerank_lists(served, lists, weights, options, deadline, bias)
    response = pb.RerankResponse(
        model=served.name,
        request_tokens=result.request_tokens,
        computed_tokens=result.computed_tokens,
    )
    for i, nbest in enumerate(request.lists):
        lo = result.list_bounds[i]
        out = response.lists.add(id=nbest.id)
        for position, local in enumerate(result.rankings[i]):
            k = lo + local
            out.hypotheses.add(
                index=local,
                rank=position,
                lm_log_prob=float(result.lm_log_probs[k]),
                combined_score=float(result.combined[k]),
                length=int(result.lengths[k]),
                oov_count=int(result.oov_counts[k]),
                bias=float(result.bias[k]),
                bias_phrases=result.bias_phrases[k],
            )
    return response
