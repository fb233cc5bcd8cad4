"""`/ws/complete`: the Complete stream over a WebSocket (one CompleteRequest in proto3 JSON per
text frame, one CompleteResponse per answer), held to the gRPC stream's answers for the same
keystrokes, with its latest-wins skipping, rollback, rebuild from `context`, errors and auth."""

from __future__ import annotations

import json
import queue
import uuid
from typing import Any

import grpc
import pytest
from google.protobuf.json_format import MessageToDict, ParseDict
from http_calls import call
from integration_data import AUTH_TOKEN, READY_MODELS
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from lmserve.server.front.process.app import BackgroundServer
from lmserve.v1 import lm_service_pb2 as pb
from lmserve.v1 import lm_service_pb2_grpc

MODEL = "kjv3"
TOKEN = AUTH_TOKEN
# One user typing "and god said let th", deleting "th" and "let", and typing on.
KEYSTROKES: list[dict[str, Any]] = [
    {"model": MODEL, "k": 5, "partialWord": "a"},
    {"k": 5, "partialWord": "an"},
    {"k": 5, "appendText": "and", "partialWord": ""},
    {"k": 5, "partialWord": "g"},
    {"k": 5, "appendText": "god", "partialWord": "s"},
    {"k": 5, "appendText": "said", "partialWord": "l"},
    {"k": 3, "appendText": "let", "partialWord": "th"},
    {"k": 3, "partialWord": ""},
    {"k": 3, "rollbackTokens": 1, "partialWord": "let"},
    {"k": 3, "rollbackTokens": 1, "partialWord": "said"},
    {"k": 4, "appendText": "said unto", "partialWord": "m"},
    {"k": 4, "reset": True, "appendText": "in the", "partialWord": "beg"},
]


def _url(server: BackgroundServer, query: str = "") -> str:
    return f"ws://127.0.0.1:{server.http_port}/ws/complete{query}"


def _socket(server: BackgroundServer, query: str = "", **headers: str) -> ClientConnection:
    return connect(_url(server, query), additional_headers=headers or None, proxy=None)


def _ask(ws: ClientConnection, message: dict[str, Any]) -> dict[str, Any]:
    ws.send(json.dumps(message))
    answer = json.loads(ws.recv(timeout=30))
    assert isinstance(answer, dict)
    return answer


def _numbered(keystrokes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**k, "sequence": i + 1} for i, k in enumerate(keystrokes)]


