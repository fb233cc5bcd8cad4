"""Reading n-best lists (JSON lines, SRILM's three formats) and writing reranked ones."""

from __future__ import annotations

import gzip
import io
import json
import math
from pathlib import Path

import pytest

from lmserve.client import NBestInputError, RerankedHypothesis, RerankedList
from lmserve.client import nbest as io_


# ln(p) of a bytelog b, from its definition: b = log base 1.0001 of p, divided by 1024.
def bytelog_nats(b: float) -> float:
    return math.log(1.0001 ** (b * 1024))


def test_jsonl_keeps_references_and_skips_blank_lines() -> None:
    text = (
        '{"id": "a", "reference": "x y", "hypotheses": [{"text": "x y", "scores": {"ac": -1}}]}\n'
        "\n"
        '{"id": 7, "hypotheses": [{"tokens": ["z"]}], "other": 1}\n'
    )
    first, second = io_.read_jsonl(io.StringIO(text), "f.jsonl")
    assert (first.id, first.reference, first.hypotheses[0].text) == ("a", "x y", "x y")
    assert dict(first.hypotheses[0].scores) == {"ac": -1.0}
    assert (second.id, second.reference, second.hypotheses[0].tokens) == ("7", None, ("z",))


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "f.jsonl:2: not JSON"),
        (
            '{"id": "a", "hypotheses": [{"text": "x", "scores": {"ac": NaN}}]}',
            'f.jsonl:2.hypotheses[0].scores["ac"]: must be finite',
        ),
        (
            '{"id": "a", "hypotheses": [{"text": "x"}, {}]}',
            "f.jsonl:2.hypotheses[1]: set exactly one of text and tokens",
        ),
        ("[1, 2]", "f.jsonl:2: must be an object"),
    ],
)
def test_jsonl_errors_name_line_and_field(line: str, message: str) -> None:
    good = '{"id": "ok", "hypotheses": [{"text": "x"}]}\n'
    with pytest.raises(NBestInputError) as info:
        list(io_.read_jsonl(io.StringIO(good + line + "\n"), "f.jsonl"))
    assert str(info.value).startswith(message)


def test_srilm_version1_bytelog_to_nats() -> None:
    text = "NBestList1.0\n(-2500) <s> the cat -pau- sat </s>\n(-2710) the hat sat\n"
    nbest = io_.read_srilm(io.StringIO(text), "utt1")
    assert nbest.id == "utt1"
    assert [h.text for h in nbest.hypotheses] == ["the cat sat", "the hat sat"]
    assert nbest.hypotheses[0].scores["recognizer"] == pytest.approx(bytelog_nats(-2500))
    assert nbest.hypotheses[1].scores["recognizer"] == pytest.approx(bytelog_nats(-2710))


def test_srilm_version2_sums_word_scores() -> None:
    text = (
        "NBestList2.0\n"
        "(-300) <s> ( st: 0.00 et: 0.10 g: 0 a: -10 ) the ( st: 0.10 et: 0.30 g: -120 a: -50 )"
        " cat ( st: 0.30 et: 0.70 g: -80 a: -40 ) </s> ( st: 0.70 et: 0.71 g: -5 a: 5 )\n"
    )
    [hyp] = io_.read_srilm(io.StringIO(text), "u").hypotheses
    assert hyp.text == "the cat"
    assert hyp.scores["acoustic"] == pytest.approx(bytelog_nats(-10 - 50 - 40 + 5))
    assert hyp.scores["recognizer_lm"] == pytest.approx(bytelog_nats(-120 - 80 - 5))


def test_srilm_version3_log10_to_nats() -> None:
    text = "-120.5 -20.25 3 and god said\n-119.0 -25.0 2 and good\n"
    first, second = io_.read_srilm(io.StringIO(text), "u").hypotheses
    assert first.text == "and god said" and second.text == "and good"
    assert first.scores["acoustic"] == pytest.approx(math.log(10**-120.5))
    assert first.scores["recognizer_lm"] == pytest.approx(-20.25 * math.log(10))
    assert second.scores["acoustic"] == pytest.approx(-119.0 * 2.302585092994046)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("NBestList1.0\n-25 the cat\n", "f:2: expected a line `(score)"),
        ("NBestList1.0\n(abc) the cat\n", "f:2: expected a number"),
        ("NBestList2.0\n(-3) the cat ( st: 0 et: 1 g: -1 a: -2 )\n", "f:2: word 'the' has no"),
        ("NBestList2.0\n(-3) the ( st: 0 et: 1 a: -2 )\n", "f:2: group after 'the' lacks"),
        ("NBestList3.0\n", "f:1: unknown n-best format"),
        ("-1.0 x\n", "f:1: expected a line `ascore lscore nwords"),
        ("-1.0 inf 1 x\n", "f:1: must be finite"),
    ],
)
def test_srilm_errors_name_file_and_line(text: str, message: str) -> None:
    with pytest.raises(NBestInputError) as info:
        io_.read_srilm(io.StringIO(text), "u", "f")
    assert str(info.value).startswith(message)


def test_srilm_files_gz_and_file_lists(tmp_path: Path) -> None:
    (tmp_path / "nb").mkdir()
    with gzip.open(tmp_path / "nb" / "utt2.gz", "wt", encoding="utf-8") as f:
        f.write("NBestList1.0\n(-10) b\n")
    (tmp_path / "nb" / "utt1").write_text("-1 -2 1 a\n", encoding="utf-8")
    listing = tmp_path / "list.txt"
    listing.write_text("nb/utt1\n\nnb/utt2.gz\n", encoding="utf-8")
    files = io_.read_file_list(listing)
    lists = list(io_.read_srilm_files(files))
    assert [(nb.id, nb.hypotheses[0].text) for nb in lists] == [("utt1", "a"), ("utt2", "b")]


def test_writers_put_best_first_with_texts() -> None:
    [nbest] = io_.read_jsonl(
        io.StringIO(
            '{"id": "u", "reference": "b", "hypotheses": '
            '[{"text": "a", "scores": {"ac": -1}}, {"tokens": ["b"], "scores": {"ac": -2}}]}\n'
        )
    )
    reranked = RerankedList(
        "u",
        (RerankedHypothesis(1, 0, -0.5, -2.5, 1, 0), RerankedHypothesis(0, 1, -3.0, -4.0, 1, 1)),
    )
    out = io.StringIO()
    io_.write_jsonl(out, nbest, reranked)
    record = json.loads(out.getvalue())
    assert record["id"] == "u" and record["reference"] == "b"
    assert [(h["index"], h["rank"], h["text"]) for h in record["hypotheses"]] == [
        (1, 0, "b"),
        (0, 1, "a"),
    ]
    assert record["hypotheses"][1] == {
        "index": 0,
        "rank": 1,
        "text": "a",
        "combined_score": -4.0,
        "lm_log_prob": -3.0,
        "length": 1,
        "oov_count": 1,
        "scores": {"ac": -1.0},
    }
    best = io.StringIO()
    io_.write_1best(best, nbest, reranked)
    assert best.getvalue() == "b\n"
