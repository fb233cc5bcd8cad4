"""Every RPC over the HTTP front in the Connect protocol, against the same server's gRPC answers
(the HTTP front calls the gRPC servicer's own methods; these tests hold it to that), with its
errors, request ids, metrics, auth and TLS."""

from __future__ import annotations

import json
import ssl
import struct
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.json_format import MessageToDict
from http_calls import SERVICE_PATH, call, post, post_json, stream_call
from integration_data import AUTH_TOKEN
from metrics_scrape import scrape
from pki_files import make_pki
from prometheus_client import CollectorRegistry

from lmserve.server.front.process.app import BackgroundServer, start_background_server
from lmserve.server.settings import load_settings
from lmserve.v1 import lm_service_pb2 as pb
from lmserve.v1 import lm_service_pb2_grpc

Stub = lm_service_pb2_grpc.LanguageModelServiceStub
TEXTS = ["in the beginning god created the heaven", "and the earth was without form"]
# Timings differ between two calls; everything else must not.
TIMINGS = {"timeToFirstTokenSeconds", "totalSeconds", "loadSeconds"}


def _without_timings(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_timings(v) for k, v in value.items() if k not in TIMINGS}
    if isinstance(value, list):
        return [_without_timings(v) for v in value]
    return value


def _as_json(message: Any) -> Any:
    return _without_timings(MessageToDict(message))


def _flattened(messages: list[Any]) -> tuple[list[Any], list[Any]]:
    tokens = [t for m in messages for t in m.get("tokens", [])]
    finished = [_without_timings(m["finished"]) for m in messages if "finished" in m]
    return sorted(tokens, key=lambda t: (t.get("sampleIndex", 0), t.get("index", 0))), sorted(
        finished, key=lambda f: f.get("sampleIndex", 0)
    )


@pytest.fixture(scope="module")
def port(server: BackgroundServer) -> int:
    assert server.http_port
    return server.http_port


@pytest.mark.parametrize(
    ("method", "request_message"),
    [
        ("ListModels", pb.ListModelsRequest()),
        ("GetModel", pb.GetModelRequest(model="kjv3")),
        ("Score", pb.ScoreRequest(model="kjv3", texts=TEXTS, return_tokens=True)),
        ("Score", pb.ScoreRequest(model="test", texts=["looking on a little"])),
        ("Perplexity", pb.PerplexityRequest(model="kjv3", texts=TEXTS)),
        (
            "BeamSearch",
            pb.BeamSearchRequest(
                model="kjv3", prompt="and god", beam_width=4, num_return=3, max_length=8
            ),
        ),
        (
            "Rerank",
            pb.RerankRequest(
                model="kjv3",
                lists=[
                    pb.NBestList(
                        id="utt1",
                        hypotheses=[
                            pb.Hypothesis(text="and god said", scores={"am": -3.0}),
                            pb.Hypothesis(text="and god sad", scores={"am": -2.5}),
                        ],
                    )
                ],
                score_weights={"am": 1.0},
                bias=pb.BiasList(phrases=[pb.BiasPhrase(phrase="God said", boost=2.0)]),
            ),
        ),
        (
            "Score",
            pb.ScoreRequest(
                model="kjv3",
                texts=TEXTS,
                bias=pb.BiasList(phrases=[pb.BiasPhrase(phrase="the")], boost=0.5),
            ),
        ),
    ],
)
def test_unary_rpcs_answer_what_grpc_answers(
    port: int, stub: Stub, method: str, request_message: Any
) -> None:
    expected = _as_json(getattr(stub, method)(request_message, timeout=30))
    assert expected  # something to compare
    got = call(port, method, MessageToDict(request_message))
    assert _without_timings(got) == expected


