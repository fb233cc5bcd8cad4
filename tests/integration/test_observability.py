"""Request ids, JSON logs, overload details and status metrics against a real server on loopback.

One server with a bigram model, bearer-token auth, JSON logs and no waiting room for Generate
(one active sequence, max_queued_requests=0): a long Generate holds the slot, so the next one is
refused at once, which is what the overload tests need.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.rpc import code_pb2, error_details_pb2
from grpc_status import rpc_status
from http_calls import post_json
from metrics_scrape import scrape
from serve_process import ServeProcess, wait_until
from served import ServerFactory

from lmserve.client import AsyncLmServeClient, LmServeClient, NBestHypothesis, NBestList
from lmserve.client._requests import generate_request
from lmserve.client.errors import ResourceExhaustedError
from lmserve.server.front.process.app import BackgroundServer
from lmserve.server.logging_setup import log_handler
from lmserve.server.manifest import ModelManifest, write_manifest
from lmserve.v1 import lm_service_pb2 as pb
from lmserve.v1 import lm_service_pb2_grpc

TOKEN = "observe-token-1f2e"
AUTH = ("authorization", f"Bearer {TOKEN}")
BIGRAM_ARPA = """\\data\\
ngram 1=5
ngram 2=5

\\1-grams:
-1.0\t<unk>\t0
-99\t<s>\t-0.3
-0.9\t</s>\t0
-0.5\tthe\t-0.2
-1.1\tcat\t-0.2

\\2-grams:
-0.2\t<s> the
-0.3\tthe cat
-0.4\tcat the
-1.0\tthe </s>
-1.5\tcat </s>

