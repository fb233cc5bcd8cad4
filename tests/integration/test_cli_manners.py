"""`lmserve` ends like a shell tool: a reader that goes away (`| head -1`) and Ctrl-C (SIGINT)
end it quietly (no traceback), with statuses 141 (or 0) and 130. Real processes: a real server
on a loopback port, the console script in a real shell pipeline or under a real signal."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from serve_process import ServeProcess, clean_env

LMSERVE = str(Path(sys.executable).with_name("lmserve"))
SENTENCE = "and god said let there be light and there was light"


@pytest.fixture(scope="module")
def server(model_repository: Path) -> Iterator[ServeProcess]:
    with ServeProcess(model_repository) as running:
        yield running


def _quiet(stderr: str) -> None:
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr
    assert "BrokenPipe" not in stderr and "KeyboardInterrupt" not in stderr, stderr


def test_score_into_head_ends_quietly(server: ServeProcess, tmp_path: Path) -> None:
    lines = tmp_path / "in.txt"
    lines.write_text("".join(f"{SENTENCE} {i}\n" for i in range(20_000)))
    err = tmp_path / "err.txt"
    script = (
        f'"$LMSERVE" score --target {server.address} --model kjv3 --json --batch-size 200 '
        f'--file "$INPUT" 2>"$ERR" | head -1; echo "status=${{PIPESTATUS[0]}}" >&2'
    )
    env = clean_env(LMSERVE=LMSERVE, INPUT=str(lines), ERR=str(err))
    result = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, timeout=120, env=env
    )
    [first] = result.stdout.splitlines()
    assert json.loads(first)["text"] == f"{SENTENCE} 0"
    status = int(result.stderr.strip().rsplit("status=", 1)[1])
    assert status in (0, 141), (status, err.read_text())
    _quiet(err.read_text())
    assert err.read_text() == ""


def _interrupted(command: list[str], feed: str | None) -> subprocess.Popen[str]:
    """`command` started, its first output line read (it is mid-call), then sent SIGINT. It
    starts with SIGINT's default action, as from a terminal: a child inherits an ignored
    signal, and a run of the whole suite may have left SIGINT ignored in this process."""
    process = subprocess.Popen(
        ["env", "--default-signal=INT", *command],
        stdin=subprocess.PIPE if feed is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(),
    )
    assert process.stdout is not None
    if feed is not None:
        assert process.stdin is not None
        process.stdin.write(feed)
        process.stdin.flush()  # the rest of stdin never comes: a slow producer
    assert process.stdout.read(1), "no output before the interrupt"
    os.kill(process.pid, signal.SIGINT)
    return process


@pytest.mark.parametrize("command", ["score", "generate"])
def test_ctrl_c_ends_with_130_and_no_traceback(server: ServeProcess, command: str) -> None:
    base = [LMSERVE, command, "--target", server.address, "--model", "kjv3"]
    if command == "score":
        process = _interrupted([*base, "--file", "-", "--batch-size", "1"], SENTENCE + "\n")
    else:
        argv = ["--max-new-tokens", "4096", "--ignore-eos", "--stream-interval", "1"]
        process = _interrupted([*base, *argv], None)
    try:
        _, stderr = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, stderr
    _quiet(stderr)
