"""The other front processes of `fronts: N`: more Python fronts on the same gRPC port.

    fronts = ExtraFronts(settings, port, directory)   # the first front, once it serves
    await fronts.start()                              # N - 1 processes, each READY when it binds
    fronts.reload(); fronts.stop(); fronts.join(5.0)

    python -m lmserve.server.front.process.other_front    # one of them (config on stdin)

One Python front's event loop is one core: on a machine with many cores it caps what the
workers can serve. The first front starts the workers and N - 1 other fronts; each other
front reads the repository (vocabularies and codecs, no weights), connects to every worker at
the address the first front publishes (`front.workers.directory`), and binds the same port
with SO_REUSEPORT, so the kernel spreads the connections over the fronts. The first front alone
serves HTTP, /metrics and the health port, and owns reloads: SIGHUP reaches the others after
its own reload. An other front that exits is restarted after a second; stopping the first
front stops them (SIGTERM: they drain their calls in the same grace period).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from lmserve.server.front.workers.directory import WorkerDirectory
from lmserve.server.front.workers.launch import exit_description, wait_exit
from lmserve.server.settings import Settings

log = logging.getLogger(__name__)

# The other fronts' main (it imports `app`, which imports this module: never the reverse).
_MODULE = "lmserve.server.front.process.other_front"
RESTART_SECONDS = 1.0


@dataclass(frozen=True)
class ExtraFrontConfig:
    """What one other front needs (pickled on its stdin: settings objects and a path)."""

    settings: Settings
    index: int
    directory: Path


def other_settings(settings: Settings, port: int) -> Settings:
    """The first front's settings as another front serves them: its port, gRPC only."""
    return settings.model_copy(
        update={
            "port": port,
            "http_enabled": False,
            "metrics_enabled": False,
            "health_port": None,
            "reload_poll_seconds": None,
        }
    )


class ExtraFronts:
    """The first front's handle on the others (see the module doc)."""

    def __init__(self, settings: Settings, port: int, directory: WorkerDirectory) -> None:
        self.settings = other_settings(settings, port)
        self.count = settings.fronts - 1
        self.directory = directory
        self._processes: dict[int, subprocess.Popen[bytes]] = {}
        self._stopping = False
        self._lock = threading.Lock()

    async def start(self) -> None:
        """Starts them and waits (bounded) until each serves."""
        await asyncio.gather(*(asyncio.to_thread(self._start, i) for i in range(1, self.count + 1)))

    def _start(self, index: int) -> None:
        config = ExtraFrontConfig(self.settings, index, self.directory.path)
        process = subprocess.Popen(
            [sys.executable, "-m", _MODULE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(pickle.dumps(config, protocol=5))
        process.stdin.close()
        with self._lock:
            self._processes[index] = process
        line = process.stdout.readline()  # "serving" once bound, or EOF if it failed
        if line.strip() != b"serving":
            process.wait()
            log.error("front %d failed to start: it %s", index, exit_description(process))
        threading.Thread(target=self._watch, args=(index, process), daemon=True).start()

    def _watch(self, index: int, process: subprocess.Popen[bytes]) -> None:
        """Restarts a front that exits while the server runs."""
        process.wait()
        if self._stopping:
            return
        log.warning("front %d %s; restarting it", index, exit_description(process))
        threading.Event().wait(RESTART_SECONDS)
        if not self._stopping:
            self._start(index)

    def pids(self) -> list[int]:
        with self._lock:
            return [p.pid for p in self._processes.values() if p.poll() is None]

    def reload(self) -> None:
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGHUP)

    def stop(self) -> None:
        """Tells each front to stop (SIGTERM: each drains on its own grace period)."""
        self._stopping = True
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    def join(self, timeout: float) -> None:
        """After `stop`: waits for them to exit, kills what is left; removes the directory."""
        with self._lock:
            processes = list(self._processes.values())
        for process in processes:
            if wait_exit(process, timeout) is None:
                process.kill()
                process.wait(1.0)
        self.directory.remove()
