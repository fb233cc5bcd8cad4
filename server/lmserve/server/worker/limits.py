"""Every limit a request is held to, in one object built once from the settings.

    limits = EngineLimits.from_settings(settings)
    limits.requests.max_text_bytes, limits.scoring.scoring_unit_tokens, limits.generation.max_n

`Settings` owns every limit and its default (its groups `RequestLimits`, `ScoringSettings`,
`GenerationLimits`, `SessionSettings`, `FusionSettings`); this holds the groups' values alone,
which is what an engine worker is sent (`WorkerSpec`), never the whole settings. The API layer
validates requests against `requests` (and `generation` for decoding knobs); the engine sizes
its work by `scoring`, `generation`, `sessions` and `fusion`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lmserve.server.settings import (
    FusionSettings,
    GenerationLimits,
    RequestLimits,
    SessionSettings,
    Settings,
)
from lmserve.server.worker.autocomplete.sessions import SessionLimits
from lmserve.server.worker.scoring.queue import ScoringLimits


def _default_sessions() -> SessionLimits:
    return SessionLimits.of(SessionSettings())


@dataclass(frozen=True)
class EngineLimits:
    """The request, scoring, generation and session limits together (defaults: the settings'
    defaults)."""

    requests: RequestLimits = field(default_factory=RequestLimits)
    scoring: ScoringLimits = field(default_factory=ScoringLimits)
    generation: GenerationLimits = field(default_factory=GenerationLimits)
    sessions: SessionLimits = field(default_factory=_default_sessions)
    fusion: FusionSettings = field(default_factory=FusionSettings)

    @classmethod
    def from_settings(cls, settings: Settings) -> EngineLimits:
        return cls(
            requests=RequestLimits.of(settings),
            scoring=ScoringLimits.of(settings),
            generation=GenerationLimits.of(settings),
            sessions=SessionLimits.of(settings),
            fusion=FusionSettings.of(settings),
        )
