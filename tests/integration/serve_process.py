"""`lmserve serve` as a real process on loopback, for the lifecycle, security and balancing tests.

    with ServeProcess(repository, "--shutdown-notice-seconds", "0") as server:
        grpc.insecure_channel(server.address)

Its stderr is drained by a thread (a full pipe would stall the server) and kept in `lines`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Self

SERVING = re.compile(r"serving \S+ on 127\.0\.0\.1:(\d+)")
METRICS = re.compile(r"metrics on http://127\.0\.0\.1:(\d+)/metrics")
HEALTH = re.compile(r"health on 127\.0\.0\.1:(\d+)")
HTTP = re.compile(r"HTTP on https?://127\.0\.0\.1:(\d+)/")


def serve_command(repository: Path, *flags: str) -> list[str]:
    command = [sys.executable, "-m", "lmserve.server.cli", "serve", "--host", "127.0.0.1"]
    command += ["--metrics-host", "127.0.0.1", "--model-repository", str(repository)]
    if "--port" not in flags:
        command += ["--port", "0"]
    if "--metrics-port" not in flags:
        command += ["--metrics-port", "0"]
    if "--http-port" not in flags:
        command += ["--http-port", "0"]
    if "--health-port" in flags:
        command += ["--health-host", "127.0.0.1"]
    return command + list(flags)


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LMSERVE_")}
    return {**env, **extra}


class ServeProcess:
    """A started `lmserve serve`; `port`, `metrics_port` (and `health_port` with
    `--health-port`) once it reported them."""

    def __init__(
        self, repository: Path, *flags: str, env: dict[str, str] | None = None, wait: float = 60
    ) -> None:
        self.process = subprocess.Popen(
            serve_command(repository, *flags),
            env=clean_env() if env is None else env,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self._ready = threading.Event()
        self.port = 0
        self.metrics_port = 0
        self.health_port = 0
        self.http_port = 0
        threading.Thread(target=self._drain, daemon=True).start()
        if not self._ready.wait(wait) or not self.port:
            self.kill()
            raise RuntimeError("lmserve serve did not start:\n" + self.stderr())

    def _drain(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append(line)
            if match := METRICS.search(line):
                self.metrics_port = int(match.group(1))
            if match := HEALTH.search(line):
                self.health_port = int(match.group(1))
            if match := HTTP.search(line):
                self.http_port = int(match.group(1))
            if match := SERVING.search(line):
                self.port = int(match.group(1))
                self._ready.set()
        self._ready.set()  # exited before serving

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stderr(self) -> str:
        return "".join(self.lines)

    def wait(self, timeout: float) -> int:
        return self.process.wait(timeout=timeout)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.kill()


def wait_until(condition: Callable[[], object], timeout: float, step: float = 0.05) -> bool:
    """Polls `condition()` until it is true or `timeout` seconds passed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(step)
    return False


def process_title(pid: int) -> str:
    """A process's command line as `ps` shows it (an engine worker: `lmserve: engine NAME`)."""
    with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
        return cmdline.read().replace(b"\0", b" ").decode().strip()


def process_exists(pid: int) -> bool:
    """Whether `pid` runs (a zombie, exited but not yet reaped, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def engine_worker_pids(pid: int) -> list[int]:
    """The engine workers of the server process `pid`: its descendants titled as workers (they
    are children of its workers' fork server, not its own)."""
    out, parents = [], [pid]
    while parents:
        children = child_pids(parents.pop())
        parents += children
        for child in children:
            try:
                if process_title(child).startswith("lmserve: engine "):
                    out.append(child)
            except OSError:  # gone meanwhile
                continue
    return sorted(out)


def child_pids(pid: int) -> list[int]:
    """The processes whose parent is `pid` (Linux /proc)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    parent = int(stat.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            if parent == pid:
                out.append(int(entry))
    return out
