"""Settings precedence: flags > environment > config file > defaults."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from lmserve.server.settings import Settings, load_settings


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for key in list(os.environ):
        if key.startswith("LMSERVE_"):
            monkeypatch.delenv(key)


def test_defaults() -> None:
    s = load_settings()
    assert s.model_repository == Path("models")
    assert (s.host, s.port, s.metrics_port) == ("[::]", 50051, 9090)
    assert s.max_texts_per_request == 10_000
    assert s.max_tokens_per_text == 100_000


def test_precedence_flags_env_file_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "lmserve.yaml"
    config.write_text("port: 1111\nmetrics_port: 2222\nmax_texts_per_request: 33\nhost: filehost\n")
    monkeypatch.setenv("LMSERVE_CONFIG", str(config))
    monkeypatch.setenv("LMSERVE_PORT", "3333")
    monkeypatch.setenv("LMSERVE_METRICS_PORT", "4444")
    s = load_settings({"port": 5555, "model_repository": None})
    assert s.port == 5555  # flag beats env
    assert s.metrics_port == 4444  # env beats file
    assert s.max_texts_per_request == 33  # file beats default
    assert s.host == "filehost"
    assert s.model_repository == Path("models")  # absent flag (None) leaves the default
    assert s.max_tokens_per_text == 100_000  # default


def test_config_flag_beats_config_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env_file, flag_file = tmp_path / "env.yaml", tmp_path / "flag.yaml"
    env_file.write_text("port: 1\n")
    flag_file.write_text("port: 2\n")
    monkeypatch.setenv("LMSERVE_CONFIG", str(env_file))
    assert load_settings({"config": flag_file}).port == 2


def test_bad_values_are_rejected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValidationError, match="port"):
        load_settings({"port": 70000})
    monkeypatch.setenv("LMSERVE_MAX_TEXTS_PER_REQUEST", "0")
    with pytest.raises(ValidationError, match="max_texts_per_request"):
        load_settings()
    monkeypatch.delenv("LMSERVE_MAX_TEXTS_PER_REQUEST")
    config = tmp_path / "bad.yaml"
    config.write_text("no_such_setting: 1\n")
    with pytest.raises(ValidationError, match="no_such_setting"):
        load_settings({"config": config})


def test_settings_are_frozen() -> None:
    s = Settings()
    with pytest.raises(ValidationError):
        s.port = 1  # type: ignore[misc]
