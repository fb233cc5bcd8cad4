"""The frames between the front and an engine worker: one pickled message per frame.

    sock.sendall(frame((Kind.CALL, rid, "score", (prepared, deadline))))
    reader = FrameReader(); for message in reader.feed(data): ...      # asyncio side
    message = recv_frame(sock)                                          # blocking side

A frame is a 4-byte little-endian length and a pickle (protocol 5). Both ends are this
package's own processes on a private socketpair, so pickle carries the engine's own types
(numpy arrays, dataclasses, `errors` exceptions) with no schema to keep in step; the
comparison with msgspec and with other transports is in `bench/bench_ipc.py`'s docstring and
bench/README.md. A generation step's events for every stream travel as ONE frame
(`Kind.EVENTS`), token events as plain tuples (`pack_events`): a few microseconds per step.
"""

from __future__ import annotations

import pickle
import socket
import struct
from enum import IntEnum
from typing import Any

from lmserve.server.engine.generation.sequence import Event, TokenEvent

_HEADER = struct.Struct("<I")


class Kind(IntEnum):
    """The first item of every message; what follows it is in the comment."""

    READY = 1  # worker -> front, first: (pid,)
    FAILED = 2  # worker -> front, first: (reason,) the model did not load
    CALL = 3  # front -> worker: (rid, method, args)
    REPLY = 4  # worker -> front: (rid, result)
    ERROR = 5  # worker -> front: (rid, exception)
    CANCEL = 6  # front -> worker: (rid,) the caller left
    GENERATE = 7  # front -> worker: (sid, GenerationRequest)
    EVENTS = 8  # worker -> front: ([(sid, packed events | exception, last?), ...],) a step's
    STREAM_CANCEL = 9  # front -> worker: (sid,)
    TAKEN = 10  # front -> worker: (sid, events taken so far) backpressure
    PARKED = 11  # worker -> front: (sid, parked?) report every take while parked
    STOP = 12  # front -> worker: () close the engine and exit


def frame(message: tuple[Any, ...]) -> bytes:
    payload = pickle.dumps(message, protocol=5)
    return _HEADER.pack(len(payload)) + payload


class FrameReader:
    """Cuts a byte stream into messages (the asyncio side: bytes arrive in any pieces)."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[tuple[Any, ...]]:
        buffer = self._buffer
        buffer += data
        out = []
        start = 0
        end = len(buffer)
        while end - start >= 4:
            (size,) = _HEADER.unpack_from(buffer, start)
            if end - start - 4 < size:
                break
            out.append(pickle.loads(memoryview(buffer)[start + 4 : start + 4 + size]))
            start += 4 + size
        if start:
            del buffer[:start]
        return out


def recv_frame(sock: socket.socket) -> tuple[Any, ...] | None:
    """One message from a blocking socket; None when the other end closed."""
    header = _recv_exactly(sock, 4)
    if header is None:
        return None
    (size,) = _HEADER.unpack(header)
    payload = _recv_exactly(sock, size)
    if payload is None:
        return None
    message: tuple[Any, ...] = pickle.loads(payload)
    return message


def _recv_exactly(sock: socket.socket, size: int) -> bytearray | None:
    data = bytearray(size)
    view = memoryview(data)
    got = 0
    while got < size:
        n = sock.recv_into(view[got:])
        if n == 0:
            return None
        got += n
    return data


def pack_events(events: list[Event]) -> list[Any]:
    """Token events as tuples (pickled several times faster than slotted dataclasses)."""
    return [
        (e.sample_index, e.index, e.token_id, e.text, e.log_prob, e.top)
        if type(e) is TokenEvent
        else e
        for e in events
    ]


def unpack_events(packed: list[Any]) -> list[Event]:
    return [TokenEvent(*e) if type(e) is tuple else e for e in packed]


def picklable_error(exc: BaseException) -> BaseException:
    """`exc` when it crosses the boundary intact, else a RuntimeError with its text (a bug
    in model code: the front answers INTERNAL)."""
    try:
        pickle.dumps(exc, protocol=5)
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")
    return exc


__all__ = [
    "FrameReader",
    "Kind",
    "frame",
    "pack_events",
    "picklable_error",
    "recv_frame",
    "unpack_events",
]
