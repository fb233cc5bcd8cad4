"""The lifecycle and security settings: defaults, `lmserve serve` flags, and the token kept out
of reprs and the process list."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from lmserve.server.commands.serve import add_arguments, settings_from_args
from lmserve.server.front.api.auth import configured_token
from lmserve.server.settings import load_settings


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for key in list(os.environ):
        if key.startswith("LMSERVE_"):
            monkeypatch.delenv(key)


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def test_defaults_serve_all_interfaces_plaintext_without_auth() -> None:
    s = load_settings()
    assert (s.host, s.metrics_host) == ("[::]", "0.0.0.0")
    assert (s.shutdown_notice_seconds, s.grace_period_seconds) == (5.0, 30.0)
    assert (s.tls_cert_file, s.tls_key_file, s.tls_client_ca_file) == (None, None, None)
    assert (s.auth_token_file, s.auth_token, s.auth_health_open) == (None, None, True)
    assert configured_token(s) is None


def test_serve_flags_reach_the_settings(tmp_path: Path) -> None:
    args = _parse(
        "--host", "127.0.0.1", "--metrics-host", "127.0.0.1",
        "--shutdown-notice-seconds", "0", "--grace-period-seconds", "12",
        "--tls-cert-file", "s.pem", "--tls-key-file", "s.key", "--tls-client-ca-file", "ca.pem",
        "--auth-token-file", str(tmp_path / "token"),
    )  # fmt: skip
    s = settings_from_args(args)
    assert (s.host, s.metrics_host) == ("127.0.0.1", "127.0.0.1")
    assert (s.shutdown_notice_seconds, s.grace_period_seconds) == (0.0, 12.0)
    assert (s.tls_cert_file, s.tls_client_ca_file) == (Path("s.pem"), Path("ca.pem"))
    assert s.auth_token_file == tmp_path / "token"


def test_there_is_no_token_flag(capsys: pytest.CaptureFixture[str]) -> None:
    # Not even as an abbreviation of --auth-token-file (whose errors would print the token).
    with pytest.raises(SystemExit):
        _parse("--auth-token", "abc-secret")
    err = capsys.readouterr().err
    assert "use --auth-token-file or LMSERVE_AUTH_TOKEN" in err and "abc-secret" not in err


def test_the_token_from_env_or_file_never_shows_in_a_repr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LMSERVE_AUTH_TOKEN", "env-token-123")
    s = load_settings()
    assert configured_token(s) == "env-token-123"
    assert "env-token-123" not in repr(s) and "env-token-123" not in str(s.model_dump())
    monkeypatch.delenv("LMSERVE_AUTH_TOKEN")
    (tmp_path / "token").write_text("  file-token-456\n")
    assert configured_token(load_settings({"auth_token_file": tmp_path / "token"})) == (
        "file-token-456"
    )
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(OSError, match="is empty"):
        configured_token(load_settings({"auth_token_file": tmp_path / "empty"}))
    with pytest.raises(OSError, match="cannot read the auth token file"):
        configured_token(load_settings({"auth_token_file": tmp_path / "missing"}))


def test_the_health_port_is_off_by_default_and_set_by_env_or_flags(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    s = load_settings()
    assert (s.health_host, s.health_port) == ("0.0.0.0", 0)
    monkeypatch.setenv("LMSERVE_HEALTH_PORT", "8081")
    assert load_settings().health_port == 8081
    s = settings_from_args(_parse("--health-port", "9000", "--health-host", "127.0.0.1"))
    assert (s.health_host, s.health_port) == ("127.0.0.1", 9000)
    monkeypatch.setenv("LMSERVE_HEALTH_PORT", "70000")
    with pytest.raises(ValueError):
        load_settings()
