"""A schema-driven fuzzer (Schemathesis) over the HTTP front's OpenAPI document, served at
`/openapi.json`: every operation, generated valid and invalid requests (a bounded number of
examples, derandomized), and no answer is a server error (5xx). The document itself is what
the server serves, generated from the schema it validates requests with."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from served import ServerFactory

from lmserve.server.front.process.app import BackgroundServer


@pytest.fixture(scope="module")
def solo_server(serve: ServerFactory, model_repository: Path) -> Iterator[BackgroundServer]:
    solo = model_repository.parent / "openapi-solo"
    if not solo.exists():
        solo.mkdir()
        (solo / "test").symlink_to(model_repository / "test", target_is_directory=True)
    with serve.private(solo) as server:  # its own, stopped when the module ends
        yield server


def test_the_served_openapi_document_is_the_generated_one(solo_server: BackgroundServer) -> None:
    from lmserve.server.front.api.http.openapi import openapi_document

    url = f"http://127.0.0.1:{solo_server.http_port}/openapi.json"
    with urllib.request.urlopen(url, timeout=10) as answer:
        served = json.load(answer)
    assert served == json.loads(json.dumps(openapi_document()))
    assert {"/v1/completions", "/tokenize", "/detokenize", "/tokenizer_info"} <= set(
        served["paths"]
    )


def test_schemathesis_finds_no_server_error(solo_server: BackgroundServer) -> None:
    base = f"http://127.0.0.1:{solo_server.http_port}"
    schema = schemathesis.openapi.from_url(f"{base}/openapi.json")
    failures: list[str] = []
    cases = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        strategy = operation.as_strategy()

        @settings(
            max_examples=40,
            derandomize=True,
            database=None,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=strategy)
        def check(case: schemathesis.Case) -> None:
            nonlocal cases
            cases += 1
            response = case.call(base_url=base, timeout=30)
            if response.status_code >= 500:
                status, text = response.status_code, response.text[:200]
                failures.append(f"{case.method} {case.path} -> {status}: {text}")

        check()
    assert cases >= 100
    assert not failures, failures[:5]
