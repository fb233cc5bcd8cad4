"""One answered call, counted and logged the same way whichever front carried it (gRPC or HTTP).

    call = observer.start("Score", request_id)   # in the call's own task
    ...
    call.finish("INVALID_ARGUMENT")                # once: metrics, in-flight gauge, access log

Codes are gRPC status names on both fronts, so `lmserve_requests_total{code=...}` means the same
thing for an HTTP caller as for a gRPC one.
"""

from __future__ import annotations

import logging
import time

from lmserve.server.call_context import CallInfo, begin_call, request_id_from
from lmserve.server.metrics import Metrics

access_log = logging.getLogger("lmserve.access")


class ObservedCall:
    """A started call: its `info` (request id, method, model) and one `finish`."""

    __slots__ = ("_finished", "_observer", "_started", "info")

    def __init__(self, observer: CallObserver, info: CallInfo) -> None:
        self._observer = observer
        self.info = info
        self._started = time.perf_counter()
        self._finished = False

    @property
    def finished(self) -> bool:
        return self._finished

    def finish(self, code: str) -> None:
        """Counts the call with its status code (the first call only)."""
        if self._finished:
            return
        self._finished = True
        self._observer._finished(self, code, time.perf_counter() - self._started)


class CallObserver:
    """Starts and finishes observed calls: request ids, in-flight gauges, request metrics and
    (with `access_log`) one INFO line per call on the `lmserve.access` logger."""

    def __init__(self, metrics: Metrics, *, access_log: bool = False, front: str = "grpc") -> None:
        self._metrics = metrics
        self._access_log = access_log
        self._front = front

    def start(self, method: str, request_id: object = None) -> ObservedCall:
        """Begins a call in the current task (`call_context`); a caller's valid id is kept."""
        info = begin_call(request_id_from(request_id), method)
        self._metrics.inflight_of(method).inc()
        return ObservedCall(self, info)

    def _finished(self, call: ObservedCall, code: str, seconds: float) -> None:
        info = call.info
        self._metrics.inflight_of(info.method).dec()
        self._metrics.record_request(info.method, info.model, code, seconds, self._front)
        if self._access_log:
            duration_ms = round(seconds * 1000, 3)
            access_log.info(
                "%s %s %s %.1f ms",
                info.method,
                info.model or "-",
                code,
                duration_ms,
                extra={"code": code, "duration_ms": duration_ms, "front": self._front},
            )
