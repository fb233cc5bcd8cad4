"""Typed, immutable results the client returns, converted from the lmserve.v1 protobuf messages.

Every log-probability here is a natural logarithm (nats), as on the wire; field names say so
(`log_prob`). Conversion is done once per response; per-token objects are built only when the
caller asked for token details.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lmserve.v1 import lm_service_pb2 as pb


def _enum_suffix(full_name: str, prefix: str) -> str:
    """`MODEL_KIND_NGRAM` -> `ngram`; `MODEL_KIND_UNSPECIFIED` -> `unspecified`."""
    return full_name.removeprefix(prefix).lower()


@dataclass(frozen=True, slots=True)
class TokenScore:
    """One scored token of a text (`</s>` included when end-of-sentence is on)."""

    token: str
    token_id: int
    log_prob: float
    """log P(token | history) in nats."""
    oov: bool
    ngram_length: int | None
    """N-gram models: length of the longest matching n-gram; None for neural models."""


@dataclass(frozen=True)
class TextScore:
    """The score of one text.

    >>> result = client.score("kjv-5gram", ["in the beginning"])[0]
    >>> result.log_prob, result.token_count, result.oov_count
    """

    log_prob: float
    """Total log-probability in nats (`</s>` included when end-of-sentence is on)."""
    token_count: int
    oov_count: int
    tokens: tuple[TokenScore, ...] | None = None
    """Per-token details; present only when `return_tokens=True` was asked."""

    @classmethod
    def totals(cls, log_prob: float, token_count: int, oov_count: int) -> TextScore:
        """The same as `TextScore(log_prob, token_count, oov_count)`, about twice as fast: it fills
        the instance dict directly instead of calling `object.__setattr__` per field as a frozen
        dataclass's `__init__` does. Rescoring builds one per text, so this is the hot path."""
        obj = object.__new__(cls)
        fields = obj.__dict__
        fields["log_prob"] = log_prob
        fields["token_count"] = token_count
        fields["oov_count"] = oov_count
        fields["tokens"] = None
        return obj

    @classmethod
    def from_proto(cls, msg: pb.TextScore, with_tokens: bool) -> TextScore:
        if not with_tokens:
            return cls.totals(msg.log_prob, msg.token_count, msg.oov_count)
        d = msg.details
        lengths: list[int | None] = list(d.ngram_lengths) or [None] * len(d.tokens)
        tokens = tuple(
            TokenScore(tok, tid, lp, oov, n)
            for tok, tid, lp, oov, n in zip(
                d.tokens, d.token_ids, d.log_probs, d.oov, lengths, strict=True
            )
        )
        return cls(msg.log_prob, msg.token_count, msg.oov_count, tokens)


@dataclass(frozen=True, slots=True)
class PerplexityStats:
    """Perplexity over a set of texts; natural-log sums, `</s>` counted when eos is on.

    `perplexity = exp(-log_prob / token_count)` per model token (OOVs scored as the unknown one);
    `perplexity_excluding_oov = exp(-log_prob_excluding_oov / (token_count - oov_count))`;
    `perplexity_per_word = exp(-log_prob / word_count)`, words as the model's word tokenizer
    splits them plus the `</s>`s: what compares word, character and BPE models (for a word
    model it equals `perplexity`).
    """

    log_prob: float
    token_count: int
    oov_count: int
    text_count: int
    perplexity: float
    log_prob_excluding_oov: float
    perplexity_excluding_oov: float
    word_count: int = 0
    perplexity_per_word: float = math.nan

    @classmethod
    def from_proto(cls, msg: pb.PerplexityStats) -> PerplexityStats:
        return cls(
            log_prob=msg.log_prob,
            token_count=msg.token_count,
            oov_count=msg.oov_count,
            text_count=msg.text_count,
            perplexity=msg.perplexity,
            log_prob_excluding_oov=msg.log_prob_excluding_oov,
            perplexity_excluding_oov=msg.perplexity_excluding_oov,
            word_count=msg.word_count,
            perplexity_per_word=msg.perplexity_per_word,
        )


@dataclass(frozen=True, slots=True)
class SpecialTokens:
    """Special tokens as strings and ids (-1 where the model has none)."""

    bos: str
    eos: str
    unk: str
    pad: str
    bos_id: int
    eos_id: int
    unk_id: int
    pad_id: int


@dataclass(frozen=True, slots=True)
class TokenizerInfo:
    kind: str
    """`word`, `character` or `bpe`."""
    lowercase: bool
    description: str


