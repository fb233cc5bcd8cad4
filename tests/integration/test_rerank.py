"""Rerank and RerankStream against the real server of `conftest.py`, through the raw stub, the
Python client and the CLI.

The contract: combined = sum_k score_weights.get(k, 1) * scores[k] + lm_weight * lm_log_prob
+ length_bonus * length; `lm_log_prob` (nats) and `oov_count` as Score gives them, here checked
against KenLM's own scores of the same ARPA (log10 * ln 10); hypotheses best first, equal
scores by lower index. Until the server implements Rerank these tests fail with UNIMPLEMENTED.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from integration_data import MAX_TEXTS

from lmserve.client import (
    AsyncLmServeClient,
    LmServeClient,
    ModelNotFoundError,
    NBestHypothesis,
    NBestList,
    RerankedList,
)
from lmserve.client import nbest as nbest_io
from lmserve.client.reranking import combined_score, ranking
from lmserve.server.front.process.app import BackgroundServer
from lmserve.v1 import lm_service_pb2 as pb
from lmserve.v1 import lm_service_pb2_grpc

Stub = lm_service_pb2_grpc.LanguageModelServiceStub
LN10 = math.log(10)
NBEST = Path(__file__).resolve().parents[1] / "data" / "nbest" / "kjv-test.jsonl"


@pytest.fixture()
def client(server: BackgroundServer) -> Iterator[LmServeClient]:
    with LmServeClient(server.address, timeout=30) as c:
        yield c


@pytest.fixture(scope="module")
def kjv_lists() -> list[NBestList]:
    """Eight lists of the committed n-best set (about 240 hypotheses)."""
    with NBEST.open(encoding="utf-8") as stream:
        return list(nbest_io.read_jsonl(stream, str(NBEST)))[:8]


@pytest.fixture(scope="module")
def kenlm_kjv3(shared_data: Path) -> Any:
    """KenLM itself on the ARPA the server serves as `kjv3`: the independent reference."""
    import kenlm

    return kenlm.Model(str(shared_data / "kjv" / "kenlm" / "kjv.3gram.arpa"))


def _by_index(reranked: RerankedList) -> dict[int, Any]:
    return {h.index: h for h in reranked.hypotheses}


def _check_order(reranked: RerankedList, size: int) -> None:
    """Best first, ranks 0..n-1 in order, each index once, equal scores by lower index."""
    hyps = reranked.hypotheses
    assert [h.rank for h in hyps] == list(range(size))
    assert sorted(h.index for h in hyps) == list(range(size))
    for a, b in zip(hyps, hyps[1:], strict=False):
        assert (a.combined_score, -a.index) > (b.combined_score, -b.index)


# -- scores --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("bos", "eos"), [(True, True), (False, False)])
def test_ngram_lm_log_prob_equals_kenlm(
    client: LmServeClient, kjv_lists: list[NBestList], kenlm_kjv3: Any, bos: bool, eos: bool
) -> None:
    result = client.rerank("kjv3", kjv_lists, bos=bos, eos=eos)
    assert [r.id for r in result] == [nb.id for nb in kjv_lists]
    for nbest, reranked in zip(kjv_lists, result, strict=True):
        _check_order(reranked, len(nbest.hypotheses))
        for index, got in _by_index(reranked).items():
            text = nbest.hypotheses[index].display()
            expected = kenlm_kjv3.score(text, bos=bos, eos=eos) * LN10
            assert got.lm_log_prob == pytest.approx(expected, abs=1e-4), text
            assert got.oov_count == sum(w not in kenlm_kjv3 for w in text.split())


def test_lm_log_prob_and_tokens_equal_score(
    client: LmServeClient, kjv_lists: list[NBestList]
) -> None:
    texts = [h.display() for nb in kjv_lists[:3] for h in nb.hypotheses]
    scores = client.score("kjv3", texts)
    result = client.rerank("kjv3", kjv_lists[:3])
    flat = [
        _by_index(r)[i]
        for r, nb in zip(result, kjv_lists, strict=False)
        for i in range(len(nb.hypotheses))
    ]
    for got, score in zip(flat, scores, strict=True):
        assert got.lm_log_prob == pytest.approx(score.log_prob, abs=1e-9)
        assert got.oov_count == score.oov_count
    assert result.request_tokens == sum(s.token_count for s in scores)
    assert 0 < result.computed_tokens <= result.request_tokens


def test_formula_and_ranks_by_hand(client: LmServeClient, kenlm_kjv3: Any) -> None:
    texts = ["and god said", "and god sayeth unto moses", "and the lord spake", "zebra god"]
    acoustic = [-1.0, -4.5, -2.0, 3.0]
    extra = [0.5, 0.0, -1.0, 0.0]
    nbest = NBestList(
        "hand",
        [
            NBestHypothesis(t, scores={"acoustic": a, "extra": e})
            for t, a, e in zip(texts, acoustic, extra, strict=True)
        ],
    )
    weights, lm_weight, bonus = {"acoustic": 0.75}, 0.4, 0.3
    [reranked] = client.rerank(
        "kjv3", [nbest], score_weights=weights, lm_weight=lm_weight, length_bonus=bonus
    )
    expected = [
        0.75 * a + 1.0 * e + 0.4 * kenlm_kjv3.score(t) * LN10 + 0.3 * len(t.split())
        for t, a, e in zip(texts, acoustic, extra, strict=True)
    ]
    got = _by_index(reranked)
    for i, value in enumerate(expected):
        assert got[i].combined_score == pytest.approx(value, abs=1e-6)
        assert got[i].length == len(texts[i].split())
    assert [h.index for h in reranked.hypotheses] == sorted(range(4), key=lambda i: -expected[i])
    assert got[3].oov_count == 1
    _check_order(reranked, 4)


def test_lm_weight_absent_on_the_wire_means_one(stub: Stub) -> None:
    hyps = [pb.Hypothesis(text="and god said"), pb.Hypothesis(text="god and said")]
    request = pb.RerankRequest(model="kjv3", lists=[pb.NBestList(id="x", hypotheses=hyps)])
    assert not request.HasField("lm_weight")
    [answer] = stub.Rerank(request, timeout=30).lists
    for h in answer.hypotheses:
        assert h.combined_score == pytest.approx(h.lm_log_prob, abs=1e-9)


def test_ties_are_broken_by_lower_index(client: LmServeClient) -> None:
    same = NBestHypothesis("and god said", scores={"acoustic": -1.0})
    other = NBestHypothesis("and god said unto", scores={"acoustic": -1.0})
    [reranked] = client.rerank("kjv3", [NBestList("t", [other, same, same, same])], lm_weight=0.0)
    # lm_weight 0: all four score -1.0 exactly.
    assert [h.index for h in reranked.hypotheses] == [0, 1, 2, 3]
    [reranked] = client.rerank("kjv3", [NBestList("t", [other, same, same, same])])
    assert [h.index for h in reranked.hypotheses] == [1, 2, 3, 0]
    assert len({h.combined_score for h in reranked.hypotheses[:3]}) == 1


@pytest.mark.parametrize(
    ("unit", "lengths"),
    [
        # "In the beginning, Beth-el!": 4 whitespace words; the model's tokenizer (lowercase,
        # [a-z]+ runs) makes 5 tokens: in the beginning beth el; 26 characters.
        (pb.LENGTH_UNIT_WORDS, [4, 2, 0]),
        (pb.LENGTH_UNIT_UNSPECIFIED, [4, 2, 0]),
        (pb.LENGTH_UNIT_TOKENS, [5, 2, 0]),
        (pb.LENGTH_UNIT_CHARACTERS, [26, 7, 0]),
    ],
)
def test_length_units(stub: Stub, unit: int, lengths: list[int]) -> None:
    hyps = [
        pb.Hypothesis(text="In the beginning, Beth-el!"),
        pb.Hypothesis(tokens=pb.TokenList(tokens=["and", "god"])),
        pb.Hypothesis(tokens=pb.TokenList()),  # an empty hypothesis: only </s>
    ]
    request = pb.RerankRequest(
        model="kjv3",
        lists=[pb.NBestList(id="len", hypotheses=hyps)],
        lm_weight=0.0,
        length_bonus=2.5,
        length_unit=unit,
    )
    [answer] = stub.Rerank(request, timeout=30).lists
    got = {h.index: h for h in answer.hypotheses}
    assert [got[i].length for i in range(3)] == lengths
    assert [got[i].combined_score for i in range(3)] == pytest.approx([2.5 * n for n in lengths])


def test_local_recombination_equals_the_server(
    client: LmServeClient, kjv_lists: list[NBestList]
) -> None:
    """What rerank-tune relies on: one call at (1, 0), any weights recombined locally."""
    base = client.rerank("kjv3", kjv_lists, length_unit="characters")
    for weights, lm_weight, bonus in [({"acoustic": 0.5}, 0.3, 0.7), ({}, 2.0, -0.25)]:
        served = client.rerank(
            "kjv3",
            kjv_lists,
            score_weights=weights,
            lm_weight=lm_weight,
            length_bonus=bonus,
            length_unit="characters",
        )
        for nbest, at_base, reranked in zip(kjv_lists, base, served, strict=True):
            by_base = _by_index(at_base)
            for h in reranked.hypotheses:
                local = combined_score(
                    nbest.hypotheses[h.index].scores,
                    by_base[h.index].lm_log_prob,
                    by_base[h.index].length,
                    score_weights=weights,
                    lm_weight=lm_weight,
                    length_bonus=bonus,
                )
                assert h.combined_score == pytest.approx(local, abs=1e-9)
            order = ranking(
                nbest, at_base, score_weights=weights, lm_weight=lm_weight, length_bonus=bonus
            )
            assert [h.index for h in reranked.hypotheses] == order


# -- bad input: status and field path ------------------------------------------------------------


def _list(*hyps: pb.Hypothesis, list_id: str = "x") -> pb.NBestList:
    return pb.NBestList(id=list_id, hypotheses=list(hyps))


GOOD = pb.Hypothesis(text="and god said", scores={"acoustic": -1.0})
BAD_REQUESTS: list[tuple[str, dict[str, Any], grpc.StatusCode, str]] = [
    ("no lists", {"lists": []}, grpc.StatusCode.INVALID_ARGUMENT, "lists"),
    (
        "empty list",
        {"lists": [_list(GOOD), _list()]},
        grpc.StatusCode.INVALID_ARGUMENT,
        "lists[1].hypotheses",
    ),
    (
        "text and tokens",
        {"lists": [_list(GOOD, GOOD, pb.Hypothesis(text="a", tokens=pb.TokenList(tokens=["a"])))]},
        grpc.StatusCode.INVALID_ARGUMENT,
        "lists[0].hypotheses[2]",
    ),
    (
        "neither",
        {"lists": [_list(GOOD), _list(GOOD, pb.Hypothesis(scores={"a": 1.0}))]},
        grpc.StatusCode.INVALID_ARGUMENT,
        "lists[1].hypotheses[1]",
    ),
    (
        "NaN score",
        {"lists": [_list(GOOD, pb.Hypothesis(text="a", scores={"acoustic": math.nan}))]},
        grpc.StatusCode.INVALID_ARGUMENT,
        'lists[0].hypotheses[1].scores["acoustic"]',
    ),
    (
        "inf score",
        {"lists": [_list(pb.Hypothesis(text="a", scores={"lm2": -math.inf}))]},
        grpc.StatusCode.INVALID_ARGUMENT,
        'lists[0].hypotheses[0].scores["lm2"]',
    ),
    (
        "inf weight",
        {"lists": [_list(GOOD)], "score_weights": {"acoustic": math.inf}},
        grpc.StatusCode.INVALID_ARGUMENT,
        'score_weights["acoustic"]',
    ),
    (
        "NaN lm_weight",
        {"lists": [_list(GOOD)], "lm_weight": math.nan},
        grpc.StatusCode.INVALID_ARGUMENT,
        "lm_weight",
    ),
    (
        "inf length_bonus",
        {"lists": [_list(GOOD)], "length_bonus": math.inf},
        grpc.StatusCode.INVALID_ARGUMENT,
        "length_bonus",
    ),
    (
        "unknown length unit",
        {"lists": [_list(GOOD)], "length_unit": 99},
        grpc.StatusCode.INVALID_ARGUMENT,
        "length_unit",
    ),
    (
        "too many hypotheses",
        {"lists": [_list(*[GOOD] * (MAX_TEXTS + 1))]},
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "lists",
    ),
]


@pytest.mark.parametrize(
    ("fields", "code", "path"), [c[1:] for c in BAD_REQUESTS], ids=[c[0] for c in BAD_REQUESTS]
)
def test_bad_request_status_and_field_path(
    stub: Stub, fields: dict[str, Any], code: grpc.StatusCode, path: str
) -> None:
    with pytest.raises(grpc.RpcError) as info:
        stub.Rerank(pb.RerankRequest(model="kjv3", **fields), timeout=30)
    details = info.value.details() or ""
    assert info.value.code() == code, details
    assert details.startswith(path), details
    assert details[len(path)] not in "[.", f"{details!r} names a longer path than {path!r}"


def test_unknown_model_is_not_found(stub: Stub, client: LmServeClient) -> None:
    with pytest.raises(grpc.RpcError) as info:
        stub.Rerank(pb.RerankRequest(model="no-such-model", lists=[_list(GOOD)]), timeout=30)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert "no-such-model" in (info.value.details() or "")
    with pytest.raises(ModelNotFoundError):
        client.rerank("no-such-model", [{"id": "x", "hypotheses": [{"text": "a"}]}])


# -- RerankStream ----------------------------------------------------------------------------------


def test_stream_answers_in_order_like_unary(
    client: LmServeClient, stub: Stub, kjv_lists: list[NBestList]
) -> None:
    batches = [kjv_lists[:1], kjv_lists[1:4], kjv_lists[4:5], kjv_lists[5:]]
    streamed = list(client.rerank_stream("kjv3", batches, lm_weight=0.5, length_bonus=1.0))
    unary = [client.rerank("kjv3", b, lm_weight=0.5, length_bonus=1.0) for b in batches]
    assert streamed == unary
    assert [[r.id for r in s] for s in streamed] == [[nb.id for nb in b] for b in batches]


def test_stream_error_names_the_request_after_earlier_answers(stub: Stub) -> None:
    good = pb.RerankRequest(model="kjv3", lists=[_list(GOOD, list_id="first")])
    bad = pb.RerankRequest(
        model="kjv3", lists=[_list(GOOD), _list(pb.Hypothesis(text="a", scores={"s": math.nan}))]
    )
    answers = []
    with pytest.raises(grpc.RpcError) as info:
        for resp in stub.RerankStream(iter([good, good, bad, good]), timeout=30):
            answers.append(resp)
    assert [a.lists[0].id for a in answers] == ["first", "first"]
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (info.value.details() or "").startswith('requests[2].lists[1].hypotheses[0].scores["s"]')


def test_async_client_gives_the_same_answers(
    server: BackgroundServer, client: LmServeClient, kjv_lists: list[NBestList]
) -> None:
    async def calls() -> tuple[Any, list[Any]]:
        async with AsyncLmServeClient(server.address, timeout=30) as aclient:
            one = await aclient.rerank("kjv3", kjv_lists[:2], lm_weight=0.7)
            many = [a async for a in aclient.rerank_stream("kjv3", [kjv_lists[:1], kjv_lists[1:3]])]
            return one, many

    one, many = asyncio.run(calls())
    assert one == client.rerank("kjv3", kjv_lists[:2], lm_weight=0.7)
    assert many == list(client.rerank_stream("kjv3", [kjv_lists[:1], kjv_lists[1:3]]))


# -- the CLI end to end ----------------------------------------------------------------------------


def cli(*argv: str) -> int:
    from lmserve.server.cli import main

    return main(list(argv))


def test_cli_rerank_jsonl_and_1best(
    server: BackgroundServer,
    client: LmServeClient,
    kjv_lists: list[NBestList],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(nb.to_dict()) + "\n" for nb in kjv_lists[:5]))
    argv = ["rerank", "--target", server.address, "--model", "kjv3", "--batch-lists", "2"]
    weights = ["--weight", "acoustic=0.5", "--lm-weight", "0.8", "--length-bonus", "0.2"]
    assert cli(*argv, *weights, "--output", "1best", str(path)) == 0
    best = capsys.readouterr().out.splitlines()
    expected = client.rerank(
        "kjv3", kjv_lists[:5], score_weights={"acoustic": 0.5}, lm_weight=0.8, length_bonus=0.2
    )
    assert best == [
        nb.hypotheses[r.best.index].display() for nb, r in zip(kjv_lists, expected, strict=False)
    ]
    assert cli(*argv, *weights, str(path)) == 0  # the 1-best lines are the default
    assert capsys.readouterr().out.splitlines() == best
    assert cli(*argv, *weights, "--json", str(path)) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["id"] for r in records] == [nb.id for nb in kjv_lists[:5]]
    for record, reranked in zip(records, expected, strict=True):
        assert [h["index"] for h in record["hypotheses"]] == [h.index for h in reranked.hypotheses]
        assert record["hypotheses"][0]["lm_log_prob"] == reranked.best.lm_log_prob


def test_cli_rerank_srilm_files(
    server: BackgroundServer, kenlm_kjv3: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "utt1").write_text("-10.0 -3.0 3 and god said\n-9.5 -9.0 3 and god sad\n")
    (tmp_path / "utt2").write_text("NBestList1.0\n(-1000) the lord\n(-990) the lard\n")
    argv = ["rerank", "--target", server.address, "--model", "kjv3", "--format", "srilm", "--json"]
    assert (
        cli(*argv, "--weight", "recognizer_lm=0", str(tmp_path / "utt1"), str(tmp_path / "utt2"))
        == 0
    )
    first, second = (json.loads(line) for line in capsys.readouterr().out.splitlines())
    assert (first["id"], second["id"]) == ("utt1", "utt2")
    for record in (first, second):
        for h in record["hypotheses"]:
            lm = kenlm_kjv3.score(h["text"]) * LN10
            recognizer = h["scores"].get("recognizer", 0.0)
            acoustic = h["scores"].get("acoustic", 0.0)
            assert h["combined_score"] == pytest.approx(acoustic + recognizer + lm, abs=1e-4)


def test_cli_rerank_tune_beats_or_equals_acoustic_only(
    server: BackgroundServer,
    kjv_lists: list[NBestList],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import jiwer

    path = tmp_path / "dev.jsonl"
    path.write_text("".join(json.dumps(nb.to_dict()) + "\n" for nb in kjv_lists))
    argv = ["rerank-tune", "--target", server.address, "--model", "kjv3", "--json", str(path)]
    assert cli(*argv, "--grid-lm-weight", "0,0.5,1", "--grid-length-bonus", "0,1") == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == 7 and rows[-1]["lists"] == len(kjv_lists)
    refs = [nb.reference for nb in kjv_lists]
    acoustic_first = [
        max(nb.hypotheses, key=lambda h: h.scores["acoustic"]).display() for nb in kjv_lists
    ]
    assert rows[0] == {
        "lm_weight": 0.0,
        "length_bonus": 0.0,
        "wer": pytest.approx(jiwer.wer(refs, acoustic_first)),
    }
    assert rows[-1]["best"]["wer"] == min(r["wer"] for r in rows[:-1]) <= rows[0]["wer"]
