"""Every limit a request is held to, built once from the settings: one object owns them.

    limits = EngineLimits.from_settings(settings)
    limits.requests.max_texts_per_request, limits.scoring.unit_tokens, limits.generation.max_n

The API layer validates requests against `requests` (and `generation` for decoding knobs); the
engine sizes its work by `scoring` and `generation`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lmserve.server.decoding.word_cache import CacheConfig
from lmserve.server.settings import Settings
from lmserve.server.worker.autocomplete.sessions import SessionLimits
from lmserve.server.worker.generation.limits import GenerationLimits
from lmserve.server.worker.scoring.queue import ScoringLimits


@dataclass(frozen=True)
class RequestLimits:
    """What one request may carry (checked before any work starts)."""

    max_texts_per_request: int = 10_000
    max_tokens_per_text: int = 100_000
    # Rerank: lists per request and hypotheses per list.
    max_rerank_lists: int = 1_000
    max_rerank_hypotheses: int = 1_000
    # Rerank and Score: phrases in one bias list.
    max_bias_phrases: int = 10_000
    # Complete: suggestions per keystroke, and user words per session.
    max_completions: int = 100
    max_user_words: int = 10_000
    # UTF-8 bytes of one text (texts, prompts, hypotheses, append_text), checked before tokenizing.
    max_text_bytes: int = 1024 * 1024


@dataclass(frozen=True)
class EngineLimits:
    """The request, scoring and generation limits together."""

    requests: RequestLimits = field(default_factory=RequestLimits)
    scoring: ScoringLimits = field(default_factory=ScoringLimits)
    generation: GenerationLimits = field(default_factory=GenerationLimits)
    sessions: SessionLimits = field(default_factory=SessionLimits)

    @classmethod
    def from_settings(cls, settings: Settings) -> EngineLimits:
        return cls(
            requests=RequestLimits(
                max_texts_per_request=settings.max_texts_per_request,
                max_tokens_per_text=settings.max_tokens_per_text,
                max_rerank_lists=settings.max_rerank_lists,
                max_rerank_hypotheses=settings.max_rerank_hypotheses,
                max_bias_phrases=settings.max_bias_phrases,
                max_completions=settings.max_completions,
                max_user_words=settings.max_user_words,
                max_text_bytes=settings.max_text_bytes,
            ),
            scoring=ScoringLimits(
                unit_tokens=settings.scoring_unit_tokens,
                unit_rows=settings.scoring_unit_rows,
                max_queued_tokens=settings.scoring_max_queued_tokens,
            ),
            generation=GenerationLimits(
                max_active_sequences=settings.max_active_sequences,
                max_queued_requests=settings.max_queued_requests,
                max_new_tokens=settings.max_new_tokens,
                max_n=settings.max_n,
                max_beam_width=settings.max_beam_width,
                max_top_logprobs=settings.max_top_logprobs,
                prefill_chunk_tokens=settings.prefill_chunk_tokens,
                prefill_step_share=settings.prefill_step_share,
                max_running_searches=settings.max_running_searches,
                max_queued_searches=settings.max_queued_searches,
                max_unread_events=settings.max_unread_events,
                max_cache_bytes=settings.max_cache_bytes,
            ),
            sessions=SessionLimits(
                max_sessions=settings.complete_max_sessions,
                idle_seconds=settings.complete_session_idle_seconds,
                max_bytes=settings.complete_session_memory_mb * 1024 * 1024,
                cache=CacheConfig(
                    weight=settings.complete_cache_weight,
                    user_word_count=settings.complete_user_word_count,
                    history_words=settings.complete_cache_history_words,
                ),
            ),
        )
