"""Checks request fields against the API's rules and the server's limits, naming the bad field.

    batch = validate_batch(request, limits)   # InvalidArgument("texts", "...") when wrong

Produces the domain objects the decoding layer takes; nothing past here sees a proto message.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from lmserve.server.decoding.scoring import ScoreOptions
from lmserve.server.errors import InvalidArgument
from lmserve.server.front.api.generation import prompt_ids
from lmserve.server.front.models.served_model import TextInput
from lmserve.server.settings import RequestLimits
from lmserve.v1 import lm_service_pb2 as pb


class BatchRequest(Protocol):
    """What Score, Perplexity and CorpusPerplexity requests have in common."""

    @property
    def texts(self) -> Sequence[str]: ...
    @property
    def token_lists(self) -> Sequence[pb.TokenList]: ...


def check_text_bytes(field: str, text: str, limits: RequestLimits) -> None:
    """Refuses a text over `max_text_bytes` UTF-8 bytes before anything tokenizes it (a 60 MB
    text took 4.7 s to tokenize before its token count was refused)."""
    limit = limits.max_text_bytes
    if len(text) * 4 <= limit:  # UTF-8 takes at most 4 bytes per character: no need to encode
        return
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > limit:
        raise InvalidArgument(field, f"has {size} bytes, more than the limit of {limit}")


def check_no_empty_token(field: str, tokens: Sequence[str]) -> None:
    """Refuses an empty string among a client's tokens (`<field>[i]: is an empty token`): no
    tokenizer makes one, so it can only be a client's mistake."""
    if "" in tokens:
        raise InvalidArgument(f"{field}[{tokens.index('')}]", "is an empty token")


def validate_model_name(model: str) -> str:
    if not model:
        raise InvalidArgument("model", "is empty; name one of the models ListModels returns")
    return model


def validate_options(
    request: pb.ScoreRequest
    | pb.PerplexityRequest
    | pb.CorpusPerplexityRequest
    | pb.RerankRequest
    | pb.RescoreLatticeRequest,
) -> ScoreOptions:
    """`options.bos` / `options.eos`, absent meaning true (KenLM's defaults)."""
    if not request.HasField("options"):
        return ScoreOptions()
    options = request.options
    return ScoreOptions(
        bos=options.bos if options.HasField("bos") else True,
        eos=options.eos if options.HasField("eos") else True,
    )


def validate_score_batch(
    request: pb.ScoreRequest, limits: RequestLimits, vocab_size: int
) -> TextInput:
    """Score's texts: `token_ids` (each id a token of the model's vocabulary), or what
    `validate_batch` takes; exactly one of the three forms."""
    if not request.token_ids:
        return validate_batch(request, limits)
    if request.texts or request.token_lists:
        other = "texts" if request.texts else "token_lists"
        raise InvalidArgument(
            "token_ids", f"set one of texts, token_lists and token_ids, not {other} too"
        )
    count = len(request.token_ids)
    if count > limits.max_texts_per_request:
        raise InvalidArgument(
            "token_ids", f"{count} texts is more than the limit of {limits.max_texts_per_request}"
        )
    return TextInput(
        token_ids=[
            prompt_ids(text.ids, vocab_size, f"token_ids[{i}].ids")
            for i, text in enumerate(request.token_ids)
        ]
    )


def validate_batch(
    request: BatchRequest, limits: RequestLimits, *, allow_empty: bool = False
) -> TextInput:
    """One of `texts` / `token_lists`, within the limits; tokens in token_lists non-empty."""
    texts, token_lists = request.texts, request.token_lists
    if texts and token_lists:
        raise InvalidArgument("texts", "set either texts or token_lists, not both")
    count = len(texts) or len(token_lists)
    if count == 0:
        if allow_empty:
            return TextInput(texts=[])
        raise InvalidArgument("texts", "no texts given (set texts or token_lists)")
    if count > limits.max_texts_per_request:
        field = "texts" if texts else "token_lists"
        raise InvalidArgument(
            field, f"{count} texts is more than the limit of {limits.max_texts_per_request}"
        )
    if texts:
        for i, text in enumerate(texts):
            check_text_bytes(f"texts[{i}]", text, limits)
        return TextInput(texts=texts)
    lists = [list(token_list.tokens) for token_list in token_lists]
    for i, tokens in enumerate(lists):
        check_no_empty_token(f"token_lists[{i}].tokens", tokens)
    return TextInput(token_lists=lists)
