"""How the HTTP front answers each failure: the gRPC front's code, its HTTP status, the message,
and Retry-After only where waiting helps."""

from __future__ import annotations

import logging

import grpc
import pytest

from lmserve.server import errors
from lmserve.server.front.api.http.failures import HTTP_STATUS, failure_of


@pytest.mark.parametrize(
    ("exc", "code", "status"),
    [
        (errors.InvalidArgument("texts", "is empty"), grpc.StatusCode.INVALID_ARGUMENT, 400),
        (errors.ModelNotFound("x", ["a"]), grpc.StatusCode.NOT_FOUND, 404),
        (errors.ModelUnavailable("x failed"), grpc.StatusCode.UNAVAILABLE, 503),
        (errors.Overloaded("queue full"), grpc.StatusCode.RESOURCE_EXHAUSTED, 429),
        (errors.DeadlineExceeded("late"), grpc.StatusCode.DEADLINE_EXCEEDED, 504),
        (errors.Unauthenticated("no token"), grpc.StatusCode.UNAUTHENTICATED, 401),
        (errors.Unimplemented("no"), grpc.StatusCode.UNIMPLEMENTED, 501),
    ],
)
def test_lmserve_errors_map_as_on_the_grpc_front(
    exc: errors.LmServeError, code: grpc.StatusCode, status: int
) -> None:
    failure = failure_of(exc, "Score")
    assert (failure.code, failure.http_status) == (code, status)
    assert failure.message == str(exc)


def test_retry_after_is_whole_seconds_and_only_for_a_full_queue() -> None:
    assert failure_of(errors.Overloaded("full", retry_after=0.2), "Score").retry_after_header() == (
        "1"
    )
    assert failure_of(errors.Overloaded("full", retry_after=2.5), "Score").retry_after_header() == (
        "3"
    )
    too_large = errors.RequestTooLarge("texts", 10, 5, "texts")
    assert failure_of(too_large, "Score").retry_after_header() is None


def test_unexpected_errors_are_internal_and_say_nothing(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR):
        failure = failure_of(RuntimeError("secret path /etc/x"), "Score")
    assert failure.code is grpc.StatusCode.INTERNAL and failure.http_status == 500
    assert "secret" not in failure.message and "server log" in failure.message
    assert "secret path" in caplog.text  # the traceback is in the log


def test_every_grpc_code_has_an_http_status() -> None:
    assert set(HTTP_STATUS) == set(grpc.StatusCode)
