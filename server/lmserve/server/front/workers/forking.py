"""The front's end of the engine workers' fork server (`worker.forkserver`).

    worker = fork_worker(sock)     # a worker forked from the pre-imported fork server
    worker.poll(); worker.wait(2.0); worker.kill()   # as on a `subprocess.Popen`

One fork server per front process, started on the first worker's launch (a fresh interpreter,
like the workers before it) and again if it ever died; it exits when this process does. A
worker gets the environment and working directory the front has when it launches the worker,
as a child of the front's would: the fork server has those it was started with, so a front
whose environment or directory changed since (a program that sets PYTHONPATH for a model
family module, then starts a server) gets another fork server for them. Each worker is its
child, not the front's: its exit status comes back on a pipe the fork server
writes when it reaps the worker (`ForkedWorker`). Blocking throughout: call off the event loop.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

_MODULE = "lmserve.server.worker.forkserver"
_PID = struct.Struct("<q")
_STATUS = struct.Struct("<i")
# Imports only (the models load in the workers), on a machine that may be busy.
_START_TIMEOUT_SECONDS = 120.0
_REPLY_TIMEOUT_SECONDS = 30.0
# Not told by the fork server (it died before the worker did): as multiprocessing says.
UNKNOWN_STATUS = 255


class ForkServerError(Exception):
    """The fork server could not be started or did not fork the worker."""


class ForkedWorker:
    """A worker forked by the fork server, with `subprocess.Popen`'s calls: `pid`,
    `returncode`, `poll`, `wait` (raising `subprocess.TimeoutExpired`) and `kill`."""

    def __init__(self, pid: int, status_fd: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._status_fd: int | None = status_fd
        self._orphaned = False  # the fork server died first: watched through /proc

    def poll(self) -> int | None:
        """The exit status, or None while the worker runs."""
        if self.returncode is None:
            self._read_status(0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"engine worker {self.pid}", timeout or 0.0)
            self._read_status(0.05 if self._orphaned else left)
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        """SIGKILL, unless it has exited (its status read first: its pid may be reused once
        the fork server reaped it)."""
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)

    def _read_status(self, timeout: float | None) -> None:
        fd = self._status_fd
        if fd is None:  # orphaned: alive while /proc says so
            if not _exists(self.pid):
                self.returncode = UNKNOWN_STATUS
            return
        ready, _, _ = select.select([fd], [], [], timeout)
        if not ready:
            return
        data = os.read(fd, _STATUS.size)
        os.close(fd)
        self._status_fd = None
        if len(data) == _STATUS.size:
            self.returncode = _STATUS.unpack(data)[0]
        else:  # end of file: the fork server died; the worker may live on
            self._orphaned = True
            self._read_status(0.0)

    def __del__(self) -> None:
        if self._status_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._status_fd)


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _exists(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


class _ForkServer:
    """The running fork server and the front's socket to it (one request at a time)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._control: socket.socket | None = None

    def fork(self, worker_sock: socket.socket) -> ForkedWorker:
        with self._lock:
            for _ in range(2):  # a fork server that died since the last fork is started again
                control = self._running()
                fds: list[int] = []
                try:
                    streams = [n for n in (1, 2) if _is_open(n)]  # the worker's stdout, stderr
                    request = b"F" + bytes(streams)
                    socket.send_fds(control, [request], [worker_sock.fileno(), *streams])
                    message, fds, _, _ = socket.recv_fds(control, _PID.size, 1)
                except OSError:
                    message = b""
                if len(message) == _PID.size and len(fds) == 1:
                    return ForkedWorker(_PID.unpack(message)[0], fds[0])
                for fd in fds:
                    os.close(fd)
                self._discard()
        raise ForkServerError("the engine fork server did not fork the worker")

    def _running(self) -> socket.socket:
        if self._control is not None and self._process is not None:
            if self._process.poll() is None:
                return self._control
            self._discard()
        front, back = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", _MODULE, str(back.fileno())],
                pass_fds=[back.fileno()],
                stdin=subprocess.DEVNULL,
            )
        finally:
            back.close()
        front.settimeout(_START_TIMEOUT_SECONDS)
        try:
            ready = front.recv(1)
        except OSError:
            ready = b""
        if ready != b"R":
            front.close()
            process.kill()
            process.wait()
            raise ForkServerError(f"the engine fork server did not start (status {process.poll()})")
        front.settimeout(_REPLY_TIMEOUT_SECONDS)
        self._process, self._control = process, front
        return front

    def _discard(self) -> None:
        if self._control is not None:
            self._control.close()  # its end of file ends the fork server
        if self._process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(1.0)
        self._process = self._control = None


_servers: dict[tuple[str, tuple[tuple[str, str], ...]], _ForkServer] = {}
_servers_lock = threading.Lock()


def fork_worker(worker_sock: socket.socket) -> ForkedWorker:
    """A worker forked from the fork server of this process's current environment and working
    directory (started if it does not run), serving on its end `worker_sock` of the front's
    socketpair."""
    key = (os.getcwd(), tuple(sorted(os.environ.items())))
    with _servers_lock:
        server = _servers.setdefault(key, _ForkServer())
    return server.fork(worker_sock)
