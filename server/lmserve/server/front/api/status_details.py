"""Rich error details (google.rpc.Status) for RESOURCE_EXHAUSTED, so clients can tell "wait and
retry" from "this request will never fit" without parsing the message.

    await context.abort_with_status(overload_status(exc))

Overloaded (a queue is full) carries RetryInfo (how long to wait: the estimate the refusing
queue made, `worker.retry_estimate`), QuotaFailure (which limit)
and ErrorInfo (reason QUEUE_FULL, the limit and model); RequestTooLarge carries ErrorInfo
(reason REQUEST_TOO_LARGE) and QuotaFailure but no RetryInfo. Built from the exception alone:
nothing runs before the answer goes out.
"""

from __future__ import annotations

import datetime

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from lmserve.server import errors

DOMAIN = "lmserve"


def _packed(message: object) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)  # type: ignore[arg-type]
    return packed


def overload_status(exc: errors.Overloaded) -> grpc.Status:
    """The RESOURCE_EXHAUSTED status for `exc`, details in `grpc-status-details-bin`."""
    message = errors.clip(exc, 2 * errors.MESSAGE_LIMIT)
    too_large = isinstance(exc, errors.RequestTooLarge)
    reason = "REQUEST_TOO_LARGE" if too_large else "QUEUE_FULL"
    metadata = {"limit": exc.limit} if exc.limit else {}
    if exc.model:
        metadata["model"] = errors.clip(exc.model)
    details = [
        _packed(error_details_pb2.ErrorInfo(reason=reason, domain=DOMAIN, metadata=metadata))
    ]
    subject = f"model:{errors.clip(exc.model)}" if exc.model else "request"
    violation = error_details_pb2.QuotaFailure.Violation(
        subject=subject, description=exc.limit or reason.lower()
    )
    details.append(_packed(error_details_pb2.QuotaFailure(violations=[violation])))
    if exc.retry_after is not None and not too_large:
        delay = duration_pb2.Duration()
        delay.FromTimedelta(datetime.timedelta(seconds=max(0.0, exc.retry_after)))
        details.insert(0, _packed(error_details_pb2.RetryInfo(retry_delay=delay)))
    status = status_pb2.Status(code=code_pb2.RESOURCE_EXHAUSTED, message=message, details=details)
    return rpc_status.to_status(status)
