"""How a failed HTTP call is answered: the gRPC status the gRPC front would send, its HTTP
status, and the message, from the one mapping both fronts use (`interceptors.status_code`).

    failure = failure_of(exc)        # any exception a call raised
    failure.http_status, failure.code.name, failure.message, failure.retry_after
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import grpc

from lmserve.server import errors
from lmserve.server.front.api.interceptors import status_code

log = logging.getLogger(__name__)

# gRPC codes as HTTP statuses: the table the Connect protocol and grpc-gateway share.
HTTP_STATUS: dict[grpc.StatusCode, int] = {
    grpc.StatusCode.OK: 200,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNKNOWN: 500,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DATA_LOSS: 500,
    grpc.StatusCode.UNAUTHENTICATED: 401,
}


@dataclass(frozen=True, slots=True)
class Failure:
    """One failed call as the caller is told it."""

    code: grpc.StatusCode
    message: str
    # Seconds to wait before retrying (an overloaded queue's estimate), else None.
    retry_after: float | None = None

    @property
    def http_status(self) -> int:
        return HTTP_STATUS.get(self.code, 500)

    def retry_after_header(self) -> str | None:
        """`Retry-After` in whole seconds (HTTP has no finer unit), or None."""
        if self.retry_after is None:
            return None
        return str(max(1, math.ceil(self.retry_after)))


def failure_of(exc: BaseException, method: str) -> Failure:
    """The answer for `exc`, raised by `method`: lmserve's own errors as the gRPC front maps
    them; anything unexpected is INTERNAL, its traceback logged and never sent."""
    if isinstance(exc, errors.LmServeError):
        retry = exc.retry_after if isinstance(exc, errors.Overloaded) else None
        return Failure(status_code(exc), errors.clip(exc, 2 * errors.MESSAGE_LIMIT), retry)
    if isinstance(exc, Exception):
        log.error("%s failed unexpectedly", method, exc_info=exc)
        return Failure(grpc.StatusCode.INTERNAL, f"internal error in {method}; see the server log")
    return Failure(grpc.StatusCode.CANCELLED, "the call was cancelled")