def test_generate_streams_what_grpc_streams(port: int, stub: Stub) -> None:
    request = pb.GenerateRequest(
        model="kjv3",
        prompt="and god said",
        n=2,
        logprobs=True,
        top_logprobs=2,
        sampling=pb.SamplingParams(temperature=0.9, top_k=20, seed=7),
        stopping=pb.StoppingCriteria(max_new_tokens=12),
    )
    expected = [_as_json(m) for m in stub.Generate(request, timeout=30)]
    status, messages, end = stream_call(port, "Generate", [MessageToDict(request)])
    assert status == 200
    assert "error" not in end
    # How tokens group into messages depends on timing; the tokens and endings must not.
    assert _flattened(messages) == _flattened(expected)
    finished = [m["finished"] for m in messages if "finished" in m]
    assert sorted(f.get("sampleIndex", 0) for f in finished) == [0, 1]


def test_client_and_bidi_streams(port: int, stub: Stub) -> None:
    corpus = [pb.CorpusPerplexityRequest(model="kjv3", texts=[t]) for t in TEXTS]
    expected = _as_json(stub.CorpusPerplexity(iter(corpus), timeout=30))
    status, messages, end = stream_call(
        port, "CorpusPerplexity", [MessageToDict(m) for m in corpus]
    )
    assert (status, end.get("error")) == (200, None)
    assert messages == [expected]

    requests = [pb.ScoreRequest(model="kjv3", texts=[t]) for t in TEXTS]
    expected_scores = [_as_json(m) for m in stub.ScoreStream(iter(requests), timeout=30)]
    status, messages, end = stream_call(port, "ScoreStream", [MessageToDict(m) for m in requests])
    assert (status, end.get("error")) == (200, None)
    assert messages == expected_scores


def test_errors_carry_the_grpc_code_and_message(port: int, stub: Stub) -> None:
    with pytest.raises(grpc.RpcError) as grpc_error:
        stub.Score(pb.ScoreRequest(model="nope", texts=["x"]), timeout=10)
    status, _, body = post_json(port, f"{SERVICE_PATH}/Score", {"model": "nope", "texts": ["x"]})
    assert (status, body["code"]) == (404, "not_found")
    assert body["message"] == grpc_error.value.details()
    assert "kjv3" in body["message"]  # names what is available

    status, _, body = post_json(port, f"{SERVICE_PATH}/Score", {"model": "kjv3"})
    assert (status, body["code"]) == (400, "invalid_argument")
    assert "texts" in body["message"]

    status, _, body = post_json(port, f"{SERVICE_PATH}/Score", {"model": "kjv3", "textz": ["a"]})
    assert (status, body["code"]) == (400, "invalid_argument")
    assert "textz" in body["message"]  # a misspelt field is named, never silently dropped

    status, _, raw = post(
        port, f"{SERVICE_PATH}/Score", b"{not json", {"content-type": "application/json"}
    )
    assert status == 400 and json.loads(raw)["code"] == "invalid_argument"

    status, _, body = post_json(port, f"{SERVICE_PATH}/NoSuchMethod", {})
    assert status == 404


def test_undecodable_bodies_are_counted_like_any_refusal(
    port: int, server: BackgroundServer
) -> None:
    key = (
        "lmserve_requests_total",
        frozenset(
            {
                ("method", "Perplexity"),
                ("model", ""),
                ("code", "INVALID_ARGUMENT"),
                ("front", "http"),
            }
        ),
    )
    before = scrape(server).get(key, 0.0)
    status, _, body = post_json(port, f"{SERVICE_PATH}/Perplexity", {"modle": "kjv3"})
    assert (status, body["code"]) == (400, "invalid_argument")
    assert body["message"].startswith("request: not a valid lmserve.v1.PerplexityRequest message")
    assert "modle" in body["message"]
    status, _, raw = post(
        port, f"{SERVICE_PATH}/Perplexity", b"\xff\x00", {"content-type": "application/proto"}
    )
    assert status == 400 and json.loads(raw)["code"] == "invalid_argument"
    assert scrape(server)[key] == before + 2


