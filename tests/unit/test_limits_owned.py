"""Every limit is a field of `Settings` (its groups), and the worker's view carries it as set."""

from __future__ import annotations

import pickle

from lmserve.server.settings import (
    GenerationLimits,
    RequestLimits,
    ScoringSettings,
    SessionSettings,
    Settings,
    SettingsGroup,
)
from lmserve.server.worker.limits import EngineLimits

GROUPS: list[type[SettingsGroup]] = [
    RequestLimits,
    ScoringSettings,
    GenerationLimits,
    SessionSettings,
]


def test_each_group_is_part_of_the_settings() -> None:
    for group in GROUPS:
        assert issubclass(Settings, group)
        for name, field in group.model_fields.items():
            assert Settings.model_fields[name].default == field.default, name


def test_the_worker_view_carries_what_was_set() -> None:
    settings = Settings.model_validate(
        {
            "max_n": 3,
            "max_text_bytes": 2048,
            "scoring_unit_rows": 5,
            "complete_session_memory_mb": 2,
            "complete_cache_weight": 0.5,
        }
    )
    limits = EngineLimits.from_settings(settings)
    assert limits.generation.max_n == 3
    assert limits.requests.max_text_bytes == 2048
    assert limits.scoring.scoring_unit_rows == 5
    assert limits.scoring.inline_tokens == 8192  # the engine's own, not a setting
    assert limits.sessions.max_bytes == 2 * 1024 * 1024
    assert limits.sessions.cache.weight == 0.5
    assert pickle.loads(pickle.dumps(limits)) == limits  # what `WorkerSpec` sends a worker


def test_the_defaults_are_the_settings_defaults() -> None:
    assert EngineLimits() == EngineLimits.from_settings(Settings.model_construct())
