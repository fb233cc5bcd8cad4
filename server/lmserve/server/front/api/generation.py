"""Generate and BeamSearch messages <-> the decoding layer's params and the scheduler's events.

    params = generate_params(request, limits, vocab_size)     # InvalidArgument names the field
    hypotheses = [beam_hypothesis(h, token_texts, detokenizer) for h in found]

Absent proto fields become the documented defaults here; the ranges themselves are checked by
`decoding.params` (one place).
"""

from __future__ import annotations

from collections.abc import Sequence

from lmserve.server.decoding.beam import Hypothesis
from lmserve.server.decoding.detokenize import Detokenizer, detokenize
from lmserve.server.decoding.params import (
    BeamParams,
    GenerateParams,
    SamplingParams,
    StoppingParams,
)
from lmserve.server.errors import InvalidArgument
from lmserve.server.settings import GenerationLimits
from lmserve.v1 import lm_service_pb2 as pb

_LENGTH_PENALTIES = {
    pb.LENGTH_PENALTY_KIND_UNSPECIFIED: "none",
    pb.LENGTH_PENALTY_KIND_NONE: "none",
    pb.LENGTH_PENALTY_KIND_GNMT: "gnmt",
    pb.LENGTH_PENALTY_KIND_AVERAGE: "average",
}


def sampling_params(msg: pb.SamplingParams) -> SamplingParams:
    """The `optional` fields that were set; absent ones keep SamplingParams' defaults."""
    given = {f.name: value for f, value in msg.ListFields()}
    return SamplingParams(**given)


def generate_params(
    request: pb.GenerateRequest, limits: GenerationLimits, vocab_size: int
) -> GenerateParams:
    stopping = request.stopping
    if not request.HasField("stopping") or stopping.max_new_tokens == 0:
        raise InvalidArgument("stopping.max_new_tokens", "is required (> 0)")
    params = GenerateParams(
        stopping=StoppingParams(
            max_new_tokens=stopping.max_new_tokens,
            min_new_tokens=stopping.min_new_tokens,
            stop=tuple(stopping.stop),
            stop_token_ids=tuple(stopping.stop_token_ids),
            ignore_eos=stopping.ignore_eos,
        ),
        sampling=sampling_params(request.sampling),
        n=request.n or 1,
        logprobs=request.logprobs,
        top_logprobs=request.top_logprobs,
        stream_interval=request.stream_interval or 1,
    )
    return params.validate(
        max_new_tokens=limits.max_new_tokens,
        max_n=limits.max_n,
        max_top_logprobs=limits.max_top_logprobs,
        vocab_size=vocab_size,
    )


def beam_params(
    request: pb.BeamSearchRequest, limits: GenerationLimits, vocab_size: int
) -> BeamParams:
    if request.length_penalty not in _LENGTH_PENALTIES:
        raise InvalidArgument("length_penalty", f"unknown value {request.length_penalty}")
    params = BeamParams(
        beam_width=request.beam_width,
        max_length=request.max_length,
        num_return=request.num_return or 1,
        length_penalty=_LENGTH_PENALTIES[request.length_penalty],  # type: ignore[arg-type]
        length_penalty_alpha=request.length_penalty_alpha,
        min_length=request.min_length,
        early_stopping=request.early_stopping,
        no_repeat_ngram_size=request.no_repeat_ngram_size,
        stop_token_ids=tuple(request.stop_token_ids),
    )
    return params.validate(
        max_beam_width=limits.max_beam_width,
        max_length=limits.max_new_tokens,
        vocab_size=vocab_size,
    )


def prompt_ids(ids: Sequence[int], vocab_size: int, field: str = "prompt_token_ids") -> list[int]:
    """Token ids given by the caller, each in [0, vocab_size)."""
    out = [int(i) for i in ids]
    for k, i in enumerate(out):
        if not 0 <= i < vocab_size:
            raise InvalidArgument(
                f"{field}[{k}]", f"token id must be in [0, {vocab_size}), got {i}"
            )
    return out


def beam_hypothesis(
    h: Hypothesis, token_texts: Sequence[str], detokenizer: Detokenizer
) -> pb.BeamHypothesis:
    """A `decoding.beam` hypothesis as a message; its text from the model's detokenizer, its
    tokens as text (`ServedModel.token_texts`)."""
    ids = [int(i) for i in h.token_ids]
    tokens = [token_texts[i] for i in ids]
    text = detokenize(detokenizer, ids)
    reason = h.finish_reason  # decoding.stopping.FinishReason: values are the proto numbers
    return pb.BeamHypothesis(
        token_ids=ids,
        tokens=tokens,
        text=text,
        log_prob=float(h.log_prob),
        score=float(h.score),
        finish_reason=pb.FinishReason.Name(reason.value),
    )