def _grpc_answers(channel: grpc.Channel, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The gRPC stream's answers to `messages`, each sent after the previous one's answer."""
    requests: queue.SimpleQueue[pb.CompleteRequest | None] = queue.SimpleQueue()
    stub = lm_service_pb2_grpc.LanguageModelServiceStub(channel)
    answers = stub.Complete(iter(requests.get, None), timeout=30)
    out = []
    for message in messages:
        requests.put(ParseDict(message, pb.CompleteRequest()))
        out.append(MessageToDict(next(answers)))
    requests.put(None)
    return out


def _closed(ws: ClientConnection) -> ConnectionClosed:
    """The close that ends `ws` (after the frames already read)."""
    with pytest.raises(ConnectionClosed) as closed:
        ws.recv(timeout=30)
    return closed.value


def _refused(ws: ClientConnection) -> tuple[dict[str, Any], int, str]:
    """(the error frame's `error`, the close code, the close reason) of a refused call."""
    frame = json.loads(ws.recv(timeout=30))
    assert set(frame) == {"error"}, frame
    close = _closed(ws).rcvd
    assert close is not None
    return frame["error"], close.code, close.reason


def _without_session(answer: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in answer.items() if k != "sessionId"}


def test_answers_are_the_grpc_streams(server: BackgroundServer, channel: grpc.Channel) -> None:
    messages = _numbered(KEYSTROKES)
    with _socket(server) as ws:
        over_socket = [_ask(ws, m) for m in messages]
    over_grpc = _grpc_answers(channel, messages)
    assert [_without_session(a) for a in over_socket] == [_without_session(a) for a in over_grpc]
    # The keystrokes did what they say (the two streams agree on more than nothing).
    assert [a.get("contextTokens", 0) for a in over_socket] == [0, 0, 1, 1, 2, 3, 4, 4, 3, 2, 4, 2]
    assert over_socket[5]["appendedTokens"] == ["said"]
    assert [c["word"] for c in over_socket[4]["completions"]][0].startswith("s")
    assert all(c["word"].startswith("beg") for c in over_socket[-1]["completions"])
    assert len({a["sessionId"] for a in over_socket}) == 1
    assert over_socket[0]["sessionId"].startswith(f"{MODEL}/")


def test_the_newest_waiting_keystroke_wins(server: BackgroundServer) -> None:
    words = "and god said let there be light and there was light".split()
    messages = _numbered(
        [{"model": MODEL, "k": 3, "partialWord": "a"}]
        + [{"k": 3, "appendText": w, "partialWord": "th"} for w in words]
        + [{"k": 3, "partialWord": "th"[: i % 3]} for i in range(40)]
    )
    with _socket(server) as ws:
        for message in messages:  # all at once: a fast typist
            ws.send(json.dumps(message))
        answers = [json.loads(ws.recv(timeout=30)) for _ in messages]
    assert [int(a["sequence"]) for a in answers] == [m["sequence"] for m in messages]
    assert [t for a in answers for t in a.get("appendedTokens", [])] == words
    last = answers[-1]
    assert not last.get("skipped") and len(last["completions"]) == 3
    for answer in answers[:-1]:
        assert bool(answer.get("skipped")) != bool(answer.get("completions")), answer
    assert any(a.get("skipped") for a in answers), "a burst of keystrokes was answered one by one"


def test_a_session_is_rebuilt_from_its_context_on_a_new_socket(server: BackgroundServer) -> None:
    with _socket(server) as ws:
        first = _ask(ws, {"model": MODEL, "k": 5, "appendText": "and god said", "sequence": 1})
        held = _ask(ws, {"k": 5, "partialWord": "l", "sequence": 2})
    context = {"tokens": first["appendedTokens"]}
    with _socket(server) as ws:  # the same session, still held: reused
        again = _ask(
            ws,
            {"model": MODEL, "sessionId": first["sessionId"], "context": context, "k": 5}
            | {"partialWord": "l", "sequence": 3},
        )
    assert not again.get("rebuilt") and again["completions"] == held["completions"]
    # A session this server never held (a restart, another replica): rebuilt from the context.
    elsewhere = f"{MODEL}/{uuid.uuid4().hex}"
    with _socket(server) as ws:
        rebuilt = _ask(
            ws,
            {"model": MODEL, "sessionId": elsewhere, "context": context, "k": 5}
            | {"partialWord": "l", "sequence": 4},
        )
        after = _ask(ws, {"k": 5, "rollbackTokens": 1, "partialWord": "sa", "sequence": 5})
    assert rebuilt["rebuilt"] and rebuilt["sessionId"] == elsewhere
    assert rebuilt["completions"] == held["completions"] and rebuilt["contextTokens"] == 3
    assert after["contextTokens"] == 2 and after["completions"][0]["word"] == "said"


@pytest.mark.parametrize(
    ("frame", "names"),
    [
        ("not json at all", "frame"),
        (json.dumps({"model": MODEL, "k": 3, "partialWrod": "a"}), "partialWrod"),
        (json.dumps({"model": MODEL, "k": 0}), "k"),
        (json.dumps({"model": MODEL, "k": 3, "rollbackTokens": 9}), "rollback_tokens"),
        (json.dumps({"k": 3}), "model"),
    ],
)
def test_a_bad_message_is_an_error_frame_and_a_policy_close(
    server: BackgroundServer, frame: str, names: str
) -> None:
    with _socket(server) as ws:
        ws.send(frame)
        error, code, reason = _refused(ws)
    assert error["code"] == "invalid_argument" and names in error["message"], error
    assert code == 1008 and reason.startswith("invalid_argument: ")


def test_binary_frames_and_unknown_models_are_refused(server: BackgroundServer) -> None:
    with _socket(server) as ws:
        ws.send(b'{"model": "kjv3", "k": 3}')
        error, code, _ = _refused(ws)
    assert (error["code"], code) == ("invalid_argument", 1008) and "text frame" in error["message"]
    with _socket(server) as ws:
        ws.send(json.dumps({"model": "no-such-model", "k": 3}))
        error, code, reason = _refused(ws)
    assert (error["code"], code) == ("not_found", 1008) and "no-such-model" in reason


def test_after_an_error_the_session_goes_on_from_a_new_socket(server: BackgroundServer) -> None:
    with _socket(server) as ws:
        ok = _ask(ws, {"model": MODEL, "k": 3, "appendText": "and god", "sequence": 1})
        ws.send(json.dumps({"k": 3, "rollbackTokens": 5, "sequence": 2}))  # past the start
        error, code, _ = _refused(ws)
    assert error["code"] == "invalid_argument" and code == 1008
    with _socket(server) as ws:
        answer = _ask(
            ws, {"model": MODEL, "sessionId": ok["sessionId"], "k": 3, "partialWord": "s"}
        )
    assert answer["sessionId"] == ok["sessionId"] and answer["contextTokens"] == 2
    assert not answer.get("rebuilt") and answer["completions"][0]["word"] == "said"


def test_list_models_says_which_models_complete(server: BackgroundServer) -> None:
    """The page offers the models whose `capabilities.complete` is set: every ready one."""
    models = call(server.http_port, "ListModels", {})["models"]
    completing = {m["name"] for m in models if m.get("capabilities", {}).get("complete")}
    assert completing == set(READY_MODELS)


def test_the_socket_carries_a_request_id(server: BackgroundServer) -> None:
    with _socket(server, **{"x-request-id": "ws-request-1"}) as ws:
        assert ws.response is not None
        assert ws.response.headers["x-request-id"] == "ws-request-1"
        assert _ask(ws, {"model": MODEL, "k": 1})["completions"]


@pytest.fixture(scope="module")
def token_server(auth_server: BackgroundServer) -> BackgroundServer:
    return auth_server  # the session's server that asks for AUTH_TOKEN


@pytest.mark.parametrize(
    ("query", "headers"),
    [("", {}), ("?access_token=wrong", {}), ("", {"authorization": "Bearer wrong"})],
)
def test_a_missing_or_wrong_token_is_refused(
    token_server: BackgroundServer, query: str, headers: dict[str, str]
) -> None:
    with _socket(token_server, query, **headers) as ws:
        error, code, reason = _refused(ws)
    assert error["code"] == "unauthenticated" and code == 1008
    assert reason.startswith("unauthenticated: ") and "token" in error["message"]
    assert TOKEN not in json.dumps(error)


@pytest.mark.parametrize(
    ("query", "headers"),
    [(f"?access_token={TOKEN}", {}), ("", {"authorization": f"Bearer {TOKEN}"})],
)
def test_the_token_in_the_url_or_a_header_is_accepted(
    token_server: BackgroundServer, query: str, headers: dict[str, str]
) -> None:
    with _socket(token_server, query, **headers) as ws:
        answer = _ask(ws, {"model": MODEL, "k": 3, "partialWord": "th", "sequence": 1})
    assert [c["word"][:2] for c in answer["completions"]] == ["th"] * 3


def test_the_socket_carries_the_adaptive_fields(server: BackgroundServer) -> None:
    """userWords, history and cacheWeight in proto3 JSON, as the page and other clients send."""
    with _socket(server) as ws:
        opened = {"model": MODEL, "k": 3, "partialWord": "zorb", "sequence": "1"}
        answer = _ask(ws, opened | {"userWords": {"tokens": ["zorblax"]}})
        assert [c["word"] for c in answer["completions"]] == ["zorblax"]
        history = {"sentences": [{"tokens": ["and", "zorblax", "came"]}]}
        rebuilt = _ask(
            ws,
            {"k": 3, "partialWord": "zorb", "sequence": "2", "history": history, "cacheWeight": 0},
        )
        assert rebuilt.get("completions", []) == []  # weight 0: the model alone