def test_generate_errors_end_the_stream_with_the_code(port: int) -> None:
    status, messages, end = stream_call(
        port,
        "Generate",
        [
            {
                "model": "kjv3",
                "prompt": "and",
                "sampling": {"temperature": -1},
                "stopping": {"maxNewTokens": 4},
            }
        ],
    )
    assert status == 200 and messages == []  # Connect streams carry errors in the last frame
    assert end["error"]["code"] == "invalid_argument"
    assert "temperature" in end["error"]["message"]


def test_deadline_from_connect_timeout(port: int) -> None:
    texts = [" ".join(TEXTS * 200)] * 50
    status, _, body = post_json(
        port,
        f"{SERVICE_PATH}/Perplexity",
        {"model": "kjv3", "texts": texts},
        {"connect-timeout-ms": "1"},
    )
    assert (status, body["code"]) == (504, "deadline_exceeded")


def test_request_ids_and_metrics_are_the_grpc_ports(port: int, server: BackgroundServer) -> None:
    key = (
        "lmserve_requests_total",
        frozenset(
            {("method", "GetModel"), ("model", ""), ("code", "NOT_FOUND"), ("front", "http")}
        ),
    )
    before = scrape(server).get(key, 0.0)
    status, headers, _ = post_json(
        port, f"{SERVICE_PATH}/GetModel", {"model": "missing-model"}, {"x-request-id": "req-42"}
    )
    assert status == 404 and headers["x-request-id"] == "req-42"
    status, headers, _ = post_json(port, f"{SERVICE_PATH}/ListModels", {})
    assert status == 200 and len(headers["x-request-id"]) == 32  # a fresh one
    assert scrape(server)[key] == before + 1


def test_side_effect_free_reads_answer_get(port: int) -> None:
    query = urllib.parse.urlencode({"encoding": "json", "message": "{}"})
    url = f"http://127.0.0.1:{port}{SERVICE_PATH}/ListModels?{query}"
    with urllib.request.urlopen(url, timeout=10) as response:
        names = {m["name"] for m in json.loads(response.read())["models"]}
    assert {"kjv3", "test"} <= names


def test_healthz(port: int) -> None:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as response:
        assert (response.status, response.read()) == (200, b"SERVING\n")


# -- the same auth and TLS as the gRPC port ---------------------------------------------------

TOKEN = AUTH_TOKEN


def _server(model_repository: Path, **settings: Any) -> BackgroundServer:
    base = {"model_repository": model_repository, "host": "127.0.0.1", "port": 0}
    base |= {"metrics_enabled": False, "http_port": 0}
    return start_background_server(load_settings(base | settings), registry=CollectorRegistry())


@pytest.fixture(scope="module")
def token_server(auth_server: BackgroundServer) -> BackgroundServer:
    # The session's server that asks for AUTH_TOKEN, with a small Rerank limit for the
    # overload answer below.
    return auth_server


def test_a_request_over_a_limit_is_429_with_the_limit_named(
    token_server: BackgroundServer,
) -> None:
    hypotheses = [{"text": t} for t in ("a", "b", "c")]
    status, headers, body = post_json(
        token_server.http_port or 0,
        f"{SERVICE_PATH}/Rerank",
        {"model": "kjv3", "lists": [{"id": "x", "hypotheses": hypotheses}]},
        {"authorization": f"Bearer {TOKEN}"},
    )
    assert (status, body["code"]) == (429, "resource_exhausted")
    assert "more than the limit of 2" in body["message"]
    assert "retry-after" not in headers  # too large is never worth a retry


def test_bearer_token_is_required(token_server: BackgroundServer) -> None:
    port = token_server.http_port
    assert port
    path = f"{SERVICE_PATH}/ListModels"
    status, _, body = post_json(port, path, {})
    assert (status, body["code"]) == (401, "unauthenticated")
    assert "Bearer" in body["message"]
    status, _, body = post_json(port, path, {}, {"authorization": "Bearer wrong"})
    assert (status, body["message"]) == (401, "invalid bearer token")
    status, _, body = post_json(port, path, {}, {"authorization": f"Bearer {TOKEN}"})
    assert status == 200 and body["models"]


