from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ModelKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MODEL_KIND_UNSPECIFIED: _ClassVar[ModelKind]
    MODEL_KIND_NGRAM: _ClassVar[ModelKind]
    MODEL_KIND_RNN: _ClassVar[ModelKind]
    MODEL_KIND_LSTM: _ClassVar[ModelKind]
    MODEL_KIND_GRU: _ClassVar[ModelKind]
    MODEL_KIND_INTERPOLATED: _ClassVar[ModelKind]
    MODEL_KIND_FFNN: _ClassVar[ModelKind]
    MODEL_KIND_TRANSFORMER: _ClassVar[ModelKind]

class ModelFormat(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MODEL_FORMAT_UNSPECIFIED: _ClassVar[ModelFormat]
    MODEL_FORMAT_ARPA: _ClassVar[ModelFormat]
    MODEL_FORMAT_NGRAM_BINARY: _ClassVar[ModelFormat]
    MODEL_FORMAT_ONNX: _ClassVar[ModelFormat]
    MODEL_FORMAT_TORCHSCRIPT: _ClassVar[ModelFormat]
    MODEL_FORMAT_INTERPOLATION: _ClassVar[ModelFormat]

class TokenizerKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TOKENIZER_KIND_UNSPECIFIED: _ClassVar[TokenizerKind]
    TOKENIZER_KIND_WORD: _ClassVar[TokenizerKind]
    TOKENIZER_KIND_CHARACTER: _ClassVar[TokenizerKind]
    TOKENIZER_KIND_BPE: _ClassVar[TokenizerKind]
    TOKENIZER_KIND_HUGGINGFACE: _ClassVar[TokenizerKind]

class ModelState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MODEL_STATE_UNSPECIFIED: _ClassVar[ModelState]
    MODEL_STATE_READY: _ClassVar[ModelState]
    MODEL_STATE_FAILED: _ClassVar[ModelState]

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_END_OF_SENTENCE: _ClassVar[FinishReason]
    FINISH_REASON_CANCELLED: _ClassVar[FinishReason]

class LengthPenaltyKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LENGTH_PENALTY_KIND_UNSPECIFIED: _ClassVar[LengthPenaltyKind]
    LENGTH_PENALTY_KIND_NONE: _ClassVar[LengthPenaltyKind]
    LENGTH_PENALTY_KIND_GNMT: _ClassVar[LengthPenaltyKind]
    LENGTH_PENALTY_KIND_AVERAGE: _ClassVar[LengthPenaltyKind]

class LengthUnit(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LENGTH_UNIT_UNSPECIFIED: _ClassVar[LengthUnit]
    LENGTH_UNIT_TOKENS: _ClassVar[LengthUnit]
    LENGTH_UNIT_WORDS: _ClassVar[LengthUnit]
    LENGTH_UNIT_CHARACTERS: _ClassVar[LengthUnit]

class LatticeFormat(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LATTICE_FORMAT_UNSPECIFIED: _ClassVar[LatticeFormat]
    LATTICE_FORMAT_HTK_SLF: _ClassVar[LatticeFormat]
    LATTICE_FORMAT_KALDI_TEXT: _ClassVar[LatticeFormat]
MODEL_KIND_UNSPECIFIED: ModelKind
MODEL_KIND_NGRAM: ModelKind
MODEL_KIND_RNN: ModelKind
MODEL_KIND_LSTM: ModelKind
MODEL_KIND_GRU: ModelKind
MODEL_KIND_INTERPOLATED: ModelKind
MODEL_KIND_FFNN: ModelKind
MODEL_KIND_TRANSFORMER: ModelKind
MODEL_FORMAT_UNSPECIFIED: ModelFormat
MODEL_FORMAT_ARPA: ModelFormat
MODEL_FORMAT_NGRAM_BINARY: ModelFormat
MODEL_FORMAT_ONNX: ModelFormat
MODEL_FORMAT_TORCHSCRIPT: ModelFormat
MODEL_FORMAT_INTERPOLATION: ModelFormat
TOKENIZER_KIND_UNSPECIFIED: TokenizerKind
TOKENIZER_KIND_WORD: TokenizerKind
TOKENIZER_KIND_CHARACTER: TokenizerKind
TOKENIZER_KIND_BPE: TokenizerKind
TOKENIZER_KIND_HUGGINGFACE: TokenizerKind
MODEL_STATE_UNSPECIFIED: ModelState
MODEL_STATE_READY: ModelState
MODEL_STATE_FAILED: ModelState
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_END_OF_SENTENCE: FinishReason
FINISH_REASON_CANCELLED: FinishReason
LENGTH_PENALTY_KIND_UNSPECIFIED: LengthPenaltyKind
LENGTH_PENALTY_KIND_NONE: LengthPenaltyKind
LENGTH_PENALTY_KIND_GNMT: LengthPenaltyKind
LENGTH_PENALTY_KIND_AVERAGE: LengthPenaltyKind
LENGTH_UNIT_UNSPECIFIED: LengthUnit
LENGTH_UNIT_TOKENS: LengthUnit
LENGTH_UNIT_WORDS: LengthUnit
LENGTH_UNIT_CHARACTERS: LengthUnit
LATTICE_FORMAT_UNSPECIFIED: LatticeFormat
LATTICE_FORMAT_HTK_SLF: LatticeFormat
LATTICE_FORMAT_KALDI_TEXT: LatticeFormat

class TokenizerInfo(_message.Message):
    __slots__ = ("kind", "lowercase", "description")
    KIND_FIELD_NUMBER: _ClassVar[int]
    LOWERCASE_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    kind: TokenizerKind
    lowercase: bool
    description: str
    def __init__(self, kind: _Optional[_Union[TokenizerKind, str]] = ..., lowercase: _Optional[bool] = ..., description: _Optional[str] = ...) -> None: ...

class SpecialTokens(_message.Message):
    __slots__ = ("bos", "eos", "unk", "pad", "bos_id", "eos_id", "unk_id", "pad_id")
    BOS_FIELD_NUMBER: _ClassVar[int]
    EOS_FIELD_NUMBER: _ClassVar[int]
    UNK_FIELD_NUMBER: _ClassVar[int]
    PAD_FIELD_NUMBER: _ClassVar[int]
    BOS_ID_FIELD_NUMBER: _ClassVar[int]
    EOS_ID_FIELD_NUMBER: _ClassVar[int]
    UNK_ID_FIELD_NUMBER: _ClassVar[int]
    PAD_ID_FIELD_NUMBER: _ClassVar[int]
    bos: str
    eos: str
    unk: str
    pad: str
    bos_id: int
    eos_id: int
    unk_id: int
    pad_id: int
    def __init__(self, bos: _Optional[str] = ..., eos: _Optional[str] = ..., unk: _Optional[str] = ..., pad: _Optional[str] = ..., bos_id: _Optional[int] = ..., eos_id: _Optional[int] = ..., unk_id: _Optional[int] = ..., pad_id: _Optional[int] = ...) -> None: ...

class ModelCapabilities(_message.Message):
    __slots__ = ("score", "perplexity", "generate", "beam_search", "rerank", "complete", "next_token_distribution")
    SCORE_FIELD_NUMBER: _ClassVar[int]
    PERPLEXITY_FIELD_NUMBER: _ClassVar[int]
    GENERATE_FIELD_NUMBER: _ClassVar[int]
    BEAM_SEARCH_FIELD_NUMBER: _ClassVar[int]
    RERANK_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    NEXT_TOKEN_DISTRIBUTION_FIELD_NUMBER: _ClassVar[int]
    score: bool
    perplexity: bool
    generate: bool
    beam_search: bool
    rerank: bool
    complete: bool
    next_token_distribution: bool
    def __init__(self, score: _Optional[bool] = ..., perplexity: _Optional[bool] = ..., generate: _Optional[bool] = ..., beam_search: _Optional[bool] = ..., rerank: _Optional[bool] = ..., complete: _Optional[bool] = ..., next_token_distribution: _Optional[bool] = ...) -> None: ...

class Provenance(_message.Message):
    __slots__ = ("training_corpus", "trained_by", "created", "metrics", "source", "parity")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class ParityEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    TRAINING_CORPUS_FIELD_NUMBER: _ClassVar[int]
    TRAINED_BY_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    PARITY_FIELD_NUMBER: _ClassVar[int]
    training_corpus: str
    trained_by: str
    created: str
    metrics: _containers.ScalarMap[str, float]
    source: str
    parity: _containers.ScalarMap[str, float]
    def __init__(self, training_corpus: _Optional[str] = ..., trained_by: _Optional[str] = ..., created: _Optional[str] = ..., metrics: _Optional[_Mapping[str, float]] = ..., source: _Optional[str] = ..., parity: _Optional[_Mapping[str, float]] = ...) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("name", "version", "kind", "format", "order", "num_layers", "hidden_size", "embedding_size", "vocab_size", "tokenizer", "special_tokens", "capabilities", "provenance", "state", "load_error", "description", "ngram_storage", "transformer", "quantization")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    ORDER_FIELD_NUMBER: _ClassVar[int]
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_SIZE_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_SIZE_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FIELD_NUMBER: _ClassVar[int]
    SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    PROVENANCE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LOAD_ERROR_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    NGRAM_STORAGE_FIELD_NUMBER: _ClassVar[int]
    TRANSFORMER_FIELD_NUMBER: _ClassVar[int]
    QUANTIZATION_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    kind: ModelKind
    format: ModelFormat
    order: int
    num_layers: int
    hidden_size: int
    embedding_size: int
    vocab_size: int
    tokenizer: TokenizerInfo
    special_tokens: SpecialTokens
    capabilities: ModelCapabilities
    provenance: Provenance
    state: ModelState
    load_error: str
    description: str
    ngram_storage: NgramStorage
    transformer: TransformerInfo
    quantization: Quantization
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ..., kind: _Optional[_Union[ModelKind, str]] = ..., format: _Optional[_Union[ModelFormat, str]] = ..., order: _Optional[int] = ..., num_layers: _Optional[int] = ..., hidden_size: _Optional[int] = ..., embedding_size: _Optional[int] = ..., vocab_size: _Optional[int] = ..., tokenizer: _Optional[_Union[TokenizerInfo, _Mapping]] = ..., special_tokens: _Optional[_Union[SpecialTokens, _Mapping]] = ..., capabilities: _Optional[_Union[ModelCapabilities, _Mapping]] = ..., provenance: _Optional[_Union[Provenance, _Mapping]] = ..., state: _Optional[_Union[ModelState, str]] = ..., load_error: _Optional[str] = ..., description: _Optional[str] = ..., ngram_storage: _Optional[_Union[NgramStorage, _Mapping]] = ..., transformer: _Optional[_Union[TransformerInfo, _Mapping]] = ..., quantization: _Optional[_Union[Quantization, _Mapping]] = ...) -> None: ...

class Quantization(_message.Message):
    __slots__ = ("method", "weights", "ops", "nodes", "max_token_error", "max_token_error_bound", "float_perplexity", "perplexity", "perplexity_change", "held_out", "held_out_tokens", "float_bytes", "bytes")
    METHOD_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    OPS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKEN_ERROR_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKEN_ERROR_BOUND_FIELD_NUMBER: _ClassVar[int]
    FLOAT_PERPLEXITY_FIELD_NUMBER: _ClassVar[int]
    PERPLEXITY_FIELD_NUMBER: _ClassVar[int]
    PERPLEXITY_CHANGE_FIELD_NUMBER: _ClassVar[int]
    HELD_OUT_FIELD_NUMBER: _ClassVar[int]
    HELD_OUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FLOAT_BYTES_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    method: str
    weights: str
    ops: _containers.RepeatedScalarFieldContainer[str]
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
    def __init__(self, method: _Optional[str] = ..., weights: _Optional[str] = ..., ops: _Optional[_Iterable[str]] = ..., nodes: _Optional[int] = ..., max_token_error: _Optional[float] = ..., max_token_error_bound: _Optional[float] = ..., float_perplexity: _Optional[float] = ..., perplexity: _Optional[float] = ..., perplexity_change: _Optional[float] = ..., held_out: _Optional[str] = ..., held_out_tokens: _Optional[int] = ..., float_bytes: _Optional[int] = ..., bytes: _Optional[int] = ...) -> None: ...

class TransformerInfo(_message.Message):
    __slots__ = ("architecture", "max_positions", "num_layers", "kv_heads", "head_dim", "cache_bytes_per_position", "optimization")
    ARCHITECTURE_FIELD_NUMBER: _ClassVar[int]
    MAX_POSITIONS_FIELD_NUMBER: _ClassVar[int]
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    KV_HEADS_FIELD_NUMBER: _ClassVar[int]
    HEAD_DIM_FIELD_NUMBER: _ClassVar[int]
    CACHE_BYTES_PER_POSITION_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZATION_FIELD_NUMBER: _ClassVar[int]
    architecture: str
    max_positions: int
    num_layers: int
    kv_heads: int
    head_dim: int
    cache_bytes_per_position: int
    optimization: GraphOptimization
    def __init__(self, architecture: _Optional[str] = ..., max_positions: _Optional[int] = ..., num_layers: _Optional[int] = ..., kv_heads: _Optional[int] = ..., head_dim: _Optional[int] = ..., cache_bytes_per_position: _Optional[int] = ..., optimization: _Optional[_Union[GraphOptimization, _Mapping]] = ...) -> None: ...

class GraphOptimization(_message.Message):
    __slots__ = ("optimizer", "model_type", "fused_ops", "onnxruntime_version")
    class FusedOpsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    OPTIMIZER_FIELD_NUMBER: _ClassVar[int]
    MODEL_TYPE_FIELD_NUMBER: _ClassVar[int]
    FUSED_OPS_FIELD_NUMBER: _ClassVar[int]
    ONNXRUNTIME_VERSION_FIELD_NUMBER: _ClassVar[int]
    optimizer: str
    model_type: str
    fused_ops: _containers.ScalarMap[str, int]
    onnxruntime_version: str
    def __init__(self, optimizer: _Optional[str] = ..., model_type: _Optional[str] = ..., fused_ops: _Optional[_Mapping[str, int]] = ..., onnxruntime_version: _Optional[str] = ...) -> None: ...

class NgramStorage(_message.Message):
    __slots__ = ("layout", "ngram_counts", "bytes", "bytes_per_ngram", "max_prob_error", "max_backoff_error", "max_token_error")
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    NGRAM_COUNTS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    BYTES_PER_NGRAM_FIELD_NUMBER: _ClassVar[int]
    MAX_PROB_ERROR_FIELD_NUMBER: _ClassVar[int]
    MAX_BACKOFF_ERROR_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKEN_ERROR_FIELD_NUMBER: _ClassVar[int]
    layout: str
    ngram_counts: _containers.RepeatedScalarFieldContainer[int]
    bytes: int
    bytes_per_ngram: float
    max_prob_error: float
    max_backoff_error: float
    max_token_error: float
    def __init__(self, layout: _Optional[str] = ..., ngram_counts: _Optional[_Iterable[int]] = ..., bytes: _Optional[int] = ..., bytes_per_ngram: _Optional[float] = ..., max_prob_error: _Optional[float] = ..., max_backoff_error: _Optional[float] = ..., max_token_error: _Optional[float] = ...) -> None: ...

class ListModelsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListModelsResponse(_message.Message):
    __slots__ = ("models",)
    MODELS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[ModelInfo]
    def __init__(self, models: _Optional[_Iterable[_Union[ModelInfo, _Mapping]]] = ...) -> None: ...

class GetModelRequest(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: str
    def __init__(self, model: _Optional[str] = ...) -> None: ...

class GetModelResponse(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: ModelInfo
    def __init__(self, model: _Optional[_Union[ModelInfo, _Mapping]] = ...) -> None: ...

class TokenList(_message.Message):
    __slots__ = ("tokens",)
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    tokens: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, tokens: _Optional[_Iterable[str]] = ...) -> None: ...

class TokenIds(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class ScoreOptions(_message.Message):
    __slots__ = ("bos", "eos")
    BOS_FIELD_NUMBER: _ClassVar[int]
    EOS_FIELD_NUMBER: _ClassVar[int]
    bos: bool
    eos: bool
    def __init__(self, bos: _Optional[bool] = ..., eos: _Optional[bool] = ...) -> None: ...

class ScoreRequest(_message.Message):
    __slots__ = ("model", "texts", "token_lists", "token_ids", "options", "return_tokens", "bias")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TEXTS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_LISTS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    RETURN_TOKENS_FIELD_NUMBER: _ClassVar[int]
    BIAS_FIELD_NUMBER: _ClassVar[int]
    model: str
    texts: _containers.RepeatedScalarFieldContainer[str]
    token_lists: _containers.RepeatedCompositeFieldContainer[TokenList]
    token_ids: _containers.RepeatedCompositeFieldContainer[TokenIds]
    options: ScoreOptions
    return_tokens: bool
    bias: BiasList
    def __init__(self, model: _Optional[str] = ..., texts: _Optional[_Iterable[str]] = ..., token_lists: _Optional[_Iterable[_Union[TokenList, _Mapping]]] = ..., token_ids: _Optional[_Iterable[_Union[TokenIds, _Mapping]]] = ..., options: _Optional[_Union[ScoreOptions, _Mapping]] = ..., return_tokens: _Optional[bool] = ..., bias: _Optional[_Union[BiasList, _Mapping]] = ...) -> None: ...

class BiasPhrase(_message.Message):
    __slots__ = ("phrase", "boost")
    PHRASE_FIELD_NUMBER: _ClassVar[int]
    BOOST_FIELD_NUMBER: _ClassVar[int]
    phrase: str
    boost: float
    def __init__(self, phrase: _Optional[str] = ..., boost: _Optional[float] = ...) -> None: ...

class BiasList(_message.Message):
    __slots__ = ("phrases", "boost")
    PHRASES_FIELD_NUMBER: _ClassVar[int]
    BOOST_FIELD_NUMBER: _ClassVar[int]
    phrases: _containers.RepeatedCompositeFieldContainer[BiasPhrase]
    boost: float
    def __init__(self, phrases: _Optional[_Iterable[_Union[BiasPhrase, _Mapping]]] = ..., boost: _Optional[float] = ...) -> None: ...

class TokenDetails(_message.Message):
    __slots__ = ("tokens", "token_ids", "log_probs", "oov", "ngram_lengths")
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOG_PROBS_FIELD_NUMBER: _ClassVar[int]
    OOV_FIELD_NUMBER: _ClassVar[int]
    NGRAM_LENGTHS_FIELD_NUMBER: _ClassVar[int]
    tokens: _containers.RepeatedScalarFieldContainer[str]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    log_probs: _containers.RepeatedScalarFieldContainer[float]
    oov: _containers.RepeatedScalarFieldContainer[bool]
    ngram_lengths: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, tokens: _Optional[_Iterable[str]] = ..., token_ids: _Optional[_Iterable[int]] = ..., log_probs: _Optional[_Iterable[float]] = ..., oov: _Optional[_Iterable[bool]] = ..., ngram_lengths: _Optional[_Iterable[int]] = ...) -> None: ...

class TextScore(_message.Message):
    __slots__ = ("log_prob", "token_count", "oov_count", "details", "bias", "biased_log_prob", "bias_phrases")
    LOG_PROB_FIELD_NUMBER: _ClassVar[int]
    TOKEN_COUNT_FIELD_NUMBER: _ClassVar[int]
    OOV_COUNT_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    BIAS_FIELD_NUMBER: _ClassVar[int]
    BIASED_LOG_PROB_FIELD_NUMBER: _ClassVar[int]
    BIAS_PHRASES_FIELD_NUMBER: _ClassVar[int]
    log_prob: float
    token_count: int
    oov_count: int
    details: TokenDetails
    bias: float
    biased_log_prob: float
    bias_phrases: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, log_prob: _Optional[float] = ..., token_count: _Optional[int] = ..., oov_count: _Optional[int] = ..., details: _Optional[_Union[TokenDetails, _Mapping]] = ..., bias: _Optional[float] = ..., biased_log_prob: _Optional[float] = ..., bias_phrases: _Optional[_Iterable[int]] = ...) -> None: ...

class ScoreResponse(_message.Message):
    __slots__ = ("model", "results")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    model: str
    results: _containers.RepeatedCompositeFieldContainer[TextScore]
    def __init__(self, model: _Optional[str] = ..., results: _Optional[_Iterable[_Union[TextScore, _Mapping]]] = ...) -> None: ...

class PerplexityStats(_message.Message):
    __slots__ = ("log_prob", "token_count", "oov_count", "text_count", "perplexity", "log_prob_excluding_oov", "perplexity_excluding_oov", "word_count", "perplexity_per_word")
    LOG_PROB_FIELD_NUMBER: _ClassVar[int]
    TOKEN_COUNT_FIELD_NUMBER: _ClassVar[int]
    OOV_COUNT_FIELD_NUMBER: _ClassVar[int]
    TEXT_COUNT_FIELD_NUMBER: _ClassVar[int]
    PERPLEXITY_FIELD_NUMBER: _ClassVar[int]
    LOG_PROB_EXCLUDING_OOV_FIELD_NUMBER: _ClassVar[int]
    PERPLEXITY_EXCLUDING_OOV_FIELD_NUMBER: _ClassVar[int]
    WORD_COUNT_FIELD_NUMBER: _ClassVar[int]
    PERPLEXITY_PER_WORD_FIELD_NUMBER: _ClassVar[int]
    log_prob: float
    token_count: int
    oov_count: int
    text_count: int
    perplexity: float
    log_prob_excluding_oov: float
    perplexity_excluding_oov: float
    word_count: int
    perplexity_per_word: float
    def __init__(self, log_prob: _Optional[float] = ..., token_count: _Optional[int] = ..., oov_count: _Optional[int] = ..., text_count: _Optional[int] = ..., perplexity: _Optional[float] = ..., log_prob_excluding_oov: _Optional[float] = ..., perplexity_excluding_oov: _Optional[float] = ..., word_count: _Optional[int] = ..., perplexity_per_word: _Optional[float] = ...) -> None: ...

class PerplexityRequest(_message.Message):
    __slots__ = ("model", "texts", "token_lists", "options")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TEXTS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_LISTS_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    model: str
    texts: _containers.RepeatedScalarFieldContainer[str]
    token_lists: _containers.RepeatedCompositeFieldContainer[TokenList]
    options: ScoreOptions
    def __init__(self, model: _Optional[str] = ..., texts: _Optional[_Iterable[str]] = ..., token_lists: _Optional[_Iterable[_Union[TokenList, _Mapping]]] = ..., options: _Optional[_Union[ScoreOptions, _Mapping]] = ...) -> None: ...

class PerplexityResponse(_message.Message):
    __slots__ = ("model", "stats")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    model: str
    stats: PerplexityStats
    def __init__(self, model: _Optional[str] = ..., stats: _Optional[_Union[PerplexityStats, _Mapping]] = ...) -> None: ...

class CorpusPerplexityRequest(_message.Message):
    __slots__ = ("model", "texts", "token_lists", "options")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TEXTS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_LISTS_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    model: str
    texts: _containers.RepeatedScalarFieldContainer[str]
    token_lists: _containers.RepeatedCompositeFieldContainer[TokenList]
    options: ScoreOptions
    def __init__(self, model: _Optional[str] = ..., texts: _Optional[_Iterable[str]] = ..., token_lists: _Optional[_Iterable[_Union[TokenList, _Mapping]]] = ..., options: _Optional[_Union[ScoreOptions, _Mapping]] = ...) -> None: ...

class CorpusPerplexityResponse(_message.Message):
    __slots__ = ("model", "stats")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    model: str
    stats: PerplexityStats
    def __init__(self, model: _Optional[str] = ..., stats: _Optional[_Union[PerplexityStats, _Mapping]] = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_k", "top_p", "min_p", "typical_p", "repetition_penalty", "presence_penalty", "frequency_penalty", "no_repeat_ngram_size", "seed")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    TYPICAL_P_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    NO_REPEAT_NGRAM_SIZE_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_k: int
    top_p: float
    min_p: float
    typical_p: float
    repetition_penalty: float
    presence_penalty: float
    frequency_penalty: float
    no_repeat_ngram_size: int
    seed: int
    def __init__(self, temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., min_p: _Optional[float] = ..., typical_p: _Optional[float] = ..., repetition_penalty: _Optional[float] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., no_repeat_ngram_size: _Optional[int] = ..., seed: _Optional[int] = ...) -> None: ...

class StoppingCriteria(_message.Message):
    __slots__ = ("max_new_tokens", "min_new_tokens", "stop", "stop_token_ids", "ignore_eos")
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MIN_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    max_new_tokens: int
    min_new_tokens: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    ignore_eos: bool
    def __init__(self, max_new_tokens: _Optional[int] = ..., min_new_tokens: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., ignore_eos: _Optional[bool] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("model", "prompt", "prompt_token_ids", "sampling", "stopping", "n", "logprobs", "top_logprobs", "stream_interval")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    STOPPING_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    STREAM_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    model: str
    prompt: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    sampling: SamplingParams
    stopping: StoppingCriteria
    n: int
    logprobs: bool
    top_logprobs: int
    stream_interval: int
    def __init__(self, model: _Optional[str] = ..., prompt: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., stopping: _Optional[_Union[StoppingCriteria, _Mapping]] = ..., n: _Optional[int] = ..., logprobs: _Optional[bool] = ..., top_logprobs: _Optional[int] = ..., stream_interval: _Optional[int] = ...) -> None: ...

class TokenLogProb(_message.Message):
    __slots__ = ("token_id", "text", "log_prob")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    LOG_PROB_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    text: str
    log_prob: float
    def __init__(self, token_id: _Optional[int] = ..., text: _Optional[str] = ..., log_prob: _Optional[float] = ...) -> None: ...

class GeneratedToken(_message.Message):
    __slots__ = ("sample_index", "index", "token_id", "text", "log_prob", "top_logprobs")
    SAMPLE_INDEX_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    LOG_PROB_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    sample_index: int
    index: int
    token_id: int
    text: str
    log_prob: float
    top_logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogProb]
    def __init__(self, sample_index: _Optional[int] = ..., index: _Optional[int] = ..., token_id: _Optional[int] = ..., text: _Optional[str] = ..., log_prob: _Optional[float] = ..., top_logprobs: _Optional[_Iterable[_Union[TokenLogProb, _Mapping]]] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("prompt_tokens", "generated_tokens", "time_to_first_token_seconds", "total_seconds")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    GENERATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TIME_TO_FIRST_TOKEN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    generated_tokens: int
    time_to_first_token_seconds: float
    total_seconds: float
    def __init__(self, prompt_tokens: _Optional[int] = ..., generated_tokens: _Optional[int] = ..., time_to_first_token_seconds: _Optional[float] = ..., total_seconds: _Optional[float] = ...) -> None: ...

class GenerationFinished(_message.Message):
    __slots__ = ("sample_index", "reason", "text", "log_prob", "usage")
    SAMPLE_INDEX_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    LOG_PROB_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    sample_index: int
    reason: FinishReason
    text: str
    log_prob: float
    usage: Usage
    def __init__(self, sample_index: _Optional[int] = ..., reason: _Optional[_Union[FinishReason, str]] = ..., text: _Optional[str] = ..., log_prob: _Optional[float] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("tokens", "finished")
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    tokens: _containers.RepeatedCompositeFieldContainer[GeneratedToken]
    finished: GenerationFinished
    def __init__(self, tokens: _Optional[_Iterable[_Union[GeneratedToken, _Mapping]]] = ..., finished: _Optional[_Union[GenerationFinished, _Mapping]] = ...) -> None: ...

class BeamSearchRequest(_message.Message):
    __slots__ = ("model", "prompt", "prompt_token_ids", "beam_width", "num_return", "length_penalty", "length_penalty_alpha", "min_length", "max_length", "early_stopping", "no_repeat_ngram_size", "stop_token_ids")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    BEAM_WIDTH_FIELD_NUMBER: _ClassVar[int]
    NUM_RETURN_FIELD_NUMBER: _ClassVar[int]
    LENGTH_PENALTY_FIELD_NUMBER: _ClassVar[int]
    LENGTH_PENALTY_ALPHA_FIELD_NUMBER: _ClassVar[int]
    MIN_LENGTH_FIELD_NUMBER: _ClassVar[int]
    MAX_LENGTH_FIELD_NUMBER: _ClassVar[int]
    EARLY_STOPPING_FIELD_NUMBER: _ClassVar[int]
    NO_REPEAT_NGRAM_SIZE_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    model: str
    prompt: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    beam_width: int
    num_return: int
    length_penalty: LengthPenaltyKind
    length_penalty_alpha: float
    min_length: int
    max_length: int
    early_stopping: bool
    no_repeat_ngram_size: int
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, model: _Optional[str] = ..., prompt: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., beam_width: _Optional[int] = ..., num_return: _Optional[int] = ..., length_penalty: _Optional[_Union[LengthPenaltyKind, str]] = ..., length_penalty_alpha: _Optional[float] = ..., min_length: _Optional[int] = ..., max_length: _Optional[int] = ..., early_stopping: _Optional[bool] = ..., no_repeat_ngram_size: _Optional[int] = ..., stop_token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class BeamHypothesis(_message.Message):
    __slots__ = ("token_ids", "tokens", "text", "log_prob", "score", "finish_reason")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    LOG_PROB_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    tokens: _containers.RepeatedScalarFieldContainer[str]
    text: str
    log_prob: float
    score: float
    finish_reason: FinishReason
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., tokens: _Optional[_Iterable[str]] = ..., text: _Optional[str] = ..., log_prob: _Optional[float] = ..., score: _Optional[float] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ...) -> None: ...

class BeamSearchResponse(_message.Message):
    __slots__ = ("hypotheses",)
    HYPOTHESES_FIELD_NUMBER: _ClassVar[int]
    hypotheses: _containers.RepeatedCompositeFieldContainer[BeamHypothesis]
    def __init__(self, hypotheses: _Optional[_Iterable[_Union[BeamHypothesis, _Mapping]]] = ...) -> None: ...

class Hypothesis(_message.Message):
    __slots__ = ("text", "tokens", "scores")
    class ScoresEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    SCORES_FIELD_NUMBER: _ClassVar[int]
    text: str
    tokens: TokenList
    scores: _containers.ScalarMap[str, float]
    def __init__(self, text: _Optional[str] = ..., tokens: _Optional[_Union[TokenList, _Mapping]] = ..., scores: _Optional[_Mapping[str, float]] = ...) -> None: ...

class NBestList(_message.Message):
    __slots__ = ("id", "hypotheses")
    ID_FIELD_NUMBER: _ClassVar[int]
    HYPOTHESES_FIELD_NUMBER: _ClassVar[int]
    id: str
    hypotheses: _containers.RepeatedCompositeFieldContainer[Hypothesis]
    def __init__(self, id: _Optional[str] = ..., hypotheses: _Optional[_Iterable[_Union[Hypothesis, _Mapping]]] = ...) -> None: ...

class RerankRequest(_message.Message):
    __slots__ = ("model", "lists", "score_weights", "lm_weight", "length_bonus", "length_unit", "options", "bias")
    class ScoreWeightsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    MODEL_FIELD_NUMBER: _ClassVar[int]
    LISTS_FIELD_NUMBER: _ClassVar[int]
    SCORE_WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    LM_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    LENGTH_BONUS_FIELD_NUMBER: _ClassVar[int]
    LENGTH_UNIT_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    BIAS_FIELD_NUMBER: _ClassVar[int]
    model: str
    lists: _containers.RepeatedCompositeFieldContainer[NBestList]
    score_weights: _containers.ScalarMap[str, float]
    lm_weight: float
    length_bonus: float
    length_unit: LengthUnit
    options: ScoreOptions
    bias: BiasList
    def __init__(self, model: _Optional[str] = ..., lists: _Optional[_Iterable[_Union[NBestList, _Mapping]]] = ..., score_weights: _Optional[_Mapping[str, float]] = ..., lm_weight: _Optional[float] = ..., length_bonus: _Optional[float] = ..., length_unit: _Optional[_Union[LengthUnit, str]] = ..., options: _Optional[_Union[ScoreOptions, _Mapping]] = ..., bias: _Optional[_Union[BiasList, _Mapping]] = ...) -> None: ...

class RerankedHypothesis(_message.Message):
    __slots__ = ("index", "rank", "lm_log_prob", "combined_score", "length", "oov_count", "bias", "bias_phrases")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    LM_LOG_PROB_FIELD_NUMBER: _ClassVar[int]
    COMBINED_SCORE_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    OOV_COUNT_FIELD_NUMBER: _ClassVar[int]
    BIAS_FIELD_NUMBER: _ClassVar[int]
    BIAS_PHRASES_FIELD_NUMBER: _ClassVar[int]
    index: int
    rank: int
    lm_log_prob: float
    combined_score: float
    length: int
    oov_count: int
    bias: float
    bias_phrases: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, index: _Optional[int] = ..., rank: _Optional[int] = ..., lm_log_prob: _Optional[float] = ..., combined_score: _Optional[float] = ..., length: _Optional[int] = ..., oov_count: _Optional[int] = ..., bias: _Optional[float] = ..., bias_phrases: _Optional[_Iterable[int]] = ...) -> None: ...

class RerankedList(_message.Message):
    __slots__ = ("id", "hypotheses")
    ID_FIELD_NUMBER: _ClassVar[int]
    HYPOTHESES_FIELD_NUMBER: _ClassVar[int]
    id: str
    hypotheses: _containers.RepeatedCompositeFieldContainer[RerankedHypothesis]
    def __init__(self, id: _Optional[str] = ..., hypotheses: _Optional[_Iterable[_Union[RerankedHypothesis, _Mapping]]] = ...) -> None: ...

class RerankResponse(_message.Message):
    __slots__ = ("lists", "model", "request_tokens", "computed_tokens")
    LISTS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    REQUEST_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPUTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    lists: _containers.RepeatedCompositeFieldContainer[RerankedList]
    model: str
    request_tokens: int
    computed_tokens: int
    def __init__(self, lists: _Optional[_Iterable[_Union[RerankedList, _Mapping]]] = ..., model: _Optional[str] = ..., request_tokens: _Optional[int] = ..., computed_tokens: _Optional[int] = ...) -> None: ...

class Lattice(_message.Message):
    __slots__ = ("id", "format", "text")
    ID_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    id: str
    format: LatticeFormat
    text: str
    def __init__(self, id: _Optional[str] = ..., format: _Optional[_Union[LatticeFormat, str]] = ..., text: _Optional[str] = ...) -> None: ...

class RescoreLatticeRequest(_message.Message):
    __slots__ = ("model", "lattices", "words", "acoustic_scale", "lm_weight", "old_lm_weight", "word_insertion_penalty", "bias", "nbest", "max_history", "beam", "options", "return_lattice")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    LATTICES_FIELD_NUMBER: _ClassVar[int]
    WORDS_FIELD_NUMBER: _ClassVar[int]
    ACOUSTIC_SCALE_FIELD_NUMBER: _ClassVar[int]
    LM_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    OLD_LM_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    WORD_INSERTION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    BIAS_FIELD_NUMBER: _ClassVar[int]
    NBEST_FIELD_NUMBER: _ClassVar[int]
    MAX_HISTORY_FIELD_NUMBER: _ClassVar[int]
    BEAM_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    RETURN_LATTICE_FIELD_NUMBER: _ClassVar[int]
    model: str
    lattices: _containers.RepeatedCompositeFieldContainer[Lattice]
    words: str
    acoustic_scale: float
    lm_weight: float
    old_lm_weight: float
    word_insertion_penalty: float
    bias: BiasList
    nbest: int
    max_history: int
    beam: float
    options: ScoreOptions
    return_lattice: bool
    def __init__(self, model: _Optional[str] = ..., lattices: _Optional[_Iterable[_Union[Lattice, _Mapping]]] = ..., words: _Optional[str] = ..., acoustic_scale: _Optional[float] = ..., lm_weight: _Optional[float] = ..., old_lm_weight: _Optional[float] = ..., word_insertion_penalty: _Optional[float] = ..., bias: _Optional[_Union[BiasList, _Mapping]] = ..., nbest: _Optional[int] = ..., max_history: _Optional[int] = ..., beam: _Optional[float] = ..., options: _Optional[_Union[ScoreOptions, _Mapping]] = ..., return_lattice: _Optional[bool] = ...) -> None: ...

class LatticePath(_message.Message):
    __slots__ = ("words", "text", "combined_score", "acoustic_score", "lm_log_prob", "old_lm_score", "word_count", "bias", "arcs", "oov_count")
    WORDS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    COMBINED_SCORE_FIELD_NUMBER: _ClassVar[int]
    ACOUSTIC_SCORE_FIELD_NUMBER: _ClassVar[int]
    LM_LOG_PROB_FIELD_NUMBER: _ClassVar[int]
    OLD_LM_SCORE_FIELD_NUMBER: _ClassVar[int]
    WORD_COUNT_FIELD_NUMBER: _ClassVar[int]
    BIAS_FIELD_NUMBER: _ClassVar[int]
    ARCS_FIELD_NUMBER: _ClassVar[int]
    OOV_COUNT_FIELD_NUMBER: _ClassVar[int]
    words: _containers.RepeatedScalarFieldContainer[str]
    text: str
    combined_score: float
    acoustic_score: float
    lm_log_prob: float
    old_lm_score: float
    word_count: int
    bias: float
    arcs: _containers.RepeatedScalarFieldContainer[int]
    oov_count: int
    def __init__(self, words: _Optional[_Iterable[str]] = ..., text: _Optional[str] = ..., combined_score: _Optional[float] = ..., acoustic_score: _Optional[float] = ..., lm_log_prob: _Optional[float] = ..., old_lm_score: _Optional[float] = ..., word_count: _Optional[int] = ..., bias: _Optional[float] = ..., arcs: _Optional[_Iterable[int]] = ..., oov_count: _Optional[int] = ...) -> None: ...

class RescoredLattice(_message.Message):
    __slots__ = ("id", "paths", "lattice", "nodes", "arcs", "expanded_nodes", "expanded_arcs", "exact")
    ID_FIELD_NUMBER: _ClassVar[int]
    PATHS_FIELD_NUMBER: _ClassVar[int]
    LATTICE_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    ARCS_FIELD_NUMBER: _ClassVar[int]
    EXPANDED_NODES_FIELD_NUMBER: _ClassVar[int]
    EXPANDED_ARCS_FIELD_NUMBER: _ClassVar[int]
    EXACT_FIELD_NUMBER: _ClassVar[int]
    id: str
    paths: _containers.RepeatedCompositeFieldContainer[LatticePath]
    lattice: str
    nodes: int
    arcs: int
    expanded_nodes: int
    expanded_arcs: int
    exact: bool
    def __init__(self, id: _Optional[str] = ..., paths: _Optional[_Iterable[_Union[LatticePath, _Mapping]]] = ..., lattice: _Optional[str] = ..., nodes: _Optional[int] = ..., arcs: _Optional[int] = ..., expanded_nodes: _Optional[int] = ..., expanded_arcs: _Optional[int] = ..., exact: _Optional[bool] = ...) -> None: ...

class RescoreLatticeResponse(_message.Message):
    __slots__ = ("model", "lattices", "computed_tokens")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    LATTICES_FIELD_NUMBER: _ClassVar[int]
    COMPUTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    model: str
    lattices: _containers.RepeatedCompositeFieldContainer[RescoredLattice]
    computed_tokens: int
    def __init__(self, model: _Optional[str] = ..., lattices: _Optional[_Iterable[_Union[RescoredLattice, _Mapping]]] = ..., computed_tokens: _Optional[int] = ...) -> None: ...

class FuseExtension(_message.Message):
    __slots__ = ("id", "parent", "token_id", "token")
    ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    id: int
    parent: int
    token_id: int
    token: str
    def __init__(self, id: _Optional[int] = ..., parent: _Optional[int] = ..., token_id: _Optional[int] = ..., token: _Optional[str] = ...) -> None: ...

class FuseRequest(_message.Message):
    __slots__ = ("model", "options", "extend", "drop", "query", "candidate_ids", "top_k", "end_log_prob", "sequence")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    EXTEND_FIELD_NUMBER: _ClassVar[int]
    DROP_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_IDS_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    END_LOG_PROB_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    model: str
    options: ScoreOptions
    extend: _containers.RepeatedCompositeFieldContainer[FuseExtension]
    drop: _containers.RepeatedScalarFieldContainer[int]
    query: _containers.RepeatedScalarFieldContainer[int]
    candidate_ids: _containers.RepeatedScalarFieldContainer[int]
    top_k: int
    end_log_prob: bool
    sequence: int
    def __init__(self, model: _Optional[str] = ..., options: _Optional[_Union[ScoreOptions, _Mapping]] = ..., extend: _Optional[_Iterable[_Union[FuseExtension, _Mapping]]] = ..., drop: _Optional[_Iterable[int]] = ..., query: _Optional[_Iterable[int]] = ..., candidate_ids: _Optional[_Iterable[int]] = ..., top_k: _Optional[int] = ..., end_log_prob: _Optional[bool] = ..., sequence: _Optional[int] = ...) -> None: ...

class FusedHypothesis(_message.Message):
    __slots__ = ("id", "token_log_prob", "candidate_log_probs", "top_ids", "top_log_probs", "top_tokens", "end_log_prob")
    ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_LOG_PROB_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_LOG_PROBS_FIELD_NUMBER: _ClassVar[int]
    TOP_IDS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOG_PROBS_FIELD_NUMBER: _ClassVar[int]
    TOP_TOKENS_FIELD_NUMBER: _ClassVar[int]
    END_LOG_PROB_FIELD_NUMBER: _ClassVar[int]
    id: int
    token_log_prob: float
    candidate_log_probs: _containers.RepeatedScalarFieldContainer[float]
    top_ids: _containers.RepeatedScalarFieldContainer[int]
    top_log_probs: _containers.RepeatedScalarFieldContainer[float]
    top_tokens: _containers.RepeatedScalarFieldContainer[str]
    end_log_prob: float
    def __init__(self, id: _Optional[int] = ..., token_log_prob: _Optional[float] = ..., candidate_log_probs: _Optional[_Iterable[float]] = ..., top_ids: _Optional[_Iterable[int]] = ..., top_log_probs: _Optional[_Iterable[float]] = ..., top_tokens: _Optional[_Iterable[str]] = ..., end_log_prob: _Optional[float] = ...) -> None: ...

class FuseResponse(_message.Message):
    __slots__ = ("hypotheses", "sequence", "live", "model")
    HYPOTHESES_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    LIVE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    hypotheses: _containers.RepeatedCompositeFieldContainer[FusedHypothesis]
    sequence: int
    live: int
    model: str
    def __init__(self, hypotheses: _Optional[_Iterable[_Union[FusedHypothesis, _Mapping]]] = ..., sequence: _Optional[int] = ..., live: _Optional[int] = ..., model: _Optional[str] = ...) -> None: ...

class CompleteRequest(_message.Message):
    __slots__ = ("session_id", "model", "append_text", "append_tokens", "rollback_tokens", "partial_word", "k", "reset", "context", "sequence", "user_words", "history", "cache_weight")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    APPEND_TEXT_FIELD_NUMBER: _ClassVar[int]
    APPEND_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ROLLBACK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PARTIAL_WORD_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    RESET_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    USER_WORDS_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    CACHE_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    model: str
    append_text: str
    append_tokens: _containers.RepeatedScalarFieldContainer[str]
    rollback_tokens: int
    partial_word: str
    k: int
    reset: bool
    context: TokenList
    sequence: int
    user_words: TokenList
    history: SessionHistory
    cache_weight: float
    def __init__(self, session_id: _Optional[str] = ..., model: _Optional[str] = ..., append_text: _Optional[str] = ..., append_tokens: _Optional[_Iterable[str]] = ..., rollback_tokens: _Optional[int] = ..., partial_word: _Optional[str] = ..., k: _Optional[int] = ..., reset: _Optional[bool] = ..., context: _Optional[_Union[TokenList, _Mapping]] = ..., sequence: _Optional[int] = ..., user_words: _Optional[_Union[TokenList, _Mapping]] = ..., history: _Optional[_Union[SessionHistory, _Mapping]] = ..., cache_weight: _Optional[float] = ...) -> None: ...

class SessionHistory(_message.Message):
    __slots__ = ("sentences",)
    SENTENCES_FIELD_NUMBER: _ClassVar[int]
    sentences: _containers.RepeatedCompositeFieldContainer[TokenList]
    def __init__(self, sentences: _Optional[_Iterable[_Union[TokenList, _Mapping]]] = ...) -> None: ...

class Completion(_message.Message):
    __slots__ = ("word", "log_prob")
    WORD_FIELD_NUMBER: _ClassVar[int]
    LOG_PROB_FIELD_NUMBER: _ClassVar[int]
    word: str
    log_prob: float
    def __init__(self, word: _Optional[str] = ..., log_prob: _Optional[float] = ...) -> None: ...

class CompleteResponse(_message.Message):
    __slots__ = ("session_id", "completions", "context_tokens", "sequence", "skipped", "appended_tokens", "rebuilt", "model")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    COMPLETIONS_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    APPENDED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REBUILT_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    completions: _containers.RepeatedCompositeFieldContainer[Completion]
    context_tokens: int
    sequence: int
    skipped: bool
    appended_tokens: _containers.RepeatedScalarFieldContainer[str]
    rebuilt: bool
    model: str
    def __init__(self, session_id: _Optional[str] = ..., completions: _Optional[_Iterable[_Union[Completion, _Mapping]]] = ..., context_tokens: _Optional[int] = ..., sequence: _Optional[int] = ..., skipped: _Optional[bool] = ..., appended_tokens: _Optional[_Iterable[str]] = ..., rebuilt: _Optional[bool] = ..., model: _Optional[str] = ...) -> None: ...
