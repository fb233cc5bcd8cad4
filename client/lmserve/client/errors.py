"""The exceptions the client raises, one per gRPC status a caller may want to handle apart.

    LmServeClientError           (any failed call; `.code` and the server's `.message`)
    ├── ModelNotFoundError       <- NOT_FOUND
    ├── InvalidArgumentError     <- INVALID_ARGUMENT
    ├── UnavailableError         <- UNAVAILABLE (server unreachable, or the model failed to load)
    ├── ResourceExhaustedError   <- RESOURCE_EXHAUSTED (server overloaded; retry later)
    └── DeadlineExceededError    <- DEADLINE_EXCEEDED

Every other status (INTERNAL, UNIMPLEMENTED, CANCELLED...) raises the base class.
"""

from __future__ import annotations

import grpc


class LmServeClientError(Exception):
    """A call to the lmserve server failed. `code` is the gRPC status, `message` the server's."""

    def __init__(self, code: grpc.StatusCode | None, message: str) -> None:
        self.code = code
        self.message = message
        name = code.name if code is not None else "ERROR"
        super().__init__(f"{name}: {message}" if message else name)


class ModelNotFoundError(LmServeClientError):
    """The server has no model of the requested name."""


class InvalidArgumentError(LmServeClientError):
    """The server rejected a request field; the message names the field."""


class UnavailableError(LmServeClientError):
    """The server cannot be reached, or the model exists but is not serving."""


class ResourceExhaustedError(LmServeClientError):
    """The server is at capacity (or a message size limit was hit); the call may be retried."""


class DeadlineExceededError(LmServeClientError):
    """The call did not finish before its deadline."""


_BY_CODE: dict[grpc.StatusCode, type[LmServeClientError]] = {
    grpc.StatusCode.NOT_FOUND: ModelNotFoundError,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
}


def error_for_status(code: grpc.StatusCode | None, message: str) -> LmServeClientError:
    """The exception for a status code and server message."""
    cls = _BY_CODE.get(code, LmServeClientError) if code is not None else LmServeClientError
    return cls(code, message)


def from_rpc_error(exc: grpc.RpcError) -> LmServeClientError:
    """Converts a failed call (sync `grpc.RpcError` or `grpc.aio.AioRpcError`)."""
    code_fn = getattr(exc, "code", None)
    details_fn = getattr(exc, "details", None)
    code = code_fn() if callable(code_fn) else None
    details = details_fn() if callable(details_fn) else None
    return error_for_status(code, details or "")
