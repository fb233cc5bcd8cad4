"""Generated requests over every route of the HTTP front against the real server: each gets a
documented status and code (never HTTP 500, never Connect `internal` or `unknown`), no ERROR log
line is written for a client's request, and the server still serves afterwards.

Derandomized, a few hundred examples (bench/fuzz_http.py runs ten thousand)."""

from __future__ import annotations

import json
import urllib.request

import pytest
from http_fuzz import HttpCall, documented, http_calls, send
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lmserve.server.front.process.app import BackgroundServer

EXAMPLES = 300


def test_fuzzed_http_requests_get_documented_answers(
    server: BackgroundServer, caplog: pytest.LogCaptureFixture
) -> None:
    port = server.http_port
    assert port
    caplog.set_level("WARNING")
    seen: dict[str, set[str]] = {}

    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(call=http_calls())
    def check(call: HttpCall) -> None:
        answer = send(port, call)
        seen.setdefault(call.path.rsplit("/", 1)[-1], set()).add(f"{answer[0]} {answer[1]}")
        assert documented(answer), f"{call!r} answered {answer}"

    check()
    errors = [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]
    assert not errors, [r.getMessage() for r in errors[:3]]
    assert len(seen) >= 10  # the generator reached most routes
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as health:
        assert health.status == 200
    body = json.dumps({"model": "test", "texts": ["a little"]}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/lmserve.v1.LanguageModelService/Score",
        data=body,
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert json.load(answer)["results"][0]["tokenCount"] == 3


FRAME = st.one_of(
    st.text(max_size=60),
    st.binary(max_size=60),
    st.builds(
        json.dumps,
        st.fixed_dictionaries(
            {},
            optional={
                "model": st.sampled_from(["test", "kjv3", "missing", "", 3, None]),
                "appendText": st.one_of(st.text(max_size=20), st.integers()),
                "partialWord": st.one_of(st.text(max_size=8), st.lists(st.integers())),
                "k": st.one_of(st.integers(-5, 10**6), st.text(max_size=3)),
                "rollbackTokens": st.integers(-3, 10**9),
                "reset": st.one_of(st.booleans(), st.text(max_size=3)),
                "userWords": st.lists(st.text(max_size=6), max_size=4),
                "cacheWeight": st.one_of(st.floats(allow_nan=False), st.text(max_size=3)),
            },
        ),
    ),
)


def test_fuzzed_socket_frames_get_answers_or_policy_closes(
    server: BackgroundServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Every frame a client may send on /ws/complete: an answer, or an error frame and a
    policy close (1008) for the client's mistake; never a server error (1011), no ERROR line."""
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    port = server.http_port
    caplog.set_level("WARNING")
    closes: set[int] = set()

    @settings(max_examples=120, derandomize=True, database=None, deadline=None)
    @given(frames=st.lists(FRAME, min_size=1, max_size=4))
    def check(frames: list[str | bytes]) -> None:
        with connect(f"ws://127.0.0.1:{port}/ws/complete", proxy=None) as ws:
            try:
                for frame in frames:
                    ws.send(frame)
                    ws.recv(timeout=10)
            except ConnectionClosed as closed:
                code = closed.rcvd.code if closed.rcvd is not None else 1006
                closes.add(code)
                assert code in (1000, 1008, 1009), code
            except TimeoutError:
                pass  # a skipped message (no suggestion asked for) is not answered

    check()
    assert 1008 in closes  # the bad frames were refused as the client's mistakes
    errors = [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]
    assert not errors, [r.getMessage() for r in errors[:3]]
