"""The exceptions the client raises, one per gRPC status a caller may want to handle apart.

    LmServeClientError           (any failed call; `.code` and the server's `.message`)
    ├── ModelNotFoundError       <- NOT_FOUND
    ├── InvalidArgumentError     <- INVALID_ARGUMENT
    ├── UnavailableError         <- UNAVAILABLE (server unreachable, or the model failed to load)
    ├── ResourceExhaustedError   <- RESOURCE_EXHAUSTED (server overloaded; retry later)
    └── DeadlineExceededError    <- DEADLINE_EXCEEDED

Every other status (INTERNAL, UNIMPLEMENTED, CANCELLED...) raises the base class. `retry_after`
is the server's google.rpc.RetryInfo delay in seconds (an overloaded queue), None when the
server sent none (a request too large to ever fit, or any other error).

RetryInfo is read from the call's `grpc-status-details-bin` trailer with the protobuf runtime
alone (`_protowire` plus `google.protobuf`'s Any and Duration): grpcio-status and
googleapis-common-protos are not needed by the client, so it installs with grpcio and protobuf.
"""

from __future__ import annotations

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.protobuf.message import DecodeError

from lmserve.client._protowire import WireError, fields

STATUS_DETAILS_KEY = "grpc-status-details-bin"
RETRY_INFO_TYPE = "google.rpc.RetryInfo"


class LmServeClientError(Exception):
    """A call to the lmserve server failed. `code` is the gRPC status, `message` the server's,
    `retry_after` the seconds the server asked to wait before retrying (None: not told)."""

    def __init__(
        self, code: grpc.StatusCode | None, message: str, retry_after: float | None = None
    ) -> None:
        self.code = code
        self.message = message
        self.retry_after = retry_after
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


def error_for_status(
    code: grpc.StatusCode | None, message: str, retry_after: float | None = None
) -> LmServeClientError:
    """The exception for a status code and server message."""
    cls = _BY_CODE.get(code, LmServeClientError) if code is not None else LmServeClientError
    return cls(code, message, retry_after)


def retry_after_of(exc: grpc.RpcError) -> float | None:
    """The RetryInfo delay (seconds) in a failed call's `grpc-status-details-bin`, if any."""
    trailers_fn = getattr(exc, "trailing_metadata", None)
    trailers = trailers_fn() if callable(trailers_fn) else None
    for key, value in trailers or ():
        if key == STATUS_DETAILS_KEY and isinstance(value, bytes):
            return retry_delay(value)
    return None


def retry_delay(status: bytes) -> float | None:
    """The RetryInfo delay in a serialized google.rpc.Status (details are field 3, each an Any;
    RetryInfo's field 1 is a Duration). None when there is none or the bytes are malformed."""
    try:
        for number, detail in fields(status):
            if number != 3 or not isinstance(detail, bytes):
                continue
            packed = any_pb2.Any.FromString(detail)
            if packed.type_url.rsplit("/", 1)[-1] != RETRY_INFO_TYPE:
                continue
            for field, delay in fields(packed.value):
                if field == 1 and isinstance(delay, bytes):
                    return duration_pb2.Duration.FromString(delay).ToTimedelta().total_seconds()
            return 0.0
    except (WireError, DecodeError):
        return None
    return None


def from_rpc_error(exc: grpc.RpcError) -> LmServeClientError:
    """Converts a failed call (sync `grpc.RpcError` or `grpc.aio.AioRpcError`)."""
    code_fn = getattr(exc, "code", None)
    details_fn = getattr(exc, "details", None)
    code = code_fn() if callable(code_fn) else None
    details = details_fn() if callable(details_fn) else None
    return error_for_status(code, details or "", retry_after_of(exc))
