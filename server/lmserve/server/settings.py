"""The server's settings: one object built once (flags > env > config file > defaults).

    settings = load_settings({"port": 0})          # flags as overrides
    settings.port, settings.model_repository

Environment variables use the `LMSERVE_` prefix (`LMSERVE_PORT=6000`); the optional YAML config
file comes from `--config FILE` or `LMSERVE_CONFIG`. Only this module touches the environment.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, Self

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]


class SettingsGroup(BaseModel):
    """Settings that one part of the server reads on its own (an engine worker's limits): a
    base of `Settings`, so each field, default and bound is written once, here, and the worker
    gets the group's values alone (`Group.of(settings)`), not the whole settings."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    @classmethod
    def of(cls, settings: Settings) -> Self:
        """The group's values out of the settings; a field that is not a setting (a subclass's
        engine constant) keeps its default."""
        fields = type(settings).model_fields
        return cls.model_validate(
            {name: getattr(settings, name) for name in cls.model_fields if name in fields}
        )


class RequestLimits(SettingsGroup):
    """What one request may carry, checked before any work starts (the API validates it)."""

    max_texts_per_request: int = Field(default=10_000, ge=1)
    max_tokens_per_text: int = Field(default=100_000, ge=1)
    # Rerank: n-best lists per request and hypotheses per list.
    max_rerank_lists: int = Field(default=1_000, ge=1)
    max_rerank_hypotheses: int = Field(default=1_000, ge=1)
    # Rerank and Score: phrases one bias list may hold (a contact list, a glossary).
    max_bias_phrases: int = Field(default=10_000, ge=1)
    # Complete: the most suggestions one keystroke may ask for.
    max_completions: int = Field(default=100, ge=1)
    # Complete: user words one session may hold.
    max_user_words: int = Field(default=10_000, ge=1)
    # RescoreLattice: lattices per request, nodes and arcs per lattice, the (lattice node,
    # history) states one lattice may expand to and the paths it may return (past any of
    # them: RESOURCE_EXHAUSTED); the merge order of recurrent and transformer histories when a
    # request sets no `max_history` (Kaldi's max_ngram_order), and, with a bias list, how many
    # best paths by the unbiased score the bias re-ranks.
    max_lattices: int = Field(default=1_000, ge=1)
    max_lattice_nodes: int = Field(default=100_000, ge=1)
    max_lattice_arcs: int = Field(default=1_000_000, ge=1)
    max_lattice_states: int = Field(default=200_000, ge=1)
    max_lattice_nbest: int = Field(default=1_000, ge=1)
    lattice_max_history: int = Field(default=4, ge=1)
    lattice_bias_candidates: int = Field(default=100, ge=1)
    # Input hardening. A text (texts, prompts, hypotheses, append_text) longer than this many
    # UTF-8 bytes is refused before it is tokenized.
    max_text_bytes: int = Field(default=1024 * 1024, ge=1)


class ScoringSettings(SettingsGroup):
    """How big a scoring pass may be and how much scoring may wait (`worker.scoring`)."""

    # Scoring work is cut into units of at most this many positions (rows x padded length):
    # a neural pass's time and memory (rows x length x vocabulary log-probs) are bounded by it,
    # and a short request waits for at most one unit of a long one.
    scoring_unit_tokens: int = Field(default=256, ge=1)
    scoring_unit_rows: int = Field(default=64, ge=1)
    # Scoring positions that may wait per model before requests get RESOURCE_EXHAUSTED.
    scoring_max_queued_tokens: int = Field(default=4_000_000, ge=1)


class GenerationLimits(SettingsGroup):
    """What a model's generation runs under (`worker.generation`) and the per-request limits
    Generate and BeamSearch are validated against. See `scheduler`, `admission` (chunked
    prefill, `prefill_step_share`), `backpressure` (`max_unread_events`) and `context_window`
    (`max_cache_bytes`). `max_queued_requests` counts requests that would have to wait for a
    slot: 0 means no waiting room (a request that fits the free slots is still admitted)."""

    # Generation: one continuous-batching scheduler per model steps every active sequence.
    # Sequences (streams x samples) stepped together; more wait in the queue.
    max_active_sequences: int = Field(default=256, ge=1)
    # Generate requests waiting for a slot; beyond this the server answers RESOURCE_EXHAUSTED.
    max_queued_requests: int = Field(default=1024, ge=0)
    # Upper bound of a request's max_new_tokens (and a beam's max_length).
    max_new_tokens: int = Field(default=4096, ge=1)
    # Upper bound of Generate's n (independent samples of one request).
    max_n: int = Field(default=16, ge=1)
    max_beam_width: int = Field(default=64, ge=1)
    max_top_logprobs: int = Field(default=20, ge=0)
    # Prompt tokens one scheduler iteration reads before it steps the running sequences, and
    # the share of a step's time a chunk may take while sequences run (chunked prefill).
    prefill_chunk_tokens: int = Field(default=512, ge=1)
    prefill_step_share: float = Field(default=0.75, gt=0)
    # Beam searches per model that run at once, and that may wait; beyond: RESOURCE_EXHAUSTED.
    max_running_searches: int = Field(default=2, ge=1)
    max_queued_searches: int = Field(default=64, ge=0)
    # A Generate stream with more events waiting for its handler than this (a client that
    # stopped reading) has its sequences parked, keeping their slots, until it drained to half.
    max_unread_events: int = Field(default=256, ge=1)
    # A transformer's key/value cache (bytes, per model) that its generating samples may
    # reserve, each sample (1 + prompt + max_new_tokens) positions: requests beyond it wait.
    max_cache_bytes: int = Field(default=1 << 30, ge=1)


class SessionSettings(SettingsGroup):
    """Autocomplete sessions and their adaptive word cache (`worker.autocomplete`)."""

    # Autocomplete sessions each model keeps (least recently used dropped first), how long an
    # idle one is kept, and the memory they may take (model states and distributions).
    complete_max_sessions: int = Field(default=10_000, ge=1)
    complete_session_idle_seconds: float = Field(default=600.0, gt=0)
    complete_session_memory_mb: int = Field(default=512, ge=1)
    # Adaptive autocomplete (word models): a cache model of the session's own words, mixed in
    # with this weight (0 turns it off; a session may set its own), the pseudo-count of each
    # user word, and how many words of finished sentences it keeps. Measured in bench/README
    # ("Adaptive autocomplete").
    complete_cache_weight: float = Field(default=0.2, ge=0.0, lt=1.0)
    complete_user_word_count: float = Field(default=1.0, gt=0.0)
    complete_cache_history_words: int = Field(default=5_000, ge=0)


class FusionSettings(SettingsGroup):
    """Shallow fusion's sessions (`Fuse`, `worker.fusion`): what one stream and one model may
    hold. Each live hypothesis holds its model state and its next-token distribution
    (vocabulary x 4 bytes)."""

    # Live hypotheses one Fuse stream may hold, and one model across its streams.
    fuse_max_hypotheses: int = Field(default=2_048, ge=1)
    fuse_max_live_hypotheses: int = Field(default=16_384, ge=1)
    # What one message may ask of each answer: candidate token ids and the top k.
    fuse_max_candidates: int = Field(default=4_096, ge=0)
    fuse_max_top_k: int = Field(default=1_000, ge=0)


class Settings(
    RequestLimits,
    ScoringSettings,
    GenerationLimits,
    SessionSettings,
    FusionSettings,
    BaseSettings,
):
    """Everything the server can be told. Built by `load_settings`, then passed down."""

    model_config = SettingsConfigDict(env_prefix="LMSERVE_", extra="forbid", frozen=True)

    # A YAML file with any of the fields below (lowest priority above the defaults).
    config: Path | None = None
    model_repository: Path = Path("models")
    host: str = "[::]"
    # 0 picks a free port; the bound one is logged.
    port: int = Field(default=50051, ge=0, le=65535)
    # The HTTP front on `host` (front/api/http): every RPC as Connect JSON, the OpenAI-compatible
    # /v1 API, the autocomplete WebSocket and its page. 0 picks a free port.
    http_enabled: bool = True
    http_port: int = Field(default=8080, ge=0, le=65535)
    # The HTTP port's server: uvicorn (HTTP/1.1; Connect's bidirectional streams half-duplex),
    # or hypercorn (HTTP/1.1 and HTTP/2: h2c, and ALPN with TLS; full-duplex streams).
    http_server: Literal["uvicorn", "hypercorn"] = "uvicorn"
    # Web pages of other origins that may call the HTTP front (CORS on Connect and /v1, and
    # the autocomplete WebSocket), e.g. "https://app.example.com"; "*" allows any. Empty: the
    # server's own page only; a browser request from any other origin is refused (403).
    # Requests without an Origin header (non-browser clients) are never refused for it.
    # Comma-separated in LMSERVE_ALLOWED_ORIGINS.
    allowed_origins: Annotated[tuple[str, ...], NoDecode] = ()

    @field_validator("allowed_origins", mode="before")
    @classmethod
    def _split_origins(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    metrics_enabled: bool = True
    metrics_host: str = "0.0.0.0"
    metrics_port: int = Field(default=9090, ge=0, le=65535)
    # A second, plaintext port serving only grpc.health.v1 (no auth: it shows serving status
    # only), for probes that cannot speak TLS (Kubernetes' gRPC probes). 0: off.
    health_host: str = "0.0.0.0"
    health_port: int = Field(default=0, ge=0, le=65535)
    max_message_bytes: int = Field(default=64 * 1024 * 1024, ge=1024)
    max_concurrent_rpcs: int | None = Field(default=None, ge=1)
    # A client connection is closed (gracefully) after this many seconds, so clients re-resolve
    # and spread over replicas added since; None keeps connections for ever. On the HTTP port
    # the first response after the age says `Connection: close` (WebSockets are left alone).
    max_connection_age_seconds: float | None = Field(default=None, gt=0)
    # After the shutdown notice, in-flight RPCs get this long (Kubernetes' default 30 s).
    grace_period_seconds: float = Field(default=30.0, ge=0)
    log_level: LogLevel = "INFO"
    # Neural models. ONNX Runtime: one session per graph, sequential execution (best on 2 cores).
    onnx_intra_op_threads: int = Field(default=2, ge=0)
    onnx_inter_op_threads: int = Field(default=1, ge=0)
    # Spinning keeps ORT's idle threads busy-waiting between ops: off, since every engine worker
    # and the front share the cores (on: the worker took 25% more CPU per generated token at 32
    # kjv-lstm streams, 0.343 against 0.275 ms; the whole server 16% more).
    onnx_allow_spinning: bool = False
    # Use the CUDA execution provider when onnxruntime-gpu sees a GPU.
    onnx_use_gpu: bool = True
    # Generation leaves recurrent states where ONNX Runtime computed them (I/O binding), so a
    # step on the GPU takes the last step's states without copying them to the host and back:
    # auto = on the CUDA provider only; on = always (the CPU provider too); off = never.
    onnx_device_states: Literal["auto", "on", "off"] = "auto"
    # Longer texts are scored in time chunks of this many tokens, the state carried across.
    max_chunk_tokens: int = Field(default=256, ge=1)
    # TorchScript models run code from the model file when loaded: false refuses them.
    allow_torchscript: bool = True
    # Model families served beside the built-in ones (`lmserve.server.families`), each a
    # `module:attribute` naming a ModelFamily, imported by the front and every engine worker
    # (e.g. `["my_models.family:FAMILY"]`; the module must be importable by both).
    model_families: list[str] = Field(default_factory=list)

    # -- lifecycle and security ----------------------------------------------------------------
    # On SIGTERM health goes NOT_SERVING at once and RPCs are still served this long, so that
    # load balancers stop sending new work before the server stops accepting it.
    shutdown_notice_seconds: float = Field(default=5.0, ge=0)
    # TLS: a PEM certificate chain and its key; with a client CA, clients must present a
    # certificate it signed (mTLS). All unset: plaintext.
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    tls_client_ca_file: Path | None = None
    # Bearer-token auth: every RPC needs `authorization: Bearer <token>`. The token comes from a
    # file (kept out of the process list and config files) or LMSERVE_AUTH_TOKEN; unset: no auth.
    auth_token_file: Path | None = None
    auth_token: SecretStr | None = None
    # Lets grpc.health.v1 through without a token (load balancers and kubelet probes have none).
    auth_health_open: bool = True
    # Hot reload: SIGHUP always rescans the repository; with this set, it is also rescanned
    # every so many seconds (None: only on SIGHUP).
    reload_poll_seconds: float | None = Field(default=None, gt=0)

    # -- engine workers ------------------------------------------------------------------------
    # Each served model computes in an engine worker process of its own (`lmserve: engine
    # NAME`), so the front's event loop never waits on a model and a crash stays with its model.
    # false runs every model on threads of the front's own process (one interpreter).
    engine_workers: bool = True
    # A worker that is not READY (its model loaded) within this long counts as failed to start.
    worker_start_timeout_seconds: float = Field(default=120.0, gt=0)
    # A worker that dies is restarted (after 0.5 s, doubling up to 8 s); one that died more than
    # this many times within the window marks its model failed instead (GetModel says why).
    worker_max_restarts: int = Field(default=5, ge=0)
    # Neural models' workers run at this niceness above the front's (n-gram workers, whose
    # lookups take microseconds, at the front's): when both want the two cores, the front
    # (network loop, small requests, streams' writes) is scheduled first.
    worker_niceness: int = Field(default=10, ge=0, le=19)
    worker_restart_window_seconds: float = Field(default=60.0, gt=0)
    # Front processes serving the gRPC port together (SO_REUSEPORT), each connected to every
    # engine worker: for machines whose cores one Python front cannot keep busy. The first
    # front also serves HTTP, /metrics, the health port and reloads (it forwards SIGHUP); the
    # others serve gRPC. More than 1 needs engine_workers.
    fronts: int = Field(default=1, ge=1, le=64)

    @model_validator(mode="after")
    def _check_fronts(self) -> Settings:
        if self.fronts > 1 and not self.engine_workers:
            raise ValueError("fronts > 1 needs engine_workers: true (fronts share the workers)")
        return self

    @model_validator(mode="after")
    def _check_security(self) -> Settings:
        """Half a TLS or auth configuration is a mistake to refuse, never to serve around."""
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file must be given together")
        if self.tls_client_ca_file is not None and self.tls_cert_file is None:
            raise ValueError("tls_client_ca_file (mTLS) needs tls_cert_file and tls_key_file")
        if self.auth_token_file is not None and self.auth_token is not None:
            raise ValueError("give auth_token_file or auth_token, not both")
        if self.auth_token is not None and not self.auth_token.get_secret_value().strip():
            raise ValueError("auth_token is empty")
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Order is priority: flags (init kwargs), then environment, then the config file.
        return init_settings, env_settings, ConfigFileSource(settings_cls)

    # -- observability -------------------------------------------------------------------------
    # "json": one JSON object per log line (time, level, logger, message, and request_id, method,
    # model inside an RPC); "text": plain lines.
    log_format: Literal["text", "json"] = "text"
    # One INFO line per RPC (method, model, code, duration_ms, request_id) on `lmserve.access`;
    # None: on with log_format json, off with text.
    access_log: bool | None = None
    # Each RPC an OpenTelemetry span (needs the `otel` extra; the SDK and exporter are configured
    # the usual OTEL_* way by whoever sets the global tracer provider).
    otel_tracing: bool = False


class ConfigFileSource(PydanticBaseSettingsSource):
    """Reads the YAML file named by the `config` value the flags or environment gave."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ reads the whole file at once

    def __call__(self) -> dict[str, Any]:
        path = self.current_state.get("config")
        if not path:
            return {}
        return read_config_file(Path(path))


def read_config_file(path: Path) -> dict[str, Any]:
    """The mapping in a YAML config file; keys are Settings field names."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"config file {path}: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"config file {path}: expected a mapping of settings")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def load_settings(overrides: Mapping[str, Any] | None = None) -> Settings:
    """Builds the settings; `overrides` are the command-line flags that were given (not None)."""
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    return Settings(**given)
