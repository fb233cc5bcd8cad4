"""`lmserve` as users see it: the commands both distributions register, `serve --help` generated
from the Settings model, and the server address from LMSERVE_ADDRESS."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from lmserve.client import cli as client_cli
from lmserve.client.commands import COMMANDS as CLIENT_COMMANDS
from lmserve.server import cli as server_cli
from lmserve.server.cli import COMMANDS as SERVER_COMMANDS
from lmserve.server.settings import Settings

LMSERVE = Path(sys.executable).with_name("lmserve")


def lmserve(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LMSERVE), *argv], capture_output=True, text=True, timeout=60, env=env
    )


def test_installed_entry_points_give_both_tables() -> None:
    # Read from the installed metadata (both distributions' entry_points.txt), not imported.
    found = client_cli.installed_commands()
    assert set(SERVER_COMMANDS) <= set(found) and set(CLIENT_COMMANDS) <= set(found)
    commands = list(client_cli.all_commands())
    assert commands == [*SERVER_COMMANDS, *CLIENT_COMMANDS]  # server first, as before


def test_a_broken_table_is_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    class Broken:
        def load(self) -> object:
            raise ImportError("half removed")

    class Extra:
        def load(self) -> object:
            return {"hello": "lmserve.client.commands.health"}

    monkeypatch.setattr(client_cli, "entry_points", lambda group: [Broken(), Extra()])
    assert list(client_cli.all_commands()) == ["hello", *CLIENT_COMMANDS]


def test_console_script_lists_every_command() -> None:
    result = lmserve("--help")
    assert result.returncode == 0, result.stderr
    for name in [*SERVER_COMMANDS, *CLIENT_COMMANDS]:
        assert f"\n    {name}" in result.stdout, name
    assert "LMSERVE_ADDRESS" in result.stdout


def test_serve_help_lists_every_setting_with_env_var_and_default() -> None:
    result = lmserve("serve", "--help")
    assert result.returncode == 0, result.stderr
    table = result.stdout.split("\nsettings (", 1)[1]
    for name, field in Settings.model_fields.items():
        line = next(
            (ln for ln in table.splitlines() if ln.startswith(f"  LMSERVE_{name.upper()}  ")),
            None,
        )
        assert line is not None, f"{name} missing from serve --help"
        default = field.get_default()
        shown = "unset" if default is None else str(default).lower()
        assert f"(default {shown}" in line.lower(), line
    assert "  LMSERVE_PORT  (default 50051; int; --port)" in table
    assert "0 picks a free port" in table  # the comment above the field
    assert "--auth-token)" not in table  # a refused flag is not offered
    # A usage error stays short.
    bad = lmserve("serve", "--no-such-flag")
    assert bad.returncode == 2 and "LMSERVE_PORT" not in bad.stderr


def test_address_comes_from_lmserve_address(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LMSERVE_ADDRESS", raising=False)
    parser, _ = client_cli.build_parser()
    assert parser.parse_args(["health"]).target == "localhost:50051"
    monkeypatch.setenv("LMSERVE_ADDRESS", "lm.example:6000")
    parser, _ = client_cli.build_parser()
    assert parser.parse_args(["health"]).target == "lm.example:6000"
    assert parser.parse_args(["health", "--target", "h:1"]).target == "h:1"
    assert parser.parse_args(["score", "--address", "h:2", "--model", "m"]).target == "h:2"


@pytest.mark.parametrize("command", [*SERVER_COMMANDS, *CLIENT_COMMANDS])
def test_every_command_help_formats(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    # argparse %-formats help strings: a bare "%" (e.g. "80%)") crashes --help with ValueError.
    with pytest.raises(SystemExit) as exit_info:
        server_cli.main([command, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: lmserve " + command), out[:200]
    assert "%(" not in out and "%%" not in out  # every placeholder and escape was formatted


def test_train_ngram_help_shows_the_memory_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        server_cli.main(["train-ngram", "--help"])
    assert "(default 80%)" in " ".join(capsys.readouterr().out.split())