\\end\\
"""


def write_bigram(root: Path) -> None:
    (root / "bigram").mkdir(parents=True)
    (root / "bigram" / "model.arpa").write_text(BIGRAM_ARPA)
    manifest = {
        "name": "bigram",
        "kind": "ngram",
        "format": "arpa",
        "files": {"arpa": {"path": "model.arpa"}},
    }
    write_manifest(root / "bigram", ModelManifest.model_validate(manifest))


@pytest.fixture(scope="module")
def server(
    serve: ServerFactory, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BackgroundServer]:
    root = tmp_path_factory.mktemp("observe-models")
    write_bigram(root)
    # Its own (no other module serves this repository), stopped when the module ends.
    with serve.private(
        root,
        metrics_enabled=True,
        metrics_host="127.0.0.1",
        metrics_port=0,
        auth_token=TOKEN,
        log_format="json",
        max_active_sequences=1,
        max_queued_requests=0,
        max_rerank_lists=2,
        max_new_tokens=1_000_000,
    ) as running:
        yield running


@pytest.fixture(scope="module")
def stub(server: BackgroundServer) -> Iterator[lm_service_pb2_grpc.LanguageModelServiceStub]:
    with grpc.insecure_channel(server.address) as channel:
        yield lm_service_pb2_grpc.LanguageModelServiceStub(channel)


@pytest.fixture
def json_log() -> Iterator[io.StringIO]:
    """What the server logs in this test, as the `json` log format writes it."""
    buffer = io.StringIO()
    handler = log_handler("json")
    handler.setStream(buffer)
    root = logging.getLogger()
    access = logging.getLogger("lmserve.access")
    old_level = access.level
    access.setLevel(logging.INFO)
    root.addHandler(handler)
    try:
        yield buffer
    finally:
        root.removeHandler(handler)
        access.setLevel(old_level)


def _access_lines(buffer: io.StringIO, request_id: str) -> list[dict[str, object]]:
    """The parsed access-log lines of one request id (waits briefly: logged on the server's
    thread). Every line of the buffer must be one JSON object."""
    deadline = time.monotonic() + 2
    while True:
        lines = [json.loads(line) for line in buffer.getvalue().splitlines()]
        found = [
            d
            for d in lines
            if d["logger"] == "lmserve.access" and d.get("request_id") == request_id
        ]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.01)


def test_json_access_line_carries_the_callers_request_id_and_it_is_echoed(
    stub: lm_service_pb2_grpc.LanguageModelServiceStub, json_log: io.StringIO
) -> None:
    request = pb.ScoreRequest(model="bigram", texts=["the cat"])
    _, call = stub.Score.with_call(request, metadata=(AUTH, ("x-request-id", "req-42/abc")))
    assert ("x-request-id", "req-42/abc") in tuple(call.trailing_metadata())
    [line] = _access_lines(json_log, "req-42/abc")
    assert line["level"] == "INFO"
    assert line["method"] == "Score"
    assert line["model"] == "bigram"
    assert line["code"] == "OK"
    assert isinstance(line["duration_ms"], float) and line["duration_ms"] >= 0
    assert str(line["time"]).endswith("Z")


def test_http_calls_have_the_same_access_line_marked_http(
    server: BackgroundServer, json_log: io.StringIO
) -> None:
    status, headers, _ = post_json(
        server.http_port or 0,
        "/lmserve.v1.LanguageModelService/Score",
        {"model": "bigram", "texts": ["the cat"]},
        {"authorization": f"Bearer {TOKEN}", "x-request-id": "http-req-7"},
    )
    assert status == 200 and headers["x-request-id"] == "http-req-7"
    [line] = _access_lines(json_log, "http-req-7")
    assert (line["method"], line["model"], line["code"], line["front"]) == (
        "Score",
        "bigram",
        "OK",
        "http",
    )


@pytest.mark.parametrize("sent", ["x" * 129, "", None])
def test_a_bad_or_missing_request_id_is_replaced_by_a_generated_one(
    stub: lm_service_pb2_grpc.LanguageModelServiceStub, json_log: io.StringIO, sent: str | None
) -> None:
    metadata = [AUTH] if sent is None else [AUTH, ("x-request-id", sent)]
    _, call = stub.Score.with_call(
        pb.ScoreRequest(model="bigram", texts=["the"]), metadata=metadata
    )
    [echoed] = [v for k, v in call.trailing_metadata() if k == "x-request-id"]
    assert echoed != sent and len(echoed) == 32 and int(echoed, 16) >= 0
    assert _access_lines(json_log, echoed)


def _hold_the_only_slot(client: LmServeClient) -> Iterator[object]:
    """A Generate holding the model's one slot; waits (5 s at most) while a stream cancelled by
    an earlier test still holds it (the scheduler frees a cancelled stream's slot at its next
    step, which can be late on a loaded machine)."""
    deadline = time.monotonic() + 5
    while True:
        holder = client.generate("bigram", max_new_tokens=1_000_000, ignore_eos=True)
        try:
            next(holder)
            return holder
        except ResourceExhaustedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_a_full_generate_queue_answers_fast_with_retry_info(
    server: BackgroundServer, stub: lm_service_pb2_grpc.LanguageModelServiceStub
) -> None:
    with LmServeClient(server.address, token=TOKEN, timeout=20) as client:
        holder = _hold_the_only_slot(client)
        try:
            request = generate_request("bigram", "the", max_new_tokens=5)
            started = time.monotonic()
            with pytest.raises(grpc.RpcError) as info:
                list(stub.Generate(request, metadata=(AUTH,), timeout=10))
            elapsed = time.monotonic() - started
            error = info.value
            assert error.code() is grpc.StatusCode.RESOURCE_EXHAUSTED  # type: ignore[attr-defined]
            assert elapsed < 1.0
            status = rpc_status.from_call(error)  # type: ignore[arg-type]
            assert status is not None and status.code == code_pb2.RESOURCE_EXHAUSTED
            found = {}
            for detail in status.details:
                for kind in (
                    error_details_pb2.RetryInfo,
                    error_details_pb2.ErrorInfo,
                    error_details_pb2.QuotaFailure,
                ):
                    if detail.Is(kind.DESCRIPTOR):
                        found[kind.__name__] = kind()
                        detail.Unpack(found[kind.__name__])
            # Estimated from the queue: the slot holder has about 10^6 tokens left, far more
            # than the 1 s an unmeasured queue would say (and clipped to 30 s).
            delay = found["RetryInfo"].retry_delay.ToTimedelta().total_seconds()
            assert 1.0 < delay <= 30.0
            assert found["ErrorInfo"].reason == "QUEUE_FULL"
            assert found["ErrorInfo"].metadata["limit"] == "max_queued_requests"
            assert found["ErrorInfo"].metadata["model"] == "bigram"
            [violation] = found["QuotaFailure"].violations
            assert violation.description == "max_queued_requests"

            with pytest.raises(ResourceExhaustedError) as refused:
                list(client.generate("bigram", max_new_tokens=5))
            assert refused.value.retry_after is not None
            assert 1.0 < refused.value.retry_after <= 30.0

            async def refused_async() -> ResourceExhaustedError:
                async with AsyncLmServeClient(server.address, token=TOKEN, timeout=10) as aclient:
                    try:
                        async for _ in aclient.generate("bigram", max_new_tokens=5):
                            pass
                    except ResourceExhaustedError as exc:
                        return exc
                raise AssertionError("the async Generate was not refused")

            retry_async = asyncio.run(refused_async()).retry_after
            assert retry_async is not None and 1.0 < retry_async <= 30.0
        finally:
            holder.close()  # type: ignore[attr-defined]


def test_a_request_too_large_has_error_info_but_no_retry_info(server: BackgroundServer) -> None:
    lists = [NBestList(f"u{i}", [NBestHypothesis("the cat")]) for i in range(3)]
    with LmServeClient(server.address, token=TOKEN, timeout=10) as client:
        with pytest.raises(ResourceExhaustedError) as refused:
            client.rerank("bigram", lists)
    assert refused.value.retry_after is None
    assert "more than the limit of 2" in refused.value.message


def test_unauthenticated_and_cancelled_calls_are_counted_by_their_code(
    server: BackgroundServer, stub: lm_service_pb2_grpc.LanguageModelServiceStub
) -> None:
    def count(method: str, code: str, model: str = "") -> float:
        labels = frozenset(
            {"method": method, "model": model, "code": code, "front": "grpc"}.items()
        )
        return scrape(server).get(("lmserve_requests_total", labels), 0.0)

    refused_before = count("Score", "UNAUTHENTICATED")
    with pytest.raises(grpc.RpcError) as info:
        stub.Score(pb.ScoreRequest(model="bigram", texts=["the"]))
    assert info.value.code() is grpc.StatusCode.UNAUTHENTICATED  # type: ignore[attr-defined]
    assert count("Score", "UNAUTHENTICATED") == refused_before + 1

    cancelled_before = count("Generate", "CANCELLED", "bigram")
    with LmServeClient(server.address, token=TOKEN, timeout=20) as client:
        holder = _hold_the_only_slot(client)
        holder.close()  # type: ignore[attr-defined]  # cancels the call
    deadline = time.monotonic() + 5
    while count("Generate", "CANCELLED", "bigram") == cancelled_before:
        assert time.monotonic() < deadline, "the cancelled Generate was never counted"
        time.sleep(0.01)
    assert count("Generate", "CANCELLED", "bigram") == cancelled_before + 1
    assert count("Generate", "UNKNOWN", "bigram") == 0


def test_lmserve_serve_with_log_format_json_writes_only_json_lines(tmp_path: Path) -> None:
    write_bigram(tmp_path)
    with ServeProcess(tmp_path, "--log-format", "json") as process:
        with grpc.insecure_channel(process.address) as channel:
            stub = lm_service_pb2_grpc.LanguageModelServiceStub(channel)
            request = pb.ScoreRequest(model="bigram", texts=["the cat"])
            stub.Score(request, metadata=(("x-request-id", "from-the-cli-test"),))
        assert wait_until(lambda: "from-the-cli-test" in process.stderr(), 5)
        lines = [json.loads(line) for line in process.stderr().splitlines()]
    assert any("serving" in str(d["message"]) for d in lines)
    [access] = [d for d in lines if d.get("request_id") == "from-the-cli-test"]
    assert (access["logger"], access["method"], access["code"]) == ("lmserve.access", "Score", "OK")