@dataclass(frozen=True, slots=True)
class Provenance:
    training_corpus: str
    trained_by: str
    created: str
    metrics: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What the server says about one model. `kind`/`format`/`state` are lowercase names
    (`ngram`, `ngram_binary`, `ready`); `capabilities` holds the names of the enabled ones."""

    name: str
    version: str
    kind: str
    format: str
    state: str
    order: int
    vocab_size: int
    num_layers: int
    hidden_size: int
    embedding_size: int
    tokenizer: TokenizerInfo
    special_tokens: SpecialTokens
    capabilities: frozenset[str]
    provenance: Provenance
    load_error: str
    description: str

    @property
    def ready(self) -> bool:
        return self.state == "ready"

    @classmethod
    def from_proto(cls, msg: pb.ModelInfo) -> ModelInfo:
        from lmserve.v1 import lm_service_pb2 as pb

        st = msg.special_tokens
        caps = msg.capabilities
        return cls(
            name=msg.name,
            version=msg.version,
            kind=_enum_suffix(pb.ModelKind.Name(msg.kind), "MODEL_KIND_"),
            format=_enum_suffix(pb.ModelFormat.Name(msg.format), "MODEL_FORMAT_"),
            state=_enum_suffix(pb.ModelState.Name(msg.state), "MODEL_STATE_"),
            order=msg.order,
            vocab_size=msg.vocab_size,
            num_layers=msg.num_layers,
            hidden_size=msg.hidden_size,
            embedding_size=msg.embedding_size,
            tokenizer=TokenizerInfo(
                kind=_enum_suffix(pb.TokenizerKind.Name(msg.tokenizer.kind), "TOKENIZER_KIND_"),
                lowercase=msg.tokenizer.lowercase,
                description=msg.tokenizer.description,
            ),
            special_tokens=SpecialTokens(
                st.bos, st.eos, st.unk, st.pad, st.bos_id, st.eos_id, st.unk_id, st.pad_id
            ),
            capabilities=frozenset(
                f.name for f in caps.DESCRIPTOR.fields if getattr(caps, f.name) is True
            ),
            provenance=Provenance(
                training_corpus=msg.provenance.training_corpus,
                trained_by=msg.provenance.trained_by,
                created=msg.provenance.created,
                metrics=MappingProxyType(dict(msg.provenance.metrics)),
            ),
            load_error=msg.load_error,
            description=msg.description,
        )


@dataclass(frozen=True, slots=True)
class HealthStatus:
    """The answer of the standard gRPC health service (`grpc.health.v1`) for one service name."""

    service: str
    """The name checked: "" for the whole server, `lmserve.v1.LanguageModelService/<model>`
    for one model."""
    status: str
    """`SERVING`, `NOT_SERVING`, `SERVICE_UNKNOWN` or `UNKNOWN`."""

    @property
    def serving(self) -> bool:
        return self.status == "SERVING"


# -- generation -------------------------------------------------------------------------------


def _finish_name(value: int) -> str:
    from lmserve.v1 import lm_service_pb2 as pb

    return _enum_suffix(pb.FinishReason.Name(value), "FINISH_REASON_")


@dataclass(frozen=True, slots=True)
class TokenAlternative:
    """One of the most probable tokens at a step (log-prob in nats, unfiltered)."""

    token_id: int
    text: str
    log_prob: float


@dataclass(frozen=True, slots=True)
class GeneratedToken:
    """One token of a Generate stream. `log_prob` (nats) is set when `logprobs` was asked."""

    sample_index: int
    index: int
    token_id: int
    text: str
    """The text this token adds, spacing included."""
    log_prob: float
    top_logprobs: tuple[TokenAlternative, ...] = ()

    @classmethod
    def from_proto(cls, msg: pb.GeneratedToken) -> GeneratedToken:
        top = tuple(TokenAlternative(t.token_id, t.text, t.log_prob) for t in msg.top_logprobs)
        return cls(msg.sample_index, msg.index, msg.token_id, msg.text, msg.log_prob, top)


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    generated_tokens: int
    time_to_first_token_seconds: float
    total_seconds: float


@dataclass(frozen=True, slots=True)
class GenerationFinished:
    """The end of one sample: `reason` is `length`, `stop`, `end_of_sentence` or `cancelled`;
    `text` is the whole generated text (stop strings trimmed); `log_prob` in nats."""

    sample_index: int
    reason: str
    text: str
    log_prob: float
    usage: Usage

    @classmethod
    def from_proto(cls, msg: pb.GenerationFinished) -> GenerationFinished:
        u = msg.usage
        usage = Usage(
            u.prompt_tokens,
            u.generated_tokens,
            u.time_to_first_token_seconds,
            u.total_seconds,
        )
        return cls(msg.sample_index, _finish_name(msg.reason), msg.text, msg.log_prob, usage)


GenerationEvent = GeneratedToken | GenerationFinished


@dataclass(frozen=True, slots=True)
class BeamHypothesis:
    """One continuation found by beam search: total log-prob (nats) and the ranking score."""

    token_ids: tuple[int, ...]
    tokens: tuple[str, ...]
    text: str
    log_prob: float
    score: float
    finish_reason: str

    @classmethod
    def from_proto(cls, msg: pb.BeamHypothesis) -> BeamHypothesis:
        return cls(
            tuple(msg.token_ids),
            tuple(msg.tokens),
            msg.text,
            msg.log_prob,
            msg.score,
            _finish_name(msg.finish_reason),
        )


# -- reranking --------------------------------------------------------------------------------

# The keys a hypothesis of the JSON-lines n-best shape may have; anything else is a typo.
_HYPOTHESIS_KEYS = frozenset({"text", "tokens", "scores"})


class NBestInputError(ValueError):
    """An n-best list given to the client is malformed; `field` is its path, as the server
    would name it (`lists[3].hypotheses[7].scores["acoustic"]`)."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")


