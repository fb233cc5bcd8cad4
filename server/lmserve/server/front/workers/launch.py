"""Starting an engine worker process and waiting until it serves.

    launched = launch(spec)              # forked by the fork server, spec sent on its socket
    handshake(launched, timeout=120.0)   # READY, or WorkerStartError with the reason

A worker is forked from the workers' fork server (`forking`, `worker.forkserver`): an
interpreter that imported the worker's modules once, so each worker starts without 0.4 s of
imports and shares those pages copy-on-write. Never a fork of the front: it inherits none of
the front's threads, sockets or gRPC state, and nothing of the program that embeds the server.
Blocking throughout: call off the event loop.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from lmserve.server.families.catalog import (
    find_model_manifest,
    model_components,
    read_model_manifest,
)
from lmserve.server.front.workers.forking import ForkServerError, fork_worker
from lmserve.server.registry.repository import LoadOptions
from lmserve.server.settings import Settings
from lmserve.server.shared import protocol
from lmserve.server.worker.process import WorkerSpec


class Process(Protocol):
    """A child process as supervision sees it: `subprocess.Popen`, or a `ForkedWorker`."""

    @property
    def pid(self) -> int: ...
    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def kill(self) -> None: ...


@dataclass(frozen=True)
class WorkerSettings:
    """How workers are started and how often one may die before its model is failed (from
    the settings, which own the defaults: `from_settings`)."""

    load_options: LoadOptions
    start_timeout_seconds: float
    max_restarts: int
    restart_window_seconds: float
    niceness: int
    log_level: str
    log_format: str

    @classmethod
    def from_settings(cls, settings: Settings) -> WorkerSettings:
        return cls(
            load_options=LoadOptions.from_settings(settings),  # with the weights: it computes
            start_timeout_seconds=settings.worker_start_timeout_seconds,
            max_restarts=settings.worker_max_restarts,
            restart_window_seconds=settings.worker_restart_window_seconds,
            niceness=settings.worker_niceness,
            log_level=settings.log_level,
            log_format=settings.log_format,
        )


class WorkerStartError(Exception):
    """A worker did not become READY: it failed to load its model, died, or timed out."""


class ModelLoadFailed(WorkerStartError):
    """The worker could not load its model (a broken file): the load error as clients see it.
    Restarting cannot help; the model is FAILED until a reload."""


@dataclass
class Launched:
    """A started worker: its process, the front's end of its socket, and (once READY) where
    other fronts connect to it."""

    process: Process
    sock: socket.socket
    address: str = ""


def launch(spec: WorkerSpec) -> Launched:
    """Starts the worker and sends it its spec; `handshake` waits for it to be READY."""
    front, back = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    for sock in (front, back):
        protocol.tune_socket(sock)
    try:
        process = fork_worker(back)
    except ForkServerError as exc:
        front.close()
        raise WorkerStartError(str(exc)) from None
    finally:
        back.close()  # the worker has its own copy now
    front.sendall(protocol.encode(protocol.Start.of(spec)))
    return Launched(process, front)


def handshake(launched: Launched, timeout: float) -> None:
    """Blocks until the worker is READY; `ModelLoadFailed` when its model did not load,
    WorkerStartError when it died or timed out. The socket is non-blocking afterwards, for
    the event loop."""
    sock = launched.sock
    sock.settimeout(timeout)
    try:
        first = protocol.recv_frame(sock, protocol.decoder(protocol.TO_FRONT))
    except TimeoutError:
        launched.process.kill()
        sock.close()
        raise WorkerStartError("its engine worker did not start in time") from None
    except OSError:
        first = None
    if not isinstance(first, protocol.Ready):
        wait_exit(launched.process, 2.0)
        sock.close()
        if isinstance(first, protocol.Failed):
            raise ModelLoadFailed(first.reason)
        why = exit_description(launched.process)
        raise WorkerStartError(f"its engine worker failed to start: {why}")
    launched.address = first.address
    sock.setblocking(False)


def model_folders(folder: Path) -> tuple[Path, ...]:
    """The folders a worker loads for the model in `folder`: the models it is built from (a
    mixture's components, found beside it by name, recursively) first, the model last."""
    siblings: dict[str, Path] | None = None
    out: list[Path] = []

    def add(model: Path) -> None:
        nonlocal siblings
        names = model_components(model, read_model_manifest(model))
        if names and siblings is None:
            siblings = _models_beside(folder)
        for name in names:
            if siblings is not None and name in siblings:
                add(siblings[name])
        if model not in out:
            out.append(model)

    add(folder)
    return tuple(out)


def _models_beside(folder: Path) -> dict[str, Path]:
    """The model folders beside `folder`, by model name (a broken one is nobody's component)."""
    siblings: dict[str, Path] = {}
    for sibling in sorted(p for p in folder.parent.iterdir() if p.is_dir()):
        if find_model_manifest(sibling) is not None:
            with contextlib.suppress(Exception):
                siblings.setdefault(read_model_manifest(sibling).name, sibling)
    return siblings


def wait_exit(process: Process, timeout: float) -> int | None:
    """The exit status within `timeout` s, else None (still running)."""
    try:
        return process.wait(timeout)
    except subprocess.TimeoutExpired:
        return None


def exit_description(process: Process) -> str:
    code = process.poll()
    if code is None:
        return "stopped answering"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
        return f"was killed by signal {-code}"
    return f"exited with status {code}"
