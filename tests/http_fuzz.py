"""Hypothesis strategies for HTTP requests over every route of the HTTP front, and one call that
returns what it was answered.

    @given(call=http_calls())
    def test(call): assert documented(send(port, call))

Used by tests/integration/test_fuzz_http.py (a few hundred examples) and bench/fuzz_http.py (ten
thousand). What a careless or hostile client sends: every Connect method with the generated
requests of `fuzz_requests` (JSON and binary, unary and enveloped), every content type, broken
envelopes (invalid flags, truncated, lengths past the end), mangled and random bodies; `/v1`
bodies with wrong types and values; unknown paths and methods. Documented answers are the
statuses and Connect codes the README lists; a server fault (HTTP 500, Connect `internal` or
`unknown`) is never one.
"""

from __future__ import annotations

import json
import struct
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from fuzz_requests import rpc_calls
from google.protobuf.json_format import MessageToDict
from hypothesis import strategies as st

SERVICE_PATH = "/lmserve.v1.LanguageModelService"
UNARY = ["ListModels", "GetModel", "Score", "Perplexity", "BeamSearch", "Rerank"]
STREAMING_OUT = ["Generate"]
CLIENT_STREAMING = ["ScoreStream", "CorpusPerplexity", "RerankStream", "Complete"]
# Every HTTP status the front may answer a client's request with; 500 is a server fault.
DOCUMENTED_STATUS = {200, 204, 400, 401, 403, 404, 405, 408, 413, 415, 422, 429, 501, 503, 504}
FAULT_CODES = {"internal", "unknown"}
CONTENT_TYPES = [
    "application/json",
    "application/proto",
    "application/connect+json",
    "application/connect+proto",
    "application/grpc-web+proto",
    "text/plain",
    "application/x-www-form-urlencoded",
    "",
    "application/json; charset=latin-1",
]


@dataclass
class HttpCall:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def __repr__(self) -> str:
        return f"HttpCall({self.method} {self.path} {self.headers} {self.body[:120]!r})"


def envelope(payload: bytes, flags: int = 0) -> bytes:
    return struct.pack(">BI", flags, len(payload)) + payload


@st.composite
def connect_calls(draw: st.DrawFn) -> HttpCall:
    """A Connect call: a generated request of some RPC, encoded one way or another."""
    call = draw(rpc_calls())
    messages = call.request if isinstance(call.request, list) else [call.request]
    as_json = draw(st.booleans())

    def encode(message: Any) -> bytes:
        if as_json:
            return json.dumps(MessageToDict(message)).encode()
        return bytes(message.SerializeToString())

    payloads = [encode(m) for m in messages]
    streaming = call.rpc in CLIENT_STREAMING or call.rpc in STREAMING_OUT
    if streaming:
        body = b"".join(envelope(p) for p in payloads)
        content_type = "application/connect+json" if as_json else "application/connect+proto"
    else:
        body = payloads[0] if payloads else b""
        content_type = "application/json" if as_json else "application/proto"
    damage = draw(st.sampled_from(["none", "none", "type", "flags", "truncate", "length", "bytes"]))
    if damage == "type":
        content_type = draw(st.sampled_from(CONTENT_TYPES))
    elif damage == "flags" and body:
        body = bytes([draw(st.integers(0, 255))]) + body[1:]
    elif damage == "truncate" and body:
        body = body[: draw(st.integers(0, max(0, len(body) - 1)))]
    elif damage == "length":
        body = envelope(body[:8]) if not streaming else struct.pack(">BI", 0, 2**31 - 1) + body
    elif damage == "bytes":
        body = draw(st.binary(max_size=64))
    headers = {"content-type": content_type} if content_type else {}
    if draw(st.booleans()):
        headers["connect-protocol-version"] = "1"
    if draw(st.integers(0, 9)) == 0:
        headers["connect-timeout-ms"] = str(draw(st.integers(-5, 10**12)))
    return HttpCall("POST", f"{SERVICE_PATH}/{call.rpc}", headers, body)