def finite_number(value: object, field: str) -> float:
    """A caller's score or weight as a float; bools, strings, NaN and infinities are refused
    because the server would refuse them too, later and with less context."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise NBestInputError(field, f"must be a number, got {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number):
        raise NBestInputError(field, f"must be finite, got {number}")
    return number


def finite_scores(scores: Mapping[str, object], field: str) -> dict[str, float]:
    """`{name: number}` checked key by key, each error naming `field["name"]`."""
    if not isinstance(scores, Mapping):
        raise NBestInputError(field, f"must be a mapping of names to numbers, got {scores!r}")
    checked: dict[str, float] = {}
    for name, value in scores.items():
        if not isinstance(name, str):
            raise NBestInputError(field, f"keys must be strings, got {name!r}")
        checked[name] = finite_number(value, f'{field}["{name}"]')
    return checked


@dataclass(frozen=True, slots=True)
class NBestHypothesis:
    """One hypothesis: its `text` or its `tokens` (exactly one), and the caller's own scores
    (e.g. `{"acoustic": -1234.5}`), which the server weights and adds to the LM's."""

    text: str | None = None
    tokens: tuple[str, ...] | None = None
    scores: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))

    def __init__(
        self,
        text: str | None = None,
        tokens: Sequence[str] | None = None,
        scores: Mapping[str, float] | None = None,
    ) -> None:
        # Frozen and slotted: set through object.__setattr__, normalizing as we go.
        if isinstance(tokens, str | Mapping):
            raise TypeError("tokens must be a sequence of strings (scores go in scores=)")
        object.__setattr__(self, "text", text)
        object.__setattr__(self, "tokens", None if tokens is None else tuple(tokens))
        object.__setattr__(self, "scores", MappingProxyType(dict(scores or {})))

    def display(self) -> str:
        """The hypothesis as one line of text (tokens joined by spaces)."""
        return self.text if self.text is not None else " ".join(self.tokens or ())

    def checked(self, field: str) -> NBestHypothesis:
        """Itself, after the checks the wire format cannot express; errors name `field`."""
        if (self.text is None) == (self.tokens is None):
            raise NBestInputError(field, "set exactly one of text and tokens")
        if self.text is not None and not isinstance(self.text, str):
            raise NBestInputError(f"{field}.text", f"must be a string, got {self.text!r}")
        for i, token in enumerate(self.tokens or ()):
            if not isinstance(token, str):
                raise NBestInputError(f"{field}.tokens[{i}]", f"must be a string, got {token!r}")
        finite_scores(self.scores, f"{field}.scores")
        return self

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], field: str) -> NBestHypothesis:
        """From the JSON-lines shape `{"text": ..., "scores": {...}}` (or `"tokens": [...]`)."""
        if not isinstance(data, Mapping):
            raise NBestInputError(field, f"must be an object, got {type(data).__name__}")
        unknown = sorted(set(data) - _HYPOTHESIS_KEYS)
        if unknown:
            raise NBestInputError(
                f"{field}.{unknown[0]}", f"unknown field (expected {sorted(_HYPOTHESIS_KEYS)})"
            )
        tokens = data.get("tokens")
        if tokens is not None and (isinstance(tokens, str) or not isinstance(tokens, Sequence)):
            raise NBestInputError(f"{field}.tokens", "must be a list of strings")
        scores = finite_scores(data.get("scores") or {}, f"{field}.scores")
        return cls(data.get("text"), tokens, scores).checked(field)


