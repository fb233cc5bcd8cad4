"""What the current RPC is (request id, method, model), for logs and metrics.

    info = begin_call(request_id, "Score")   # the serving interceptor, once per RPC
    current_call()                           # anywhere below it: the logging filter, metrics

A leaf module so the logging setup (no gRPC) and the API layer share it. Each aio RPC runs in its
own task, so the context variable is the RPC's alone and needs no reset.
"""

from __future__ import annotations

import os
from contextvars import ContextVar
from dataclasses import dataclass

# A request id the caller sends is kept only if it is this short and printable ASCII: it is
# echoed in a header and written to every log line of the call.
MAX_REQUEST_ID = 128


@dataclass(slots=True)
class CallInfo:
    """The current RPC. `model` is set once the servicer knows the name is real."""

    request_id: str
    method: str
    model: str = ""


_current: ContextVar[CallInfo | None] = ContextVar("lmserve_call", default=None)


def begin_call(request_id: str, method: str) -> CallInfo:
    info = CallInfo(request_id, method)
    _current.set(info)
    return info


def current_call() -> CallInfo | None:
    return _current.get()


def valid_request_id(value: object) -> bool:
    """True for a caller's id worth keeping: 1..128 printable ASCII characters."""
    return (
        isinstance(value, str)
        and 0 < len(value) <= MAX_REQUEST_ID
        and value.isascii()
        and value.isprintable()
    )


def request_id_from(value: object) -> str:
    """The caller's id when valid, else a fresh one: 128 random bits as 32 hex digits (as a
    UUID4's hex, without building a UUID object on every call)."""
    return value if isinstance(value, str) and valid_request_id(value) else os.urandom(16).hex()
