"""Configures the server's log output once, at start-up: plain lines or JSON lines on stderr.

    setup_logging("INFO", "json")

Every record gets `request_id`, `method` and `model` from the current RPC (`call_context`) by a
filter on the handler, so any module's log line inside an RPC can be joined with its access-log
line and the caller's own logs (which sent the `x-request-id`).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from lmserve.server.call_context import current_call
from lmserve.server.errors import is_client_error

# LogRecord attributes that are not `extra=` fields (what JSON lines leave out).
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "request_id",
    "method",
    "model",
}


class CallContextFilter(logging.Filter):
    """Adds the current RPC's request id, method and model to each record (empty outside)."""

    def filter(self, record: logging.LogRecord) -> bool:
        info = current_call()
        if not hasattr(record, "request_id"):
            record.request_id = info.request_id if info else ""
        if not hasattr(record, "method"):
            record.method = info.method if info else ""
        if not hasattr(record, "model"):
            record.model = info.model if info else ""
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ISO 8601), level, logger, message, the RPC's ids
    when inside one, `extra=` fields, and the traceback as `exc_info`."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        line: dict[str, Any] = {
            "time": f"{stamp}.{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in ("request_id", "method", "model"):
            value = getattr(record, key, "")
            if value:
                line[key] = value
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                line[key] = value
        if record.exc_info:
            line["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str, ensure_ascii=False)


def log_handler(fmt: str = "text") -> logging.Handler:
    """A stderr handler with the call-context filter and the format's formatter."""
    handler = logging.StreamHandler()
    handler.addFilter(CallContextFilter())
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    return handler


def setup_logging(level: str, fmt: str = "text") -> None:
    logging.basicConfig(level=level, handlers=[log_handler(fmt)], force=True)


def log_failure(logger: logging.Logger, what: str, exc: BaseException) -> None:
    """A failed unit of work: a caller's mistake (`errors.is_client_error`) at INFO in one line,
    so alerts on ERROR lines fire on server faults only; anything else at ERROR with its
    traceback."""
    if is_client_error(exc):
        logger.info("%s refused: %s: %s", what, type(exc).__name__, exc)
    else:
        logger.error("%s failed", what, exc_info=exc)
