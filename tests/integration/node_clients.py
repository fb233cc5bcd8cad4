"""The Node clients of tests/clients/node (Connect-ES): their packages installed from the lock
file when missing, and the code generated from our .proto by protoc-gen-es, once per run.

    script = node_client("grpc_web_call.mjs")
    answer = run_node(script, "http://127.0.0.1:8080", "kjv3")   # its last JSON line
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

CLIENT = Path(__file__).resolve().parents[1] / "clients" / "node"
PROTO = Path(__file__).resolve().parents[2] / "proto"


@functools.cache
def _prepared() -> None:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.fail("node and npm are needed for the Connect-ES client tests")
    if not (CLIENT / "node_modules" / "@connectrpc" / "connect-node").is_dir():
        install = [npm, "ci", "--silent", "--no-audit", "--no-fund"]
        subprocess.run(install, cwd=CLIENT, check=True, timeout=600)
    generated = CLIENT / "gen"
    generated.mkdir(exist_ok=True)
    subprocess.run(
        [
            sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTO}",
            f"--plugin=protoc-gen-es={CLIENT / 'node_modules' / '.bin' / 'protoc-gen-es'}",
            f"--es_out={generated}", "--es_opt=target=js,import_extension=js",
            str(PROTO / "lmserve" / "v1" / "lm_service.proto"),
        ],
        check=True,
        timeout=120,
    )  # fmt: skip


def node_client(script: str) -> Path:
    _prepared()
    return CLIENT / script


def run_node(script: Path, *args: str, env: dict[str, str] | None = None) -> Any:
    """Runs a client script; its last stdout line, as JSON (the test fails on a non-zero exit)."""
    run = subprocess.run(
        ["node", str(script), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def run_node_code(code: str) -> str:
    """Runs a snippet as a module beside the clients (their packages and generated code
    resolve); returns its stdout."""
    _prepared()
    script = CLIENT / "snippet.mjs"
    script.write_text(code, encoding="utf-8")
    try:
        run = subprocess.run(["node", str(script)], capture_output=True, text=True, timeout=120)
    finally:
        script.unlink(missing_ok=True)
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout
