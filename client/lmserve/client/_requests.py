"""Builds lmserve.v1 request messages from the client's plain Python arguments (sync and async)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from lmserve.v1 import lm_service_pb2 as pb

# Texts as strings, or texts already cut into tokens.
Inputs = Sequence[str] | Sequence[Sequence[str]]

DEFAULT_TARGET = "localhost:50051"
# Per-token responses for big batches can pass gRPC's 4 MiB default.
CHANNEL_OPTIONS: list[tuple[str, int]] = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
]


def _split(inputs: Inputs) -> tuple[list[str], list[pb.TokenList]]:
    """Texts go to `texts`, token lists to `token_lists`; a bare string is a caller mistake."""
    if isinstance(inputs, str | bytes):
        raise TypeError("pass a sequence of texts (or of token lists), not a single string")
    items = inputs if isinstance(inputs, list | tuple) else list(inputs)
    if not items or isinstance(items[0], str):
        if not all(isinstance(t, str) for t in items):
            raise TypeError("mixed texts and token lists in one batch")
        return list(items), []
    lists: list[pb.TokenList] = []
    for toks in items:
        if isinstance(toks, str):
            raise TypeError("mixed texts and token lists in one batch")
        lists.append(pb.TokenList(tokens=toks))
    return [], lists


def options(bos: bool, eos: bool) -> pb.ScoreOptions:
    return pb.ScoreOptions(bos=bos, eos=eos)


def score_request(
    model: str, inputs: Inputs, bos: bool, eos: bool, return_tokens: bool
) -> pb.ScoreRequest:
    texts, lists = _split(inputs)
    return pb.ScoreRequest(
        model=model,
        texts=texts,
        token_lists=lists,
        options=options(bos, eos),
        return_tokens=return_tokens,
    )


def perplexity_request(model: str, inputs: Inputs, bos: bool, eos: bool) -> pb.PerplexityRequest:
    texts, lists = _split(inputs)
    return pb.PerplexityRequest(
        model=model, texts=texts, token_lists=lists, options=options(bos, eos)
    )


def corpus_request(model: str, batch: Inputs, bos: bool, eos: bool) -> pb.CorpusPerplexityRequest:
    texts, lists = _split(batch)
    return pb.CorpusPerplexityRequest(
        model=model, texts=texts, token_lists=lists, options=options(bos, eos)
    )


def corpus_requests(
    model: str, batches: Iterable[Inputs], bos: bool, eos: bool
) -> Iterator[pb.CorpusPerplexityRequest]:
    """One message per batch; each repeats the model and options, as the API allows."""
    for batch in batches:
        yield corpus_request(model, batch, bos, eos)