def test_tls_serves_https_with_the_grpc_ports_certificate(
    model_repository: Path, tmp_path: Path
) -> None:
    pki = make_pki(tmp_path)
    with _server(
        model_repository, tls_cert_file=pki / "server.pem", tls_key_file=pki / "server.key"
    ) as server:
        context = ssl.create_default_context(cafile=str(pki / "ca.pem"))
        request = urllib.request.Request(
            f"https://localhost:{server.http_port}{SERVICE_PATH}/Score",
            data=json.dumps({"model": "test", "texts": ["looking on a little"]}).encode(),
            headers={"content-type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            assert json.loads(response.read())["results"][0]["tokenCount"] == 5
        with pytest.raises(OSError):  # plaintext is not served on a TLS port
            urllib.request.urlopen(f"http://localhost:{server.http_port}/healthz", timeout=10)


def _end_of(data: bytes) -> dict[str, Any]:
    """The end-of-stream object of a Connect streaming answer (its last envelope)."""
    offset, end = 0, {}
    while offset + 5 <= len(data):
        flags, length = struct.unpack_from(">BI", data, offset)
        if flags & 0x02:
            end = json.loads(data[offset + 5 : offset + 5 + length])
        offset += 5 + length
    return end


@pytest.mark.parametrize("method", ["ScoreStream", "RerankStream", "CorpusPerplexity", "Complete"])
@pytest.mark.parametrize("content_type", ["application/connect+json", "application/connect+proto"])
def test_a_malformed_stream_envelope_is_the_clients_error(
    port: int, method: str, content_type: str, caplog: pytest.LogCaptureFixture
) -> None:
    message = b'{"model": "kjv3"}' if content_type.endswith("json") else b"\x0a\x04kjv3"
    malformed = {
        "invalid flags": struct.pack(">BI", 0x7F, len(message)) + message,
        "truncated envelope": struct.pack(">BI", 0, len(message)) + message[:3],
        "short header": b"\x00\x00",
        "length past the end": struct.pack(">BI", 0, 9999) + message,
    }
    headers = {"content-type": content_type, "connect-protocol-version": "1"}
    caplog.set_level("WARNING")
    for what, body in malformed.items():
        status, _, data = post(port, f"{SERVICE_PATH}/{method}", body, headers)
        assert status == 200, what  # Connect streams answer errors in their last envelope
        end = (
            _end_of(data)
            if content_type.endswith("json")
            else json.loads(data[5:])
            if data[:1] == b"\x02"
            else _end_of(data)
        )
        assert end["error"]["code"] == "invalid_argument", (what, end)
        assert "malformed request stream" in end["error"]["message"], (what, end)
    assert not [r for r in caplog.records if r.levelname == "ERROR"]
    # The server still answers.
    status, _, answer = post_json(port, f"{SERVICE_PATH}/GetModel", {"model": "kjv3"})
    assert status == 200 and answer["model"]["name"] == "kjv3"


def test_an_old_http_connection_is_told_to_close(model_repository: Path) -> None:
    import http.client
    import time

    settings = {
        "model_repository": model_repository,
        "host": "127.0.0.1",
        "port": 0,
        "http_port": 0,
        "metrics_enabled": False,
        "max_connection_age_seconds": 0.5,
    }
    with start_background_server(load_settings(settings), registry=CollectorRegistry()) as s:
        assert s.http_port
        connection = http.client.HTTPConnection("127.0.0.1", s.http_port, timeout=10)
        try:
            for expect_close in (False, False, True):
                if expect_close:
                    time.sleep(0.6)
                connection.request("GET", "/healthz")
                response = connection.getresponse()
                response.read()
                assert response.status == 200
                closing = (response.getheader("connection") or "").lower() == "close"
                assert closing is expect_close
        finally:
            connection.close()