@dataclass(frozen=True, slots=True)
class NBestList:
    """The hypotheses for one utterance. `reference` (the true text, when known) never goes to
    the server; `rerank-tune` and the benchmarks measure word error rates with it."""

    id: str
    hypotheses: tuple[NBestHypothesis, ...]
    reference: str | None = None

    def __init__(
        self,
        id: str,
        hypotheses: Sequence[NBestHypothesis],
        reference: str | None = None,
    ) -> None:
        object.__setattr__(self, "id", id)
        object.__setattr__(self, "hypotheses", tuple(hypotheses))
        object.__setattr__(self, "reference", reference)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], field: str = "list") -> NBestList:
        """From `{"id": ..., "hypotheses": [...], "reference": ...}`; other keys are ignored
        (callers keep their own metadata there)."""
        if not isinstance(data, Mapping):
            raise NBestInputError(field, f"must be an object, got {type(data).__name__}")
        list_id = data.get("id", "")
        if not isinstance(list_id, str | int) or isinstance(list_id, bool):
            raise NBestInputError(f"{field}.id", f"must be a string, got {list_id!r}")
        hypotheses = data.get("hypotheses")
        if isinstance(hypotheses, str) or not isinstance(hypotheses, Sequence):
            raise NBestInputError(f"{field}.hypotheses", "must be a list of hypotheses")
        reference = data.get("reference")
        if reference is not None and not isinstance(reference, str):
            raise NBestInputError(f"{field}.reference", f"must be a string, got {reference!r}")
        return cls(
            str(list_id),
            [
                NBestHypothesis.from_dict(h, f"{field}.hypotheses[{j}]")
                for j, h in enumerate(hypotheses)
            ],
            reference,
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON-lines shape `from_dict` reads (texts as given, tokens as lists)."""
        hyps: list[dict[str, Any]] = []
        for h in self.hypotheses:
            item: dict[str, Any] = {"text": h.text} if h.text is not None else {}
            if h.tokens is not None:
                item["tokens"] = list(h.tokens)
            item["scores"] = dict(h.scores)
            hyps.append(item)
        data: dict[str, Any] = {"id": self.id, "hypotheses": hyps}
        if self.reference is not None:
            data["reference"] = self.reference
        return data


def as_nbest_list(item: NBestList | Mapping[str, Any], field: str) -> NBestList:
    """An NBestList, or a dict of the JSON-lines shape, checked; errors name `field`."""
    if isinstance(item, NBestList):
        if not isinstance(item.id, str):
            raise NBestInputError(f"{field}.id", f"must be a string, got {item.id!r}")
        for j, hypothesis in enumerate(item.hypotheses):
            if not isinstance(hypothesis, NBestHypothesis):
                raise NBestInputError(
                    f"{field}.hypotheses[{j}]",
                    f"must be an NBestHypothesis, got {type(hypothesis).__name__}",
                )
            hypothesis.checked(f"{field}.hypotheses[{j}]")
        return item
    return NBestList.from_dict(item, field)


@dataclass(frozen=True, slots=True)
class RerankedHypothesis:
    """One hypothesis after reranking. `index` is its position in the list sent, `rank` its new
    place (0 = best; equal combined scores keep the lower index first), `lm_log_prob` the
    model's log-probability in nats (as Score gives), `length` in the request's unit."""

    index: int
    rank: int
    lm_log_prob: float
    combined_score: float
    length: int
    oov_count: int

    @classmethod
    def from_proto(cls, msg: pb.RerankedHypothesis) -> RerankedHypothesis:
        return cls(
            msg.index, msg.rank, msg.lm_log_prob, msg.combined_score, msg.length, msg.oov_count
        )


@dataclass(frozen=True, slots=True)
class RerankedList:
    """One list after reranking: the request's `id`, hypotheses best first."""

    id: str
    hypotheses: tuple[RerankedHypothesis, ...]

    @property
    def best(self) -> RerankedHypothesis:
        return self.hypotheses[0]

    @classmethod
    def from_proto(cls, msg: pb.RerankedList) -> RerankedList:
        return cls(msg.id, tuple(RerankedHypothesis.from_proto(h) for h in msg.hypotheses))


class RerankedLists(list[RerankedList]):
    """The answer to one Rerank request: a plain list of RerankedList (request order) that also
    carries the response's `model`, `request_tokens` (tokens the hypotheses hold, `</s>`
    included when scored) and `computed_tokens` (tokens the model computed; fewer when shared
    prefixes are computed once)."""

    model: str
    request_tokens: int
    computed_tokens: int

    @classmethod
    def from_proto(cls, msg: pb.RerankResponse) -> RerankedLists:
        lists = cls(RerankedList.from_proto(item) for item in msg.lists)
        lists.model = msg.model
        lists.request_tokens = msg.request_tokens
        lists.computed_tokens = msg.computed_tokens
        return lists
# -- autocomplete -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Completion:
    """One suggested next word: the whole word (the typed part included) and
    log P(word | context) in nats."""

    word: str
    log_prob: float
