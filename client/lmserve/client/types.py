"""Typed, immutable results the client returns, converted from the lmserve.v1 protobuf messages.

Every log-probability here is a natural logarithm (nats), as on the wire; field names say so
(`log_prob`). Conversion is done once per response; per-token objects are built only when the
caller asked for token details. This module holds the models, scoring and generation types;
the reranking ones live in `rerank_types.py` and the autocomplete ones in `completion_types.py`,
both re-exported here so that `from lmserve.client.types import ...` works for every name.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

from lmserve.client.completion_types import Completion
from lmserve.client.rerank_types import (
    NBestHypothesis,
    NBestInputError,
    NBestList,
    RerankedHypothesis,
    RerankedList,
    RerankedLists,
    as_nbest_list,
    finite_number,
    finite_scores,
)

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
    bias: float = 0.0
    """With a bias list: the nats its matched phrases add (`biased_log_prob - log_prob`)."""
    bias_phrases: tuple[int, ...] = ()
    """With a bias list: the matched phrases, as indexes into it, in text order."""

    @property
    def biased_log_prob(self) -> float:
        """`log_prob + bias`: the figure Rerank combines."""
        return self.log_prob + self.bias

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
        fields["bias"] = 0.0
        fields["bias_phrases"] = ()
        return obj

    @classmethod
    def from_proto(cls, msg: pb.TextScore, with_tokens: bool, biased: bool = False) -> TextScore:
        bias, phrases = msg.bias, tuple(msg.bias_phrases)
        if not with_tokens:
            if not biased:
                return cls.totals(msg.log_prob, msg.token_count, msg.oov_count)
            return cls(msg.log_prob, msg.token_count, msg.oov_count, None, bias, phrases)
        d = msg.details
        lengths: list[int | None] = list(d.ngram_lengths) or [None] * len(d.tokens)
        tokens = tuple(
            TokenScore(tok, tid, lp, oov, n)
            for tok, tid, lp, oov, n in zip(
                d.tokens, d.token_ids, d.log_probs, d.oov, lengths, strict=True
            )
        )
        return cls(msg.log_prob, msg.token_count, msg.oov_count, tokens, bias, phrases)


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
    """`word`, `character`, `bpe` or `huggingface` (a checkpoint's own tokenizer.json)."""
    lowercase: bool
    description: str


@dataclass(frozen=True, slots=True)
class Provenance:
    training_corpus: str
    trained_by: str
    created: str
    metrics: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    # A brought model's origin and its parity figures (empty for the project's own models).
    source: str = ""
    parity: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True, slots=True)
class NgramStorage:
    """How an n-gram model is stored: `layout` "probing" (exact) or "probing-q8" (8-bit
    quantized values), size, and quantization's largest errors (nats; 0 when exact)."""

    layout: str
    ngram_counts: tuple[int, ...]
    bytes: int
    bytes_per_ngram: float
    max_prob_error: float
    max_backoff_error: float
    max_token_error: float


@dataclass(frozen=True, slots=True)
class TransformerInfo:
    """A transformer's architecture, positions and key/value cache: a Score text, prompt or
    Complete context longer than `max_positions` (<s> included) is refused; a Generate sample
    stops there."""

    architecture: str
    max_positions: int
    num_layers: int
    kv_heads: int
    head_dim: int
    cache_bytes_per_position: int
    optimization: GraphOptimization | None = None  # fused at import; None: served as exported


@dataclass(frozen=True, slots=True)
class GraphOptimization:
    """What ONNX Runtime's transformer optimizer fused in the graph at import (`optimizer`
    "onnxruntime.transformers", chosen by `model_type`): fused operator -> nodes in the graph."""

    optimizer: str
    model_type: str
    fused_ops: Mapping[str, int]
    onnxruntime_version: str


@dataclass(frozen=True, slots=True)
class Quantization:
    """A neural model quantized at export (`--quantize int8`): `method` "dynamic-int8" (int8
    weights of `ops`, activations quantized per call, states float32) and its measured cost on
    held-out text against the float model: the largest per-token log-prob difference (nats,
    checked against `max_token_error_bound`) and the relative perplexity change."""

    method: str
    weights: str
    ops: tuple[str, ...]
    nodes: int
    max_token_error: float
    max_token_error_bound: float
    float_perplexity: float
    perplexity: float
    perplexity_change: float
    held_out: str
    held_out_tokens: int
    float_bytes: int
    bytes: int


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
    ngram_storage: NgramStorage | None = None  # n-gram models only
    transformer: TransformerInfo | None = None  # transformers only
    quantization: Quantization | None = None  # quantized neural models only

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
                source=msg.provenance.source,
                parity=MappingProxyType(dict(msg.provenance.parity)),
            ),
            load_error=msg.load_error,
            description=msg.description,
            ngram_storage=_ngram_storage(msg),
            transformer=_transformer(msg),
            quantization=_quantization(msg),
        )


def _transformer(msg: pb.ModelInfo) -> TransformerInfo | None:
    if not msg.HasField("transformer"):
        return None
    t = msg.transformer
    return TransformerInfo(
        t.architecture,
        t.max_positions,
        t.num_layers,
        t.kv_heads,
        t.head_dim,
        t.cache_bytes_per_position,
        _optimization(t) if t.HasField("optimization") else None,
    )


def _optimization(t: pb.TransformerInfo) -> GraphOptimization:
    o = t.optimization
    return GraphOptimization(
        o.optimizer, o.model_type, MappingProxyType(dict(o.fused_ops)), o.onnxruntime_version
    )


def _quantization(msg: pb.ModelInfo) -> Quantization | None:
    if not msg.HasField("quantization"):
        return None
    q = msg.quantization
    return Quantization(
        method=q.method,
        weights=q.weights,
        ops=tuple(q.ops),
        nodes=q.nodes,
        max_token_error=q.max_token_error,
        max_token_error_bound=q.max_token_error_bound,
        float_perplexity=q.float_perplexity,
        perplexity=q.perplexity,
        perplexity_change=q.perplexity_change,
        held_out=q.held_out,
        held_out_tokens=q.held_out_tokens,
        float_bytes=q.float_bytes,
        bytes=q.bytes,
    )


def _ngram_storage(msg: pb.ModelInfo) -> NgramStorage | None:
    if not msg.HasField("ngram_storage"):
        return None
    s = msg.ngram_storage
    return NgramStorage(
        layout=s.layout,
        ngram_counts=tuple(s.ngram_counts),
        bytes=s.bytes,
        bytes_per_ngram=s.bytes_per_ngram,
        max_prob_error=s.max_prob_error,
        max_backoff_error=s.max_backoff_error,
        max_token_error=s.max_token_error,
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


__all__ = [
    "BeamHypothesis",
    "Completion",
    "GeneratedToken",
    "GenerationEvent",
    "GenerationFinished",
    "HealthStatus",
    "ModelInfo",
    "NBestHypothesis",
    "NBestInputError",
    "NBestList",
    "PerplexityStats",
    "Provenance",
    "RerankedHypothesis",
    "RerankedList",
    "RerankedLists",
    "SpecialTokens",
    "TextScore",
    "TokenAlternative",
    "TokenScore",
    "TokenizerInfo",
    "TransformerInfo",
    "Usage",
    "as_nbest_list",
    "finite_number",
    "finite_scores",
]
