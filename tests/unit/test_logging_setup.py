"""The JSON log format and request-id validation, on real loggers (no server)."""

from __future__ import annotations

import io
import json
import logging

import pytest

from lmserve.server.call_context import begin_call, request_id_from, valid_request_id
from lmserve.server.logging_setup import log_handler


def _logged(fmt: str, emit: object) -> list[str]:
    buffer = io.StringIO()
    handler = log_handler(fmt)
    handler.setStream(buffer)
    logger = logging.getLogger("lmserve.test.logging")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        emit(logger)  # type: ignore[operator]
    finally:
        logger.removeHandler(handler)
    return buffer.getvalue().splitlines()


def test_json_lines_parse_and_carry_extras_and_tracebacks() -> None:
    def emit(logger: logging.Logger) -> None:
        logger.info("hello %s", "world", extra={"code": "OK", "duration_ms": 1.5})
        try:
            raise ValueError("boom\nsecond line")
        except ValueError:
            logger.exception("failed")

    first, second = (json.loads(line) for line in _logged("json", emit))
    assert first["message"] == "hello world"
    assert first["level"] == "INFO" and first["logger"] == "lmserve.test.logging"
    assert first["code"] == "OK" and first["duration_ms"] == 1.5
    assert "request_id" not in first  # outside an RPC
    assert second["level"] == "ERROR" and "ValueError: boom" in second["exc_info"]


def test_lines_inside_a_call_carry_its_request_id_method_and_model() -> None:
    import contextvars

    def inside() -> list[str]:
        info = begin_call("rid-1", "Score")
        info.model = "kjv"
        return _logged("json", lambda logger: logger.warning("inside"))

    [line] = contextvars.copy_context().run(inside)
    parsed = json.loads(line)
    assert (parsed["request_id"], parsed["method"], parsed["model"]) == ("rid-1", "Score", "kjv")


@pytest.mark.parametrize(
    ("value", "valid"),
    [("abc-123", True), ("x" * 128, True), ("x" * 129, False), ("", False), ("é", False),
     ("a\nb", False), (None, False), (b"bytes", False)],
)  # fmt: skip
def test_request_id_validation(value: object, valid: bool) -> None:
    assert valid_request_id(value) is valid
    generated = request_id_from(value)
    assert generated == value if valid else len(generated) == 32
