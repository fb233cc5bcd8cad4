"""Contextual biasing on Rerank, RerankStream, Score and ScoreStream against the real server.

The contract: a text's bias is the sum of the boosts of its leftmost-longest, non-overlapping
phrase matches on the model's words, compared casefolded; Rerank adds it to the combined score
(everything else unchanged), Score reports it beside the unchanged log-probability. A stream
keeps the last list a message sent.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from lmserve.client import LmServeClient, NBestHypothesis, NBestList
from lmserve.server.front.process.app import BackgroundServer
from lmserve.v1 import lm_service_pb2 as pb
from lmserve.v1 import lm_service_pb2_grpc

Stub = lm_service_pb2_grpc.LanguageModelServiceStub

# The acoustic scores prefer the near misses; the bias list holds the right names.
LIST = NBestList(
    "names",
    [
        NBestHypothesis("and nebuchadnezar the king of babel", scores={"acoustic": -10.0}),
        NBestHypothesis("and Nebuchadnezzar the king of Babylon", scores={"acoustic": -26.0}),
        NBestHypothesis("and nebuchadnezzar the king of babel", scores={"acoustic": -18.0}),
    ],
)
BIAS = {"nebuchadnezzar": 4.0, "king of babylon": 3.0, "babylon": 1.0}


@pytest.fixture()
def client(server: BackgroundServer) -> Iterator[LmServeClient]:
    with LmServeClient(server.address, timeout=30) as c:
        yield c


def test_rerank_adds_each_hypothesis_bias_to_its_combined_score(client: LmServeClient) -> None:
    [plain] = client.rerank("kjv3", [LIST], lm_weight=0.5)
    [biased] = client.rerank("kjv3", [LIST], lm_weight=0.5, bias=BIAS)
    before = {h.index: h for h in plain.hypotheses}
    after = {h.index: h for h in biased.hypotheses}
    # Phrases: 0 nebuchadnezzar, 1 "king of babylon", 2 babylon (covered by phrase 1).
    expected = {0: ([], 0.0), 1: ([0, 1], 7.0), 2: ([0], 4.0)}
    for index, (phrases, boost) in expected.items():
        assert list(after[index].bias_phrases) == phrases
        assert after[index].bias == pytest.approx(boost)
        assert after[index].lm_log_prob == before[index].lm_log_prob
        assert after[index].combined_score == pytest.approx(before[index].combined_score + boost)
    assert plain.best.index == 0  # the acoustic near miss wins unbiased
    assert biased.best.index == 1


def test_one_shared_boost_and_per_phrase_boosts(client: LmServeClient) -> None:
    [shared] = client.rerank("kjv3", [LIST], bias=["nebuchadnezzar", "babylon"], bias_boost=2.0)
    assert {h.index: h.bias for h in shared.hypotheses} == {0: 0.0, 1: 4.0, 2: 2.0}
    pairs = [("nebuchadnezzar", -1.5), ("babylon", None)]
    [mixed] = client.rerank("kjv3", [LIST], bias=pairs, bias_boost=0.25)  # type: ignore[arg-type]
    assert {h.index: h.bias for h in mixed.hypotheses} == {0: 0.0, 1: -1.25, 2: -1.5}


def test_score_reports_bias_beside_the_unchanged_log_prob(client: LmServeClient) -> None:
    texts = [h.text for h in LIST.hypotheses if h.text is not None]
    plain = client.score("kjv3", texts, return_tokens=True)
    biased = client.score("kjv3", texts, return_tokens=True, bias=BIAS)
    for p, b, boost in zip(plain, biased, [0.0, 7.0, 4.0], strict=True):
        assert b.log_prob == p.log_prob and b.tokens == p.tokens
        assert b.bias == pytest.approx(boost)
        assert b.biased_log_prob == pytest.approx(p.log_prob + boost)
    totals = client.score("kjv3", texts, bias=BIAS)  # totals only: the same figures
    assert [t.bias for t in totals] == [b.bias for b in biased]


def test_token_lists_match_like_texts(client: LmServeClient) -> None:
    tokens = [["and", "nebuchadnezzar", "the", "king", "of", "babylon"]]
    [from_tokens] = client.score("kjv3", tokens, bias=BIAS)
    [from_text] = client.score("kjv3", ["And NEBUCHADNEZZAR, the king of Babylon!"], bias=BIAS)
    assert from_tokens.bias == from_text.bias == pytest.approx(7.0)
    assert from_tokens.bias_phrases == from_text.bias_phrases == (0, 1)


def test_streams_keep_the_list_of_their_first_message(client: LmServeClient, stub: Stub) -> None:
    batches = [[LIST], [LIST]]
    answers = list(client.rerank_stream("kjv3", batches, bias=BIAS))
    assert [a[0].best.index for a in answers] == [1, 1]
    assert answers[0][0].hypotheses == answers[1][0].hypotheses
    texts = ["nebuchadnezzar", "babylon"]
    scored = list(client.score_stream("kjv3", [texts, texts], bias=BIAS))
    assert [[s.bias for s in batch] for batch in scored] == [[4.0, 1.0], [4.0, 1.0]]

    # A later list replaces the stream's; an empty one clears it.
    def request(bias: pb.BiasList | None) -> pb.ScoreRequest:
        return pb.ScoreRequest(model="kjv3", texts=texts, bias=bias)

    requests = [
        request(pb.BiasList(phrases=[pb.BiasPhrase(phrase="babylon", boost=2.0)])),
        request(None),
        request(pb.BiasList(phrases=[pb.BiasPhrase(phrase="nebuchadnezzar", boost=0.5)])),
        request(None),
        request(pb.BiasList()),
        request(None),
    ]
    replies = list(stub.ScoreStream(iter(requests)))
    got = [[r.bias for r in reply.results] for reply in replies]
    assert got == [[0, 2], [0, 2], [0.5, 0], [0.5, 0], [0, 0], [0, 0]]


def _phrases(*entries: tuple[str, float | None]) -> pb.BiasList:
    return pb.BiasList(
        phrases=[
            pb.BiasPhrase(phrase=p) if b is None else pb.BiasPhrase(phrase=p, boost=b)
            for p, b in entries
        ]
    )


BAD_LISTS: list[tuple[str, pb.BiasList, grpc.StatusCode, str]] = [
    (
        "no words",
        _phrases(("babylon", 1.0), ("!!! 123", 1.0)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "bias.phrases[1].phrase",
    ),
    (
        "NaN boost",
        _phrases(("babylon", math.nan)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "bias.phrases[0].boost",
    ),
    (
        "no boost anywhere",
        _phrases(("babylon", 1.0), ("zion", None)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "bias.phrases[1].boost",
    ),
    (
        "inf shared boost",
        pb.BiasList(phrases=[pb.BiasPhrase(phrase="zion")], boost=math.inf),
        grpc.StatusCode.INVALID_ARGUMENT,
        "bias.boost",
    ),
    (
        "repeated phrase",
        _phrases(("King of Babylon", 1.0), ("king  of BABYLON", 2.0)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "bias.phrases[1]",
    ),
    (
        "too many phrases",
        pb.BiasList(phrases=[pb.BiasPhrase(phrase=f"w{i}") for i in range(10_001)], boost=1.0),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "bias.phrases",
    ),
]


@pytest.mark.parametrize(
    ("bias", "code", "path"), [c[1:] for c in BAD_LISTS], ids=[c[0] for c in BAD_LISTS]
)
def test_a_bad_list_is_refused_naming_the_phrase(
    stub: Stub, bias: pb.BiasList, code: grpc.StatusCode, path: str
) -> None:
    hypotheses = [pb.Hypothesis(text="and god said")]
    calls: list[Any] = [
        lambda: stub.Rerank(
            pb.RerankRequest(model="kjv3", lists=[pb.NBestList(hypotheses=hypotheses)], bias=bias)
        ),
        lambda: stub.Score(pb.ScoreRequest(model="kjv3", texts=["and god said"], bias=bias)),
    ]
    for call in calls:
        with pytest.raises(grpc.RpcError) as info:
            call()
        assert info.value.code() == code
        assert (info.value.details() or "").startswith(path), info.value.details()


def test_cli_rerank_bias_file(
    server: BackgroundServer,
    client: LmServeClient,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from lmserve.server.cli import main

    lists = tmp_path / "in.jsonl"
    lists.write_text(json.dumps(LIST.to_dict()) + "\n")
    phrases = tmp_path / "bias.txt"
    phrases.write_text("# names\nnebuchadnezzar\t4\n\nking of babylon\nbabylon\t1\n")
    argv = ["rerank", "--target", server.address, "--model", "kjv3", str(lists)]
    assert main([*argv, "--bias", str(phrases), "--bias-boost", "3", "--json"]) == 0
    [record] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    [expected] = client.rerank("kjv3", [LIST], bias=BIAS)
    assert [h["index"] for h in record["hypotheses"]] == [h.index for h in expected.hypotheses]
    assert record["hypotheses"][0]["bias"] == pytest.approx(7.0)
    assert record["hypotheses"][0]["bias_phrases"] == [0, 1]
    phrases.write_text("babylon\tlots\n")
    with pytest.raises(SystemExit):
        main([*argv, "--bias", str(phrases)])
    assert "bias.txt:1: the boost after the TAB must be a number" in capsys.readouterr().err


def test_cli_score_bias_file(
    server: BackgroundServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from lmserve.server.cli import main

    phrases = tmp_path / "bias.txt"
    phrases.write_text("king of babylon\nnebuchadnezzar\t4\n")
    texts = ["the king of babylon came", "and god said"]
    argv = ["score", "--target", server.address, "--model", "kjv3", *texts, "--bias", str(phrases)]
    assert main([*argv, "--bias-boost", "1.5", "--json"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["bias"] for r in records] == [1.5, 0.0]
    assert [r["bias_phrases"] for r in records] == [[0], []]
    for r in records:
        assert r["biased_log_prob"] == pytest.approx(r["log_prob"] + r["bias"])
    assert main([*argv, "--bias-boost", "1.5"]) == 0
    first = capsys.readouterr().out.splitlines()[0].split("\t")
    assert float(first[1]) == pytest.approx(float(first[0]) + 1.5, abs=1e-5)
