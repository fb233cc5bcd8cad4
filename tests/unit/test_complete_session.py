"""The client's autocomplete sessions over real gRPC, against a small in-test Complete server.

The server here is a stand-in for lmserve's (whose Complete lands separately): it follows the
wire contract (context, reset, rollback, append, then the k best words of a table model that
depends on the context) with sessions in a dict, so the client's bookkeeping, its sequence
numbers and its transparent resume on a replaced server can be checked end to end.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import sys
from collections.abc import Iterator

import grpc
import pytest

from lmserve.client import (
    AsyncLmServeClient,
    Completion,
    InvalidArgumentError,
    LmServeClient,
)
from lmserve.v1 import lm_service_pb2 as pb
from lmserve.v1 import lm_service_pb2_grpc

WORDS = ["and", "god", "good", "gold", "said", "saw", "the", "there", "light", "let", "be"]


def table_log_probs(context: list[str]) -> dict[str, float]:
    """A distribution over WORDS that changes with the context's length and last word."""
    last = len(context[-1]) if context else 0
    scores = {w: -len(w) + ((len(context) * 7 + i * 3 + last) % 5) for i, w in enumerate(WORDS)}
    norm = math.log(sum(math.exp(s) for s in scores.values()))
    return {w: s - norm for w, s in scores.items()}


def expected(context: list[str], partial: str, k: int) -> list[Completion]:
    lps = table_log_probs(context)
    best = sorted((w for w in WORDS if w.startswith(partial.lower())), key=lambda w: -lps[w])
    return [Completion(w, lps[w]) for w in best[:k]]


class TableServer(lm_service_pb2_grpc.LanguageModelServiceServicer):
    """Complete over `table_log_probs`; `sessions` maps id -> context."""

    def __init__(self) -> None:
        self.sessions: dict[str, list[str]] = {}
        self.ids = itertools.count(1)
        self.rebuilt = 0

    def Complete(self, requests, context):  # type: ignore[no-untyped-def]  # noqa: N802
        session_id = ""
        for request in requests:
            if not session_id:
                if not request.model:
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, "model: required")
                session_id = request.session_id or f"s{next(self.ids)}"
                self.sessions.setdefault(session_id, [])
            tokens = self.sessions[session_id]
            rebuilt = False
            if request.HasField("context"):
                wanted = list(request.context.tokens)
                rebuilt = wanted != tokens or session_id not in self.sessions
                self.rebuilt += rebuilt
                tokens[:] = wanted
            if request.reset:
                tokens.clear()
            if request.rollback_tokens > len(tokens):
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "rollback_tokens: too many")
            del tokens[len(tokens) - request.rollback_tokens :]
            appended = request.append_text.lower().split() or list(request.append_tokens)
            tokens.extend(appended)
            if not 1 <= request.k <= 100:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "k: must be in 1..100")
            found = expected(tokens, request.partial_word, request.k)
            yield pb.CompleteResponse(
                session_id=session_id,
                completions=[pb.Completion(word=c.word, log_prob=c.log_prob) for c in found],
                context_tokens=len(tokens),
                sequence=request.sequence,
                appended_tokens=appended,
                rebuilt=rebuilt,
                model="table",
            )


def start(servicer: TableServer, port: int = 0) -> tuple[grpc.Server, int]:
    from concurrent import futures

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    lm_service_pb2_grpc.add_LanguageModelServiceServicer_to_server(servicer, server)
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    return server, bound


@pytest.fixture
def served() -> Iterator[tuple[TableServer, int]]:
    servicer = TableServer()
    server, port = start(servicer)
    yield servicer, port
    server.stop(0)


def test_typing_commits_words_and_answers_for_the_partial_one(
    served: tuple[TableServer, int],
) -> None:
    servicer, port = served
    with LmServeClient(f"127.0.0.1:{port}") as client, client.complete("table", k=2) as s:
        assert s.type("G") == expected([], "g", 2)
        assert s.type("od sa") == expected(["god"], "sa", 2)
        assert s.context == ("god",) and s.partial == "sa"
        assert s.session_id and servicer.sessions[s.session_id] == ["god"]
        assert s.accept("said") == expected(["god", "said"], "", 2)
        assert s.partial == ""
        assert s.suggest("t", k=3) == expected(["god", "said"], "t", 3)


def test_backspace_edits_the_partial_word_then_rolls_back_whole_tokens(
    served: tuple[TableServer, int],
) -> None:
    servicer, port = served
    with LmServeClient(f"127.0.0.1:{port}") as client, client.complete("table") as s:
        s.type("and god sa")
        assert s.backspace() == expected(["and", "god"], "s", 3)
        assert s.backspace(2) == expected(["and"], "god", 3)  # "s", then the space
        assert s.context == ("and",) and s.partial == "god"
        assert s.backspace(5) == expected([], "an", 3)
        assert servicer.sessions[s.session_id] == []
        assert s.backspace(9) == expected([], "", 3) and s.context == ()


def test_reset_clears_context_and_partial(served: tuple[TableServer, int]) -> None:
    _, port = served
    with LmServeClient(f"127.0.0.1:{port}") as client, client.complete("table") as s:
        s.type("and the li")
        assert s.reset() == expected([], "", 3)
        assert s.context == () and s.partial == ""


