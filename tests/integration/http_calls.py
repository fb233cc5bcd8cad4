"""Plain-HTTP calls to a running server's HTTP front (the standard library only, so the test
client shares no code with the server): Connect unary JSON, and Connect streams framed here.

    status, headers, body = post_json(port, "/lmserve.v1.LanguageModelService/Score", {...})
"""

from __future__ import annotations

import json
import struct
import urllib.error
import urllib.request
from typing import Any

SERVICE_PATH = "/lmserve.v1.LanguageModelService"
END_STREAM = 0x02


def post(
    port: int, path: str, body: bytes, headers: dict[str, str], timeout: float = 30
) -> tuple[int, dict[str, str], bytes]:
    """(HTTP status, lowercased headers, body) of one POST, error statuses included."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=body, headers=headers, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, _lower(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, _lower(error.headers), error.read()


def post_json(
    port: int, path: str, message: object, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], Any]:
    """A Connect unary call with a JSON body; the answer's JSON decoded."""
    status, got, body = post(
        port,
        path,
        json.dumps(message).encode(),
        {"content-type": "application/json", **(headers or {})},
    )
    return status, got, json.loads(body) if body else None


def call(port: int, method: str, message: object, **headers: str) -> Any:
    """A unary RPC's JSON answer; AssertionError with the body when it is not 200."""
    status, _, body = post_json(port, f"{SERVICE_PATH}/{method}", message, headers)
    assert status == 200, (status, body)
    return body


def envelope(message: object, flags: int = 0) -> bytes:
    data = json.dumps(message).encode()
    return struct.pack(">BI", flags, len(data)) + data


def stream_call(
    port: int, method: str, messages: list[object], **headers: str
) -> tuple[int, list[Any], dict[str, Any]]:
    """A Connect streaming call (`application/connect+json`): (HTTP status, the messages,
    the end-of-stream object, whose `error` is set when the call failed)."""
    body = b"".join(envelope(m) for m in messages)
    status, _, data = post(
        port,
        f"{SERVICE_PATH}/{method}",
        body,
        {"content-type": "application/connect+json", **headers},
    )
    out: list[Any] = []
    end: dict[str, Any] = {}
    offset = 0
    while offset < len(data):
        flags, length = struct.unpack_from(">BI", data, offset)
        payload = json.loads(data[offset + 5 : offset + 5 + length])
        offset += 5 + length
        if flags & END_STREAM:
            end = payload
        else:
            out.append(payload)
    return status, out, end


def _lower(headers: Any) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}
