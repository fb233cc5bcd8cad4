"""The limits a model's generation work runs under (filled from the server's settings)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GenerationLimits:
    """How many sequences one model steps together, how many requests may wait, how much prompt
    an iteration reads, how many beam searches run at once, and the per-request limits Generate
    and BeamSearch are validated against.

    `max_queued_requests` counts requests that would have to wait for a slot: 0 means no waiting
    room (a request that fits the free slots is still admitted). `prefill_chunk_tokens` bounds
    the prompt tokens one scheduler iteration reads before it steps the running sequences, so a
    long prompt delays their next token by one chunk's time, not by the whole prompt's. While
    sequences run, the chunk is further sized so that reading it takes about
    `prefill_step_share` of a step's time (adapted from measured times), which bounds their
    inter-token latency to about (1 + share) times a step's (an LSTM reads a prompt token at
    ~0.6 ms on the development VM: 512 tokens would be ~25 steps of batch 16).

    `max_cache_bytes`: see `context_window.ContextWindow`.

    `max_unread_events`: a stream with more events handed over than its handler has taken
    (a client that stopped reading) has its sequences parked until it drained below half.
    """

    max_active_sequences: int = 256
    max_queued_requests: int = 1024
    max_new_tokens: int = 4096
    max_n: int = 16
    max_beam_width: int = 64
    max_top_logprobs: int = 20
    prefill_chunk_tokens: int = 512
    prefill_step_share: float = 0.75
    max_running_searches: int = 2
    max_queued_searches: int = 64
    max_unread_events: int = 256
    # A transformer's key/value cache its running, parked and prefilling samples may reserve
    # (`context_window`): requests wait beyond it.
    max_cache_bytes: int = 1 << 30

    def __post_init__(self) -> None:
        for name in (
            "max_active_sequences",
            "prefill_chunk_tokens",
            "max_running_searches",
            "max_unread_events",
            "max_cache_bytes",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if not 0 < self.prefill_step_share:
            raise ValueError("prefill_step_share must be > 0")
        if self.max_queued_requests < 0 or self.max_queued_searches < 0:
            raise ValueError("queue limits must be >= 0")