JSON_VALUES = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**63), 2**63),
        st.floats(allow_nan=False),
        st.text(max_size=20),
    ),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
COMPLETION_FIELDS = st.fixed_dictionaries(
    {},
    optional={
        "model": st.sampled_from(["test", "kjv3", "missing", "", 7]),
        "prompt": st.one_of(
            st.text(max_size=40), st.lists(st.text(max_size=10), max_size=3), JSON_VALUES
        ),
        "max_tokens": st.one_of(st.integers(-2, 20), JSON_VALUES),
        "echo": st.one_of(st.booleans(), JSON_VALUES),
        "logprobs": st.one_of(st.integers(-1, 6), JSON_VALUES),
        "temperature": st.one_of(st.floats(-1, 3), JSON_VALUES),
        "top_p": st.one_of(st.floats(-1, 2), JSON_VALUES),
        "n": st.one_of(st.integers(-1, 4), JSON_VALUES),
        "stream": st.one_of(st.booleans(), JSON_VALUES),
        "stop": st.one_of(st.text(max_size=5), st.lists(st.text(max_size=5), max_size=5)),
        "seed": st.one_of(st.integers(-(2**64), 2**64), JSON_VALUES),
    },
)


@st.composite
def openai_calls(draw: st.DrawFn) -> HttpCall:
    path = draw(st.sampled_from(["/v1/completions", "/v1/completions", "/v1/models", "/v1/chat"]))
    if path == "/v1/models":
        return HttpCall("GET", path, {}, b"")
    kind = draw(st.sampled_from(["fields", "fields", "value", "bytes"]))
    if kind == "fields":
        body = json.dumps(draw(COMPLETION_FIELDS)).encode()
    elif kind == "value":
        body = json.dumps(draw(JSON_VALUES)).encode()
    else:
        body = draw(st.binary(max_size=64))
    return HttpCall("POST", path, {"content-type": "application/json"}, body)


@st.composite
def other_calls(draw: st.DrawFn) -> HttpCall:
    path = draw(
        st.sampled_from(
            ["/", "/demo", "/healthz", "/nope", f"{SERVICE_PATH}/NoSuchMethod", "/ws/complete"]
        )
    )
    method = draw(st.sampled_from(["GET", "POST", "PUT", "DELETE", "OPTIONS", "PATCH"]))
    return HttpCall(method, path, {}, draw(st.binary(max_size=16)))


def http_calls() -> st.SearchStrategy[HttpCall]:
    return st.one_of(connect_calls(), connect_calls(), openai_calls(), other_calls())


def send(port: int, call: HttpCall, timeout: float = 15.0) -> tuple[int, str | None]:
    """Makes the call and returns (HTTP status, the Connect or OpenAI error code if any)."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{call.path}",
        data=call.body if call.method not in ("GET",) else None,
        headers=call.headers,
        method=call.method,
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, body = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, body = error.code, error.read()
    return status, error_code(body)


def error_code(body: bytes) -> str | None:
    """The `code` of a Connect error (a unary JSON body, or a stream's end envelope), or the
    `type`/`code` of an OpenAI error; None when the body holds none."""
    candidates: list[bytes] = [body]
    offset = 0
    while offset + 5 <= len(body):  # a Connect stream: every envelope's payload
        flags, length = struct.unpack_from(">BI", body, offset)
        candidates.append(body[offset + 5 : offset + 5 + length])
        offset += 5 + length
    for data in candidates:
        try:
            parsed = json.loads(data)
        except (ValueError, UnicodeDecodeError):
            continue
        if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
            error = parsed["error"]
            code = error.get("code") or error.get("type")
            return str(code) if code is not None else "error"
        if isinstance(parsed, dict) and isinstance(parsed.get("code"), str):
            return parsed["code"]
    return None


def documented(answer: tuple[int, str | None]) -> bool:
    status, code = answer
    return status in DOCUMENTED_STATUS and (code is None or code not in FAULT_CODES)
