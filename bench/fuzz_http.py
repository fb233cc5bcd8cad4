"""Fuzzes every route of the HTTP front with generated requests (tests/http_fuzz.py) against a
real server on the integration tests' small n-gram models, and prints a JSON summary.

    .venv/bin/python bench/fuzz_http.py [--examples 10000] [--seed 0]

Any HTTP 500 or Connect `internal`/`unknown` is a bug, and so is an ERROR log line for a client's
request: the summary lists the first few, and the exit status is 1. The CI test
(tests/integration/test_fuzz_http.py) runs a few hundred of these.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from common import REPO_ROOT
from fuzz_rpcs import build_repository
from hypothesis import HealthCheck, given, seed, settings
from prometheus_client import CollectorRegistry

sys.path.insert(0, str(REPO_ROOT / "tests"))
from http_fuzz import (  # type: ignore[import-not-found]  # noqa: E402  (tests/, not typed here)
    HttpCall,
    documented,
    http_calls,
    send,
)

from lmserve.server.front.process.app import start_background_server  # noqa: E402
from lmserve.server.settings import load_settings  # noqa: E402


class _Errors(logging.Handler):
    """Counts ERROR records (a client's request must not write one)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage()[:200])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    answers: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    bugs: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        build_repository(Path(tmp))
        overrides = {
            "model_repository": Path(tmp),
            "host": "127.0.0.1",
            "port": 0,
            "http_port": 0,
            "metrics_enabled": False,
        }
        server = start_background_server(load_settings(overrides), registry=CollectorRegistry())
        errors = _Errors()  # after the start: a broken model's load error is no request's
        logging.getLogger().addHandler(errors)
        logging.getLogger().setLevel(logging.WARNING)
        port = server.http_port
        assert port
        started = time.perf_counter()
        try:

            @seed(args.seed)
            @settings(
                max_examples=args.examples,
                database=None,
                deadline=None,
                suppress_health_check=list(HealthCheck),
            )
            @given(call=http_calls())
            def fuzz(call: HttpCall) -> None:
                answer = send(port, call)
                route = call.path.rsplit("/", 1)[-1] or "/"
                answers[route][f"{answer[0]} {answer[1]}"] += 1
                if not documented(answer) and len(bugs) < 10:
                    bugs.append(f"{answer}: {call!r}")

            fuzz()
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as h:
                serving = h.status == 200
        finally:
            server.stop(grace=1.0)
    summary = {
        "name": "fuzz_http",
        "examples": sum(sum(c.values()) for c in answers.values()),
        "seconds": round(time.perf_counter() - started, 1),
        "by_route": {r: dict(c.most_common()) for r, c in sorted(answers.items())},
        "serving_after": serving,
        "error_log_lines": len(errors.messages),
        "first_error_lines": errors.messages[:5],
        "bugs": bugs,
    }
    print(json.dumps(summary, indent=1))
    return 0 if serving and not bugs and not errors.messages else 1


if __name__ == "__main__":
    sys.exit(main())
