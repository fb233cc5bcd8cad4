"""Building RerankRequests from the client's n-best types and dicts, and reading the answers."""

from __future__ import annotations

import math
from typing import Any

import pytest

from lmserve.client import NBestHypothesis, NBestInputError, NBestList, RerankedLists
from lmserve.client._requests import rerank_request
from lmserve.v1 import lm_service_pb2 as pb


def _lists() -> list[Any]:
    return [
        NBestList("u1", [NBestHypothesis("a b", scores={"acoustic": -1.5}), NBestHypothesis("")]),
        {"id": "u2", "hypotheses": [{"tokens": ["c", "d"], "scores": {"acoustic": 2, "x": 0.5}}]},
    ]


def test_request_carries_every_field() -> None:
    request = rerank_request(
        "m",
        _lists(),
        score_weights={"acoustic": 0.25},
        lm_weight=0.5,
        length_bonus=-1.0,
        length_unit="characters",
        bos=False,
        eos=True,
    )
    assert request.model == "m"
    assert [nb.id for nb in request.lists] == ["u1", "u2"]
    first, empty = request.lists[0].hypotheses
    assert first.text == "a b" and not first.HasField("tokens")
    assert dict(first.scores) == {"acoustic": -1.5}
    # An empty text travels as an empty token list: proto3 cannot send text="" as "set".
    assert empty.HasField("tokens") and list(empty.tokens.tokens) == [] and empty.text == ""
    [tokens] = request.lists[1].hypotheses
    assert list(tokens.tokens.tokens) == ["c", "d"]
    assert dict(tokens.scores) == {"acoustic": 2.0, "x": 0.5}
    assert dict(request.score_weights) == {"acoustic": 0.25}
    assert request.HasField("lm_weight") and request.lm_weight == 0.5
    assert request.length_bonus == -1.0
    assert request.length_unit == pb.LENGTH_UNIT_CHARACTERS
    assert (request.options.bos, request.options.eos) == (False, True)


def test_defaults_send_lm_weight_one_and_words() -> None:
    request = rerank_request("m", _lists())
    assert request.HasField("lm_weight") and request.lm_weight == 1.0
    assert request.length_unit == pb.LENGTH_UNIT_WORDS
    assert (request.options.bos, request.options.eos) == (True, True)
    assert rerank_request("m", _lists(), length_unit="tokens").length_unit == (
        pb.LENGTH_UNIT_TOKENS
    )


BAD_INPUTS: list[tuple[dict[str, Any], str]] = [
    (
        {"lists": [{"id": "x", "hypotheses": [{"text": "a", "tokens": ["a"]}]}]},
        "lists[0].hypotheses[0]: set exactly one of text and tokens",
    ),
    (
        {"lists": [_lists()[0], {"id": "x", "hypotheses": [{"scores": {}}]}]},
        "lists[1].hypotheses[0]: set exactly one of text and tokens",
    ),
    (
        {
            "lists": [
                {
                    "id": "x",
                    "hypotheses": [{"text": "a"}, {"text": "b", "scores": {"ac": math.nan}}],
                }
            ]
        },
        'lists[0].hypotheses[1].scores["ac"]: must be finite',
    ),
    (
        {"lists": [{"id": "x", "hypotheses": [{"text": "a", "scores": {"ac": "1"}}]}]},
        'lists[0].hypotheses[0].scores["ac"]: must be a number',
    ),
    (
        {"lists": [{"id": "x", "hypotheses": [{"text": "a", "scores": {"ac": True}}]}]},
        'lists[0].hypotheses[0].scores["ac"]: must be a number',
    ),
    (
        {"lists": [{"id": "x", "hypotheses": [{"text": "a", "score": {"ac": 1}}]}]},
        "lists[0].hypotheses[0].score: unknown field",
    ),
    (
        {"lists": [{"id": "x", "hypotheses": [{"tokens": "a b"}]}]},
        "lists[0].hypotheses[0].tokens: must be a list of strings",
    ),
    (
        {"lists": [{"id": "x", "hypotheses": [{"tokens": ["a", 3]}]}]},
        "lists[0].hypotheses[0].tokens[1]: must be a string",
    ),
    ({"lists": [{"id": "x", "hypotheses": "a b"}]}, "lists[0].hypotheses: must be a list"),
    (
        {"lists": [NBestList("x", [NBestHypothesis(text=None)])]},
        "lists[0].hypotheses[0]: set exactly one of text and tokens",
    ),
    ({"lists": [NBestList("x", ["a b"])]}, "lists[0].hypotheses[0]: must be an NBestHypothesis"),
    (
        {"lists": [NBestList("x", [NBestHypothesis("a", scores={"ac": -math.inf})])]},
        'lists[0].hypotheses[0].scores["ac"]: must be finite',
    ),
    (
        {"lists": [], "score_weights": {"acoustic": math.inf}},
        'score_weights["acoustic"]: must be finite',
    ),
    ({"lists": [], "lm_weight": math.nan}, "lm_weight: must be finite"),
    ({"lists": [], "length_bonus": math.inf}, "length_bonus: must be finite"),
    ({"lists": [], "length_unit": "syllables"}, "length_unit: must be one of"),
    ({"lists": "not lists"}, "lists: pass a sequence"),
]


@pytest.mark.parametrize(("kwargs", "message"), BAD_INPUTS)
def test_bad_input_names_the_field(kwargs: dict[str, Any], message: str) -> None:
    lists = kwargs.pop("lists")
    with pytest.raises(NBestInputError) as info:
        rerank_request("m", lists, **kwargs)
    assert str(info.value).startswith(message)
    assert info.value.field == message.split(":")[0]


def test_reranked_lists_from_proto() -> None:
    msg = pb.RerankResponse(
        model="m",
        request_tokens=9,
        computed_tokens=7,
        lists=[
            pb.RerankedList(
                id="u1",
                hypotheses=[
                    pb.RerankedHypothesis(
                        index=1, rank=0, lm_log_prob=-2.5, combined_score=-3.0, length=2
                    ),
                    pb.RerankedHypothesis(
                        index=0,
                        rank=1,
                        lm_log_prob=-4.0,
                        combined_score=-5.5,
                        length=3,
                        oov_count=1,
                    ),
                ],
            )
        ],
    )
    lists = RerankedLists.from_proto(msg)
    assert isinstance(lists, list) and len(lists) == 1
    assert (lists.model, lists.request_tokens, lists.computed_tokens) == ("m", 9, 7)
    [answer] = lists
    assert answer.id == "u1" and answer.best.index == 1
    assert [
        (h.index, h.rank, h.lm_log_prob, h.combined_score, h.length, h.oov_count)
        for h in answer.hypotheses
    ] == [(1, 0, -2.5, -3.0, 2, 0), (0, 1, -4.0, -5.5, 3, 1)]


def test_nbest_list_round_trips_through_its_dict() -> None:
    data = {
        "id": "u9",
        "reference": "a b",
        "hypotheses": [
            {"text": "a b", "scores": {"acoustic": -1.0}},
            {"tokens": ["a"], "scores": {}},
        ],
    }
    nbest = NBestList.from_dict(data)
    assert nbest.to_dict() == data
    assert nbest.reference == "a b" and nbest.hypotheses[1].display() == "a"
