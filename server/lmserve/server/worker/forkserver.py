"""The engine workers' fork server: one pre-imported interpreter that forks every worker.

    python -m lmserve.server.worker.forkserver FD   # `front.workers.forking` starts it

A fresh interpreter per worker spends ~0.4 s and ~40 MB of private heap (module objects,
bytecode, numpy's and msgspec's state) importing what every worker imports alike. This process
imports it once; each worker is a `fork` of it and shares those pages copy-on-write (the
collector is kept off them: `gc.freeze`). It is itself a fresh interpreter started by the front,
so it holds none of the front's threads, sockets or gRPC state, and it imports no program's
main module (multiprocessing's fork server would import the embedding program's `__main__`
into every worker, and its exit handler joins children that ignore SIGTERM).

Fork safety: it imports the worker's modules and nothing that starts threads except numpy's
OpenBLAS pool (whose fork handlers stop it around `fork`); ONNX Runtime, which starts a thread
when imported, and every session are imported and made in the worker, after the fork.

The front talks to it over FD (a Unix socket): each request is b"F" with the new worker's socket
attached (SCM_RIGHTS), then the numbers of the front's standard streams (1, 2) whose files
follow it, which become the worker's (its log goes where the front's goes now, as a child of
the front's would); the reply is the worker's pid (8 bytes) with the read end of a
pipe attached, on which this process writes the worker's exit status (4 bytes, signed:
`os.waitstatus_to_exitcode`) when it reaps it. The front's end of FD closing (the front exited,
SIGKILL included) ends this process; the workers end themselves when their own sockets close.
SIGINT and SIGTERM are ignored, as in the workers: a signal to the process group is the
front's to handle.
"""

from __future__ import annotations

import contextlib
import gc
import os
import select
import signal
import socket
import struct
import sys

import setproctitle

# What every worker imports, imported once here: the worker's process module pulls in the
# engine, the families, the backends' Python side, numpy, msgspec and protobuf.
import lmserve.server.worker.process as worker_process
from lmserve.server.allocator import keep_freed_memory

_PID = struct.Struct("<q")
_STATUS = struct.Struct("<i")


def _fork_worker(
    control: socket.socket, worker_fd: int, streams: dict[int, int], close_in_worker: list[int]
) -> int:
    """Forks one worker serving on `worker_fd`, with `streams` (standard stream number -> the
    front's file) as its own; returns its pid (in this process)."""
    pid = os.fork()
    if pid == 0:  # the worker: nothing of the fork server's own stays open in it
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            control.close()
            for fd in close_in_worker:  # the status pipes' ends, the wake-up pipe
                os.close(fd)
            for number, fd in streams.items():
                os.dup2(fd, number)
                os.close(fd)
            gc.enable()
            worker_process.main(worker_fd)  # never returns: the worker ends with os._exit
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            os._exit(code)
    for fd in (worker_fd, *streams.values()):
        os.close(fd)
    return pid


def _reap(children: dict[int, int]) -> None:
    """Writes each exited worker's status on its pipe and closes it."""
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        write_end = children.pop(pid, None)
        if write_end is not None:
            with contextlib.suppress(OSError):
                os.write(write_end, _STATUS.pack(os.waitstatus_to_exitcode(status)))
            os.close(write_end)


def serve(control: socket.socket) -> None:
    """Forks a worker per request until the front's end of `control` closes."""
    wakeup_read, wakeup_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wakeup_write)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # wakes the select below
    children: dict[int, int] = {}  # pid -> the write end of its status pipe
    while True:
        ready: list[int] = []
        with contextlib.suppress(InterruptedError):
            ready, _, _ = select.select([control.fileno(), wakeup_read], [], [])
        if wakeup_read in ready:
            with contextlib.suppress(BlockingIOError):
                os.read(wakeup_read, 512)
        _reap(children)
        if control.fileno() not in ready:
            continue
        message, fds, _, _ = socket.recv_fds(control, 8, 3)
        if not message or not fds:  # the front went away
            os._exit(0)
        streams = dict(zip(message[1:], fds[1:], strict=True))
        status_read, status_write = os.pipe2(os.O_CLOEXEC)
        owned = [wakeup_read, wakeup_write, status_read, status_write, *children.values()]
        pid = _fork_worker(control, fds[0], streams, owned)
        children[pid] = status_write
        socket.send_fds(control, [_PID.pack(pid)], [status_read])
        os.close(status_read)
        _reap(children)  # a worker that died at once


def main(fd: int) -> None:
    """The fork server's entry point (see the module doc)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    setproctitle.setproctitle("lmserve: worker fork server")
    # glibc's thresholds, as the front sets its own (`allocator`): every worker inherits them,
    # so a generation step's numpy temporaries are reused instead of mapped and faulted in
    # again each step (server CPU a token at 32 LSTM streams 0.80 -> 0.67 ms, bench/README).
    keep_freed_memory()
    # Copy-on-write pages stay shared only while nobody writes them: no collection here (it
    # would touch every object's header), and what is alive now is hidden from the workers'.
    gc.disable()
    gc.freeze()
    control = socket.socket(fileno=fd)
    control.setblocking(True)
    control.sendall(b"R")  # ready: the front's first fork request may come
    serve(control)


if __name__ == "__main__":
    main(int(sys.argv[1]))
