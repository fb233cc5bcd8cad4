"""The `bias` field of Score and Rerank requests: checked, split by the model's tokenizer and
compiled once per call (a unary call, or a whole ScoreStream / RerankStream).

    in_force = StreamBias()                           # one per call
    bias = in_force.bias(request, served, limits)     # PhraseBias, or None: no list yet

A phrase with no words under the model's tokenizer, a boost that is not finite, a phrase with
no boost where the list sets none, a repeated phrase, or more phrases than `max_bias_phrases`
is INVALID_ARGUMENT (RESOURCE_EXHAUSTED for the count) naming `bias.phrases[i]`.
"""

from __future__ import annotations

from lmserve.server.decoding.bias import BiasPhrase, PhraseBias, fold
from lmserve.server.decoding.params import finite
from lmserve.server.errors import InvalidArgument, RequestTooLarge
from lmserve.server.front.api.validation import check_text_bytes
from lmserve.server.front.models.biasing import phrase_words
from lmserve.server.front.models.served_model import ServedModel
from lmserve.server.settings import RequestLimits
from lmserve.v1 import lm_service_pb2 as pb


def compile_bias(message: pb.BiasList, served: ServedModel, limits: RequestLimits) -> PhraseBias:
    """The list checked and compiled for `served`'s tokenizer (an empty list matches nothing)."""
    count = len(message.phrases)
    if count > limits.max_bias_phrases:
        raise RequestTooLarge("bias.phrases", count, limits.max_bias_phrases, "phrases")
    shared = finite("bias.boost", message.boost) if message.HasField("boost") else None
    phrases: list[BiasPhrase] = []
    seen: dict[tuple[str, ...], int] = {}
    for i, entry in enumerate(message.phrases):
        at = f"bias.phrases[{i}]"
        check_text_bytes(f"{at}.phrase", entry.phrase, limits)
        words = phrase_words(served.codec, entry.phrase)
        if not words:
            raise InvalidArgument(
                f"{at}.phrase",
                f"{entry.phrase[:100]!r} has no words under model {served.name!r}'s tokenizer",
            )
        if entry.HasField("boost"):
            boost = finite(f"{at}.boost", entry.boost)
        elif shared is not None:
            boost = shared
        else:
            raise InvalidArgument(f"{at}.boost", "is not set and bias.boost is not either")
        key = tuple(fold(w) for w in words)
        if key in seen:
            raise InvalidArgument(
                at, f"{entry.phrase[:100]!r} repeats bias.phrases[{seen[key]}]; give it once"
            )
        seen[key] = i
        phrases.append(BiasPhrase(words, boost))
    return PhraseBias(phrases)


class StreamBias:
    """The bias list in force for a call: a message's own, else the last one a message of the
    call set (compiled once per model, not once per message); a unary call has one message."""

    def __init__(self) -> None:
        self._message: pb.BiasList | None = None
        self._compiled: dict[str, PhraseBias] = {}

    def bias(
        self,
        request: pb.ScoreRequest | pb.RerankRequest | pb.RescoreLatticeRequest,
        served: ServedModel,
        limits: RequestLimits,
    ) -> PhraseBias | None:
        if request.HasField("bias"):
            compiled = compile_bias(request.bias, served, limits)
            self._message, self._compiled = request.bias, {served.name: compiled}
            return compiled
        if self._message is None:
            return None
        if served.name not in self._compiled:
            self._compiled[served.name] = compile_bias(self._message, served, limits)
        return self._compiled[served.name]
