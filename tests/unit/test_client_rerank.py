"""The client's rerank calls and the rerank CLI against a small in-process stand-in server.

The stand-in applies the contract's formula with a toy LM (lm_log_prob = -number of characters),
so these tests check the client's plumbing: requests sent, answers converted, stream order,
errors mapped and named. The real server is tested in tests/integration/test_rerank.py.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from lmserve.client import (
    AsyncLmServeClient,
    InvalidArgumentError,
    LmServeClient,
    ModelNotFoundError,
    NBestHypothesis,
    NBestInputError,
    NBestList,
)
from lmserve.v1 import lm_service_pb2 as pb
from lmserve.v1 import lm_service_pb2_grpc


def _answer(request: pb.RerankRequest) -> pb.RerankResponse:
    weight = request.lm_weight if request.HasField("lm_weight") else 1.0
    lists = []
    for nb in request.lists:
        rows = []
        for i, h in enumerate(nb.hypotheses):
            text = h.text if not h.HasField("tokens") else " ".join(h.tokens.tokens)
            lm, length = -float(len(text)), len(text.split())
            combined = sum(request.score_weights.get(k, 1.0) * v for k, v in h.scores.items())
            rows.append((combined + weight * lm + request.length_bonus * length, i, lm, length))
        rows.sort(key=lambda r: (-r[0], r[1]))
        lists.append(
            pb.RerankedList(
                id=nb.id,
                hypotheses=[
                    pb.RerankedHypothesis(
                        index=i, rank=rank, lm_log_prob=lm, combined_score=c, length=n
                    )
                    for rank, (c, i, lm, n) in enumerate(rows)
                ],
            )
        )
    return pb.RerankResponse(model=request.model, lists=lists, request_tokens=3, computed_tokens=2)


class _StandIn(lm_service_pb2_grpc.LanguageModelServiceServicer):
    def Rerank(self, request: pb.RerankRequest, context: grpc.ServicerContext) -> pb.RerankResponse:
        if request.model != "m":
            context.abort(grpc.StatusCode.NOT_FOUND, f"model {request.model!r} not found")
        if request.length_bonus > 100:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "length_bonus: too big")
        return _answer(request)

    def RerankStream(
        self, request_iterator: Iterator[pb.RerankRequest], context: grpc.ServicerContext
    ) -> Iterator[pb.RerankResponse]:
        for i, request in enumerate(request_iterator):
            if not request.lists:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"requests[{i}].lists: empty")
            yield _answer(request)


@pytest.fixture(scope="module")
def target() -> Iterator[str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    lm_service_pb2_grpc.add_LanguageModelServiceServicer_to_server(_StandIn(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(grace=None)


LISTS: list[Any] = [
    NBestList(
        "u1",
        [NBestHypothesis("abc", scores={"ac": 0.0}), NBestHypothesis("a", scores={"ac": -1.0})],
    ),
    {
        "id": "u2",
        "hypotheses": [
            {"text": "xy", "scores": {"ac": -5}},
            {"tokens": ["x"], "scores": {"ac": -5}},
        ],
    },
]


def test_rerank_converts_the_answer(target: str) -> None:
    with LmServeClient(target, timeout=5) as client:
        result = client.rerank("m", LISTS, score_weights={"ac": 2.0}, length_bonus=0.5)
    assert (result.model, result.request_tokens, result.computed_tokens) == ("m", 3, 2)
    assert [r.id for r in result] == ["u1", "u2"]
    # u1: "abc" 0 - 3 + 0.5 = -2.5; "a" -2 - 1 + 0.5 = -2.5: a tie, lower index first.
    assert [(h.index, h.rank, h.combined_score) for h in result[0].hypotheses] == [
        (0, 0, -2.5),
        (1, 1, -2.5),
    ]
    # u2: "xy" -10 - 2 + 0.5 = -11.5; "x" -10 - 1 + 0.5 = -10.5.
    assert [(h.index, h.lm_log_prob, h.length) for h in result[1].hypotheses] == [
        (1, -1.0, 1),
        (0, -2.0, 1),
    ]


def test_rerank_stream_answers_in_order_and_names_a_bad_batch(target: str) -> None:
    batches = [[LISTS[0]], [LISTS[1], LISTS[0]], [LISTS[1]]]
    with LmServeClient(target, timeout=5) as client:
        ids = [[r.id for r in answer] for answer in client.rerank_stream("m", batches)]
        assert ids == [["u1"], ["u2", "u1"], ["u2"]]
        bad = [[LISTS[0]], [LISTS[1], {"id": "z", "hypotheses": [{"text": "a", "tokens": ["a"]}]}]]
        seen = []
        with pytest.raises(NBestInputError) as info:
            for answer in client.rerank_stream("m", bad):
                seen.append(answer[0].id)
        # The bad batch cancels the call: the first answer may or may not have arrived by then.
        assert seen == ["u1"][: len(seen)]
        assert info.value.field == "requests[1].lists[1].hypotheses[0]"
        with pytest.raises(InvalidArgumentError, match=r"requests\[1\]\.lists: empty"):
            list(client.rerank_stream("m", [[LISTS[0]], []]))


def test_server_errors_map_to_client_errors(target: str) -> None:
    with LmServeClient(target, timeout=5) as client:
        with pytest.raises(ModelNotFoundError, match="'nope'"):
            client.rerank("nope", LISTS)
        with pytest.raises(InvalidArgumentError, match="length_bonus"):
            client.rerank("m", LISTS, length_bonus=1000.0)


def test_async_client_gives_the_same_answers(target: str) -> None:
    async def calls() -> tuple[Any, list[Any]]:
        async with AsyncLmServeClient(target, timeout=5) as client:
            one = await client.rerank("m", LISTS, lm_weight=0.5)
            many = [a async for a in client.rerank_stream("m", [LISTS[:1], LISTS], lm_weight=0.5)]
            return one, many

    one, many = asyncio.run(calls())
    with LmServeClient(target, timeout=5) as client:
        assert one == client.rerank("m", LISTS, lm_weight=0.5)
        assert many == list(client.rerank_stream("m", [LISTS[:1], LISTS], lm_weight=0.5))
    assert [len(m) for m in many] == [1, 2]


def cli(*argv: str) -> int:
    from lmserve.server.cli import main

    return main(list(argv))


def test_cli_rerank_and_tune(
    target: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = [
        {
            "id": "u1",
            "reference": "a",
            "hypotheses": [
                {"text": "abc", "scores": {"ac": 0}},
                {"text": "a", "scores": {"ac": -1}},
            ],
        },
        {
            "id": "u2",
            "reference": "xy z",
            "hypotheses": [
                {"text": "x", "scores": {"ac": 0}},
                {"text": "xy z", "scores": {"ac": -4}},
            ],
        },
    ] * 3
    path = tmp_path / "dev.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    base = ["--target", target, "--model", "m", "--batch-lists", "2"]
    assert cli("rerank", *base, "--output", "1best", "--weight", "ac=2", str(path)) == 0
    # u1: "abc" 0 - 3 = -3 beats "a" -2 - 1 = -3 by index; u2: "x" -1, "xy z" -8 - 4 = -12.
    assert capsys.readouterr().out.splitlines() == ["abc", "x"] * 3
    assert cli("rerank", *base, "--weight", "ac=2", str(path)) == 0  # 1-best is the default
    assert capsys.readouterr().out.splitlines() == ["abc", "x"] * 3
    assert cli("rerank", *base, "--lm-weight", "0", "--json", str(path)) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["id"] for r in records] == ["u1", "u2"] * 3
    assert records[0]["reference"] == "a" and records[0]["hypotheses"][0]["text"] == "abc"
    assert records[1]["hypotheses"][0]["scores"] == {"ac": 0.0}

    grid = ["--grid-lm-weight", "0,1", "--grid-length-bonus", "0,5"]
    assert cli("rerank-tune", *base, *grid, str(path)) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0] == "LM_WEIGHT\tLENGTH_BONUS\tWER" and len(table) == 6
    assert table[-1].startswith("best: --lm-weight ")
    assert cli("rerank-tune", *base, *grid, "--json", str(path)) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["lm_weight"], r["length_bonus"]) for r in rows[:4]] == [
        (0.0, 0.0),
        (0.0, 5.0),
        (1.0, 0.0),
        (1.0, 5.0),
    ]
    # WER over 3 x ("a", "xy z"): w=0,b=0 picks "abc", "x" (3/3); w=0,b=5 "abc" (5 vs 4), "xy z"
    # (6 vs 5) (1/3); w=1 picks "a" and "x" with either bonus (2/3).
    assert [r["wer"] for r in rows[:4]] == pytest.approx([1.0, 1 / 3, 2 / 3, 2 / 3])
    assert rows[4] == {"best": rows[1], "lists": 6}


def test_cli_bad_input_is_one_line_naming_the_field(
    target: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "u", "hypotheses": [{"text": "a", "scores": {"ac": "x"}}]}\n')
    assert cli("rerank", "--target", target, "--model", "m", str(path)) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f'{path}:1.hypotheses[0].scores["ac"]: must be a number' in err
    assert cli("rerank", "--target", target, "--model", "nope", str(path).replace("bad", "x")) != 0
    assert "x.jsonl" in capsys.readouterr().err