def test_a_rejected_message_leaves_the_session_usable_from_a_new_stream(
    served: tuple[TableServer, int],
) -> None:
    servicer, port = served
    with LmServeClient(f"127.0.0.1:{port}") as client, client.complete("table") as s:
        s.type("and god ")
        with pytest.raises(InvalidArgumentError, match="k"):
            s.suggest("g", k=0)
        assert s.context == ("and", "god")
        assert s.type("s") == expected(["and", "god"], "s", 3)
        assert servicer.rebuilt == 0  # the new stream's context matched the session's


def test_a_replaced_server_is_resumed_transparently() -> None:
    first = TableServer()
    server, port = start(first)
    try:
        with LmServeClient(f"127.0.0.1:{port}") as client, client.complete("table") as s:
            s.type("and god said let there be li")
            session = s.session_id
            server.stop(0).wait()
            second = TableServer()  # knows no session
            server, _ = start(second, port)
            assert s.type("g") == expected(["and", "god", "said", "let", "there", "be"], "lig", 3)
            assert s.session_id == session and second.rebuilt == 1
            assert second.sessions[session] == list(s.context)
    finally:
        server.stop(0)


def test_the_async_session_answers_as_the_sync_one(served: tuple[TableServer, int]) -> None:
    _, port = served

    async def main() -> list[list[Completion]]:
        async with AsyncLmServeClient(f"127.0.0.1:{port}") as client:
            async with client.complete("table", k=2) as s:
                answers = [await s.type("and go"), await s.backspace(), await s.accept("god")]
                answers.append(await s.reset())
                assert s.context == ()
                return answers

    assert asyncio.run(main()) == [
        expected(["and"], "go", 2),
        expected(["and"], "g", 2),
        expected(["and", "god"], "", 2),
        expected([], "", 2),
    ]


def test_the_type_mode_prints_each_keystrokes_suggestions(
    served: tuple[TableServer, int], capsys: pytest.CaptureFixture[str]
) -> None:
    from lmserve.server.cli import main

    _, port = served
    argv = ["complete", "--model", "table", "--k", "2", "--target", f"127.0.0.1:{port}"]
    assert main([*argv, "--json", "--type", "and gx\bo"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["typed"] for r in records] == [
        "a",
        "an",
        "and",
        "and ",
        "and g",
        "and gx",
        "and g",
        "and go",
    ]
    assert records[-1]["context"] == ["and"] and records[-1]["partial"] == "go"
    assert [(c["word"], c["log_prob"]) for c in records[-1]["completions"]] == [
        (c.word, c.log_prob) for c in expected(["and"], "go", 2)
    ]
    assert records[-1]["completions"][0]["prob"] == pytest.approx(
        math.exp(records[-1]["completions"][0]["log_prob"])
    )


def test_complete_command_continues_a_session_by_id(
    served: tuple[TableServer, int], capsys: pytest.CaptureFixture[str]
) -> None:
    from lmserve.server.cli import main

    _, port = served
    argv = ["complete", "--model", "table", "--target", f"127.0.0.1:{port}", "--json"]
    assert main([*argv, "--type", "and "]) == 0
    first = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    session = first[-1]["session_id"]
    assert session and {r["session_id"] for r in first} == {session}
    assert main([*argv, "--session-id", session, "--type", "g"]) == 0
    [resumed] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert resumed["session_id"] == session
    # The resumed session still holds "and": its suggestions are the ones after it.
    assert [c["word"] for c in resumed["completions"]] == [
        c.word for c in expected(["and"], "g", 3)
    ]
    # Without --json: one human line a keystroke, what was typed and then the suggestions.
    assert main([*argv[:-1], "--type", "a"]) == 0
    [line] = capsys.readouterr().out.splitlines()
    assert line.startswith("a|\t") and "{" not in line


def test_the_interactive_mode_says_what_is_missing_without_prompt_toolkit(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from lmserve.server.cli import main

    monkeypatch.setitem(sys.modules, "prompt_toolkit", None)  # as if not installed
    assert main(["complete", "--model", "table", "--target", "127.0.0.1:1"]) == 1
    assert "pip install 'lmserve-client[demo]'" in capsys.readouterr().err


def test_the_interactive_screen_follows_edits_and_tab_accepts_the_best(
    served: tuple[TableServer, int],
) -> None:
    from prompt_toolkit.buffer import Buffer

    from lmserve.client.commands.complete_app import _Screen

    _, port = served
    with LmServeClient(f"127.0.0.1:{port}") as client, client.complete("table") as s:
        screen = _Screen(s, "table")
        buffer = Buffer(multiline=False, on_text_changed=lambda b: screen.follow(b.text))
        buffer.insert_text("and th")
        assert screen.found == expected(["and"], "th", 3)
        buffer.delete_before_cursor(4)  # "an": the space and the committed word come back
        assert screen.found == expected([], "an", 3) and s.context == ()
        buffer.insert_text("d g")
        best = screen.found[0].word
        screen.accept_best(buffer)
        assert buffer.text == f"and {best} " and s.context == ("and", best)
        assert screen.found == expected(["and", best], "", 3)
        assert all(c.word in screen.render() for c in screen.found)


def test_the_async_session_resumes_on_a_replaced_server_too() -> None:
    first = TableServer()
    server, port = start(first)
    second = TableServer()

    async def main() -> list[Completion]:
        nonlocal server
        async with AsyncLmServeClient(f"127.0.0.1:{port}") as client:
            async with client.complete("table") as s:
                await s.type("and god sa")
                server.stop(0).wait()
                server, _ = start(second, port)
                return await s.type("i")

    try:
        assert asyncio.run(main()) == expected(["and", "god"], "sai", 3)
        assert second.rebuilt == 1
    finally:
        server.stop(0)
