"""Score's response, built where the scores are computed (an engine worker, or in-process).

    data = score_response_bytes("kjv-5gram", scored)   # wire bytes (totals only), or a message
    message = score_response("kjv-5gram", scored, bias_matches)

The front hands the bytes to gRPC as they are (an identity serializer).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from lmserve.server.decoding.bias import BiasMatch
from lmserve.server.decoding.scored import ScoredTexts, TokenDetails
from lmserve.server.worker.replies import packing
from lmserve.v1 import lm_service_pb2 as pb


def score_response_bytes(model: str, scored: ScoredTexts) -> bytes | pb.ScoreResponse:
    """The response as wire bytes when it holds totals only (the common rescoring case: see
    `packing`), else as a message (`score_response`)."""
    if scored.details is None:
        packed = packing.pack_totals(scored.log_probs, scored.token_counts, scored.oov_counts)
        if packed is not None:
            return _model_field(model) + packed
    return score_response(model, scored)


@functools.lru_cache(maxsize=256)
def _model_field(model: str) -> bytes:
    """`ScoreResponse.model`'s wire bytes (field 1); names come from the model repository."""
    return packing.string_field(1, model)


def score_response(
    model: str, scored: ScoredTexts, bias: Sequence[BiasMatch] | None = None
) -> pb.ScoreResponse:
    """One TextScore per text, built field by field; per-token details only when they were
    computed. What `score_response_bytes` gives when the totals do not fit its records or
    details were asked for. Results are appended in place with `results.add`, about twice as
    fast as building a list of TextScore messages and copying it in. With a bias list's
    matches (one per text) each result also gets its bias and biased total."""
    response = pb.ScoreResponse(model=model)
    add = response.results.add
    totals = zip(
        scored.log_probs.tolist(),
        scored.token_counts.tolist(),
        scored.oov_counts.tolist(),
        strict=True,
    )
    if scored.details is None:
        for lp, n, o in totals:
            add(log_prob=lp, token_count=n, oov_count=o)
    else:
        for (lp, n, o), d in zip(totals, scored.details, strict=True):
            add(log_prob=lp, token_count=n, oov_count=o, details=token_details(d))
    if bias is not None:
        for result, found in zip(response.results, bias, strict=True):
            result.bias = found.boost
            result.biased_log_prob = result.log_prob + found.boost
            result.bias_phrases.extend(found.phrases)
    return response


def token_details(details: TokenDetails) -> pb.TokenDetails:
    return pb.TokenDetails(
        tokens=details.tokens,
        token_ids=details.token_ids.tolist(),
        log_probs=details.log_probs.tolist(),
        oov=details.oov.tolist(),
        ngram_lengths=[] if details.ngram_lengths is None else details.ngram_lengths.tolist(),
    )


def response_bytes(
    model: str, scored: ScoredTexts, bias: Sequence[BiasMatch] | None = None
) -> bytes:
    """Score's whole answer as ScoreResponse wire bytes, wherever it was scored (an engine, or
    a front that scores a memory-mapped model itself): the one way every Score reply is
    built."""
    if bias is not None:
        return score_response(model, scored, bias).SerializeToString()
    answer = score_response_bytes(model, scored)
    return answer if isinstance(answer, bytes) else answer.SerializeToString()
