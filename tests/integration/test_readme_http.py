"""The README's HTTP examples, run as written (curl, and the OpenAI client snippet) against a real
server on the shipped kjv-lstm model: each must succeed and answer what it promises."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from served import ServerFactory

from lmserve.server.front.process.app import BackgroundServer

REPO = Path(__file__).resolve().parents[2]
# The HTTP guide of the documentation site (the README's section before the site).
README = REPO / "docs" / "guides" / "http.md"
FENCE = re.compile(r"```(sh|python)\n(.*?)```", re.DOTALL)


def _section() -> str:
    return README.read_text(encoding="utf-8")


def _blocks(language: str) -> list[str]:
    return [body for lang, body in FENCE.findall(_section()) if lang == language]


def _curl_commands() -> list[str]:
    """Each `curl` command with the lines that continue it (bash reads them as written)."""
    commands: list[str] = []
    for block in _blocks("sh"):
        for line in block.splitlines():
            if line.startswith("curl"):
                commands.append(line)
            elif commands and line.strip():
                commands[-1] += "\n" + line
    return commands


@pytest.fixture(scope="module")
def server(serve: ServerFactory, shipped_repository: Path) -> BackgroundServer:
    """The shipped models as `make serve` serves them (the docs' tests share this server)."""
    return serve(shipped_repository, http_port=0)


def test_the_readme_has_examples_of_each_api() -> None:
    commands = _curl_commands()
    assert any("/lmserve.v1.LanguageModelService/Score" in c for c in commands)
    assert any("/v1/completions" in c and '"stream": true' in c for c in commands)
    assert len(_blocks("python")) == 1


@pytest.mark.parametrize("index", range(len(_curl_commands())))
def test_curl_example_runs(server: BackgroundServer, index: int) -> None:
    command = _curl_commands()[index].replace("localhost:8080", f"127.0.0.1:{server.http_port}")
    done = subprocess.run(
        ["bash", "-c", command], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, (command, done.stderr, done.stdout)
    if '"stream": true' in command:
        events = [line for line in done.stdout.splitlines() if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]"
        chunks = [json.loads(e[len("data: ") :]) for e in events[:-1]]
        assert "".join(c["choices"][0]["text"] for c in chunks).strip()
    else:
        answer = json.loads(done.stdout)
        assert answer and "error" not in answer


def test_openai_snippet_runs(server: BackgroundServer) -> None:
    [snippet] = _blocks("python")
    code = snippet.replace("localhost:8080", f"127.0.0.1:{server.http_port}")
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "completion_tokens" in lines[0]
    log_probs = json.loads(lines[1])  # a list of floats prints as JSON
    assert len(log_probs) == 3 and all(lp <= 0 for lp in log_probs)
