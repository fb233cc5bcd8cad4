"""Runs `lmserve serve` in a child process on a free port, for benchmarks (no shared GIL).

with ServerProcess(Path("models")) as server:
    LmServeClient(server.target)...
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self

from common import REPO_ROOT, log


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class ServerProcess:
    """`lmserve serve` over one model repository, listening on 127.0.0.1:<free port>."""

    def __init__(self, repository: Path, *, extra_args: tuple[str, ...] = ()) -> None:
        self.repository = repository
        self.port = free_port()
        self.target = f"127.0.0.1:{self.port}"
        self.extra_args = extra_args
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "lmserve.server.cli",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--model-repository",
            str(self.repository),
            *self.extra_args,
        ]

    def __enter__(self) -> Self:
        env = dict(os.environ)
        env["LMSERVE_METRICS_ENABLED"] = "false"  # no clash on the metrics port
        env.setdefault("LMSERVE_HTTP_PORT", "0")  # nor on the HTTP port
        env["LMSERVE_LOG_LEVEL"] = "WARNING"
        self._log = tempfile.TemporaryFile()
        self._proc = subprocess.Popen(
            self.command(), cwd=REPO_ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT
        )
        self._wait_listening(timeout=120)
        return self

    def _wait_listening(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise RuntimeError(f"server exited with {self._proc.returncode}:\n{self.output()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"server not listening after {timeout}s:\n{self.output()}")

    def output(self) -> str:
        if self._log is None:
            return ""
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-4000:]

    @property
    def pid(self) -> int:
        """The server process's id (for psutil: memory, CPU)."""
        assert self._proc is not None
        return self._proc.pid

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def kill(self) -> None:
        """Kills the server at once (SIGKILL): a guard, e.g. when its memory runs away."""
        if self.alive():
            assert self._proc is not None
            self._proc.kill()
            self._proc.wait()

    def cpu_seconds(self) -> float:
        """User + system CPU time the server has used so far: the front process and its
        engine workers (live ones; a worker's time is lost if it exits mid-measurement)."""
        import psutil

        total = 0.0
        for process in self.processes():
            try:
                times = process.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += times.user + times.system
        return total

    def processes(self) -> list[Any]:
        """psutil.Process of the front (first) and of its descendants: the engine workers and
        the fork server they are forked from."""
        import psutil

        assert self._proc is not None
        front = psutil.Process(self._proc.pid)
        return [front, *front.children(recursive=True)]

    def rss_bytes(self) -> dict[str, int]:
        """Resident memory of each process: "front", the fork server and each worker by its
        title."""
        import psutil

        out = {}
        for index, process in enumerate(self.processes()):
            try:
                title = " ".join(process.cmdline())
                rss = process.memory_info().rss
            except psutil.NoSuchProcess:
                continue
            # The front first; then the workers' fork server and the workers, by their titles.
            name = "front" if index == 0 else title.removeprefix("lmserve: engine ").strip()
            out[name] = int(rss)
        return out

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                log("server did not stop in 15 s; killing it")
                self._proc.kill()
                self._proc.wait()
        if self._log is not None:
            self._log.close()
