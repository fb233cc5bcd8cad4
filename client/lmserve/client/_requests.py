"""Builds lmserve.v1 request messages from the client's plain Python arguments (sync and async)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from lmserve.client.rerank_types import (
    NBestInputError,
    NBestList,
    as_nbest_list,
    finite_number,
    finite_scores,
)
from lmserve.client.types import GeneratedToken, GenerationFinished
from lmserve.v1 import lm_service_pb2 as pb

# Texts as strings, or texts already cut into tokens.
Inputs = Sequence[str] | Sequence[Sequence[str]]
# Phrases to boost: {phrase: boost in nats}, or phrases (each with `bias_boost`), or
# (phrase, boost) pairs.
Bias = Mapping[str, float] | Sequence[str] | Sequence[tuple[str, float]]

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
    model: str,
    inputs: Inputs,
    bos: bool,
    eos: bool,
    return_tokens: bool,
    bias: pb.BiasList | None = None,
) -> pb.ScoreRequest:
    texts, lists = _split(inputs)
    return pb.ScoreRequest(
        model=model,
        texts=texts,
        token_lists=lists,
        options=options(bos, eos),
        return_tokens=return_tokens,
        bias=bias,
    )


def bias_list(bias: Bias | None, boost: float | None = None) -> pb.BiasList | None:
    """The `bias` field from a {phrase: boost} mapping, a list of phrases (each boosted by
    `boost`) or (phrase, boost) pairs; None when neither is given. Raises NBestInputError
    (naming `bias.phrases[i]`) for a non-string phrase or a boost that is not a finite number."""
    if bias is None:
        return None
    if isinstance(bias, str | bytes):
        raise NBestInputError("bias", "pass a list of phrases or a {phrase: boost} mapping")
    message = pb.BiasList()
    if boost is not None:
        message.boost = finite_number(boost, "bias.boost")
    items = bias.items() if isinstance(bias, Mapping) else bias
    for i, item in enumerate(items):
        at = f"bias.phrases[{i}]"
        phrase, value = (item, None) if isinstance(item, str) else item
        if not isinstance(phrase, str):
            raise NBestInputError(at, f"a phrase must be a string, got {phrase!r}")
        entry = message.phrases.add(phrase=phrase)
        if value is not None:
            entry.boost = finite_number(value, f"{at}.boost")
    return message


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


def generate_request(
    model: str,
    prompt: str | Sequence[int],
    *,
    max_new_tokens: int,
    min_new_tokens: int = 0,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    typical_p: float | None = None,
    repetition_penalty: float | None = None,
    presence_penalty: float | None = None,
    frequency_penalty: float | None = None,
    no_repeat_ngram_size: int | None = None,
    seed: int | None = None,
    stop: Sequence[str] = (),
    stop_token_ids: Sequence[int] = (),
    ignore_eos: bool = False,
    n: int = 1,
    logprobs: bool = False,
    top_logprobs: int = 0,
    stream_interval: int = 1,
) -> pb.GenerateRequest:
    """A GenerateRequest; a prompt string is tokenized by the server, a list of ints is ids.
    Sampling options left as None stay absent (the server's documented defaults apply)."""
    sampling = pb.SamplingParams()
    for name, value in (
        ("temperature", temperature),
        ("top_k", top_k),
        ("top_p", top_p),
        ("min_p", min_p),
        ("typical_p", typical_p),
        ("repetition_penalty", repetition_penalty),
        ("presence_penalty", presence_penalty),
        ("frequency_penalty", frequency_penalty),
        ("no_repeat_ngram_size", no_repeat_ngram_size),
        ("seed", seed),
    ):
        if value is not None:
            setattr(sampling, name, value)
    request = pb.GenerateRequest(
        model=model,
        sampling=sampling,
        stopping=pb.StoppingCriteria(
            max_new_tokens=max_new_tokens,
            min_new_tokens=min_new_tokens,
            stop=list(stop),
            stop_token_ids=list(stop_token_ids),
            ignore_eos=ignore_eos,
        ),
        n=n,
        logprobs=logprobs,
        top_logprobs=top_logprobs,
        stream_interval=stream_interval,
    )
    if isinstance(prompt, str):
        request.prompt = prompt
    else:
        request.prompt_token_ids.extend(int(i) for i in prompt)
    return request


_LENGTH_PENALTIES = {
    "none": pb.LENGTH_PENALTY_KIND_NONE,
    "gnmt": pb.LENGTH_PENALTY_KIND_GNMT,
    "average": pb.LENGTH_PENALTY_KIND_AVERAGE,
}


def beam_search_request(
    model: str,
    prompt: str | Sequence[int],
    *,
    beam_width: int,
    max_length: int,
    num_return: int = 1,
    length_penalty: str = "none",
    length_penalty_alpha: float = 0.0,
    min_length: int = 0,
    early_stopping: bool = False,
    no_repeat_ngram_size: int = 0,
    stop_token_ids: Sequence[int] = (),
) -> pb.BeamSearchRequest:
    """A BeamSearchRequest; `length_penalty` is `none`, `gnmt` or `average`."""
    if length_penalty not in _LENGTH_PENALTIES:
        raise ValueError(f"length_penalty must be one of {sorted(_LENGTH_PENALTIES)}")
    request = pb.BeamSearchRequest(
        model=model,
        beam_width=beam_width,
        num_return=num_return,
        length_penalty=_LENGTH_PENALTIES[length_penalty],
        length_penalty_alpha=length_penalty_alpha,
        min_length=min_length,
        max_length=max_length,
        early_stopping=early_stopping,
        no_repeat_ngram_size=no_repeat_ngram_size,
        stop_token_ids=list(stop_token_ids),
    )
    if isinstance(prompt, str):
        request.prompt = prompt
    else:
        request.prompt_token_ids.extend(int(i) for i in prompt)
    return request


def generation_events(resp: pb.GenerateResponse) -> list[GeneratedToken | GenerationFinished]:
    """A stream message's events in order: its tokens, then the sample end it carries."""
    events: list[GeneratedToken | GenerationFinished] = [
        GeneratedToken.from_proto(t) for t in resp.tokens
    ]
    if resp.HasField("finished"):
        events.append(GenerationFinished.from_proto(resp.finished))
    return events


# -- reranking --------------------------------------------------------------------------------

LENGTH_UNITS = {
    "words": pb.LENGTH_UNIT_WORDS,
    "tokens": pb.LENGTH_UNIT_TOKENS,
    "characters": pb.LENGTH_UNIT_CHARACTERS,
}
NBestLists = Sequence[NBestList | Mapping[str, Any]]


def _hypothesis(h: Any) -> pb.Hypothesis:
    """An empty text goes as an empty token list: proto3 cannot tell `text=""` from no text,
    and the server refuses a hypothesis with neither (an all-deleted hypothesis is legal)."""
    if h.tokens is not None:
        return pb.Hypothesis(tokens=pb.TokenList(tokens=h.tokens), scores=h.scores)
    if h.text == "":
        return pb.Hypothesis(tokens=pb.TokenList(), scores=h.scores)
    return pb.Hypothesis(text=h.text, scores=h.scores)


def rerank_request(
    model: str,
    lists: NBestLists,
    *,
    score_weights: Mapping[str, float] | None = None,
    lm_weight: float = 1.0,
    length_bonus: float = 0.0,
    length_unit: str = "words",
    bos: bool = True,
    eos: bool = True,
    bias: pb.BiasList | None = None,
) -> pb.RerankRequest:
    """A RerankRequest from NBestLists or JSON-lines dicts. What the wire cannot express or the
    server would refuse anyway (text and tokens both or neither, non-numbers, NaN or infinite
    scores and weights, an unknown length unit) raises NBestInputError naming the field as the
    server names it; limits (empty lists, too many hypotheses) are the server's to enforce."""
    if isinstance(lists, str | bytes | Mapping) or not isinstance(lists, Sequence | Iterable):
        raise NBestInputError("lists", "pass a sequence of n-best lists")
    unit = LENGTH_UNITS.get(length_unit)
    if unit is None:
        raise NBestInputError("length_unit", f"must be one of {sorted(LENGTH_UNITS)}")
    weights = finite_scores(score_weights or {}, "score_weights")
    checked = [as_nbest_list(item, f"lists[{i}]") for i, item in enumerate(lists)]
    return pb.RerankRequest(
        model=model,
        lists=[
            pb.NBestList(id=nbest.id, hypotheses=[_hypothesis(h) for h in nbest.hypotheses])
            for nbest in checked
        ],
        score_weights=weights,
        lm_weight=finite_number(lm_weight, "lm_weight"),
        length_bonus=finite_number(length_bonus, "length_bonus"),
        length_unit=unit,
        options=options(bos, eos),
        bias=bias,
    )
