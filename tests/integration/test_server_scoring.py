"""Score, Perplexity and CorpusPerplexity through the server equal KenLM's own scores."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lmserve.v1 import lm_service_pb2 as pb
from lmserve.v1 import lm_service_pb2_grpc

LN10 = math.log(10.0)
Stub = lm_service_pb2_grpc.LanguageModelServiceStub


@pytest.fixture(scope="module")
def reference(shared_data: Path) -> list[dict[str, Any]]:
    lines = (shared_data / "kenlm-tests" / "reference.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def _cases(
    reference: list[dict[str, Any]], arpa: str, bos: bool, eos: bool
) -> list[dict[str, Any]]:
    return [r for r in reference if (r["model"], r["bos"], r["eos"]) == (arpa, bos, eos)]


@pytest.mark.parametrize(
    ("bos", "eos"), [(True, True), (False, True), (True, False), (False, False)]
)
@pytest.mark.parametrize(
    ("model", "arpa"),
    [("test", "test.arpa"), ("test-nounk", "test_nounk.arpa"), ("test-arpa", "test.arpa")],
)
def test_score_equals_kenlm(
    stub: Stub, reference: list[dict[str, Any]], model: str, arpa: str, bos: bool, eos: bool
) -> None:
    cases = _cases(reference, arpa, bos, eos)
    response = stub.Score(
        pb.ScoreRequest(
            model=model,
            texts=[c["sentence"] for c in cases],
            options=pb.ScoreOptions(bos=bos, eos=eos),
            return_tokens=True,
        )
    )
    assert response.model == model
    assert len(response.results) == len(cases)
    for case, result in zip(cases, response.results, strict=True):
        tokens = case["tokens"]
        assert result.log_prob == pytest.approx(case["total_log10"] * LN10, abs=1e-4)
        assert result.token_count == len(tokens)
        assert result.oov_count == sum(t["oov"] for t in tokens)
        details = result.details
        assert list(details.log_probs) == pytest.approx(
            [t["log10"] * LN10 for t in tokens], abs=1e-4
        )
        assert math.fsum(details.log_probs) == pytest.approx(result.log_prob, abs=1e-6)
        assert list(details.oov) == [t["oov"] for t in tokens]
        assert list(details.ngram_lengths) == [t["ngram_length"] for t in tokens]
        words = case["sentence"].split() + (["</s>"] if eos else [])
        assert list(details.tokens) == words
        assert len(details.token_ids) == len(words)


def test_totals_only_without_return_tokens(stub: Stub) -> None:
    result = stub.Score(pb.ScoreRequest(model="test", texts=["looking on a little"])).results[0]
    assert not result.HasField("details")
    assert result.token_count == 5  # four words and </s>


def test_options_default_to_bos_and_eos(stub: Stub) -> None:
    text = ["looking on a little more loin"]
    default = stub.Score(pb.ScoreRequest(model="test", texts=text)).results[0]
    explicit = stub.Score(
        pb.ScoreRequest(model="test", texts=text, options=pb.ScoreOptions(bos=True, eos=True))
    ).results[0]
    no_eos = stub.Score(
        pb.ScoreRequest(model="test", texts=text, options=pb.ScoreOptions(eos=False))
    ).results[0]
    assert default.log_prob == explicit.log_prob
    assert no_eos.token_count == default.token_count - 1
    assert no_eos.log_prob > default.log_prob


def test_token_lists_and_empty_text(stub: Stub) -> None:
    texts = ["looking on a little", ""]
    by_text = stub.Score(pb.ScoreRequest(model="test", texts=texts)).results
    by_tokens = stub.Score(
        pb.ScoreRequest(model="test", token_lists=[pb.TokenList(tokens=t.split()) for t in texts])
    ).results
    assert [r.log_prob for r in by_text] == [r.log_prob for r in by_tokens]
    empty = by_text[1]
    assert empty.token_count == 1 and empty.oov_count == 0  # just </s>
    # P(</s> | <s>) backs off: log10 P(</s>) + backoff(<s>) from test.arpa's unigrams.
    assert empty.log_prob == pytest.approx((-1.029493 - 0.4149733) * LN10, abs=1e-4)


def test_kjv_tokenizer_applies_the_manifest_rule(stub: Stub) -> None:
    raw, clean = "In the Beginning, God created...", "in the beginning god created"
    results = stub.Score(pb.ScoreRequest(model="kjv3", texts=[raw, clean])).results
    assert results[0].log_prob == results[1].log_prob
    assert results[0].token_count == 6


def _expected_stats(cases: list[dict[str, Any]]) -> dict[str, float]:
    tokens = [t for c in cases for t in c["tokens"]]
    total = math.fsum(c["total_log10"] for c in cases) * LN10
    in_vocab = math.fsum(t["log10"] for t in tokens if not t["oov"]) * LN10
    oov = sum(t["oov"] for t in tokens)
    return {
        "log_prob": total,
        "token_count": len(tokens),
        "oov_count": oov,
        "text_count": len(cases),
        "perplexity": math.exp(-total / len(tokens)),
        "log_prob_excluding_oov": in_vocab,
        "perplexity_excluding_oov": math.exp(-in_vocab / (len(tokens) - oov)),
    }


def _assert_stats(stats: pb.PerplexityStats, expected: dict[str, float]) -> None:
    for field, value in expected.items():
        assert getattr(stats, field) == pytest.approx(value, rel=1e-6, abs=1e-4), field


@pytest.mark.parametrize("eos", [True, False])
def test_perplexity_equals_reference(
    stub: Stub, reference: list[dict[str, Any]], eos: bool
) -> None:
    cases = _cases(reference, "test.arpa", True, eos)
    expected = _expected_stats(cases)
    assert expected["oov_count"] > 0  # the reference mixes in OOV words
    response = stub.Perplexity(
        pb.PerplexityRequest(
            model="test",
            texts=[c["sentence"] for c in cases],
            options=pb.ScoreOptions(eos=eos),
        )
    )
    assert response.model == "test"
    _assert_stats(response.stats, expected)


def test_corpus_perplexity_accumulates_batches(stub: Stub, reference: list[dict[str, Any]]) -> None:
    cases = _cases(reference, "test_nounk.arpa", True, True)

    def batches() -> Iterator[pb.CorpusPerplexityRequest]:
        yield pb.CorpusPerplexityRequest(model="test-nounk")  # header only
        for start in range(0, len(cases), 50):
            chunk = cases[start : start + 50]
            # Later messages may repeat the model or leave it empty.
            yield pb.CorpusPerplexityRequest(
                model="test-nounk" if start else "",
                token_lists=[pb.TokenList(tokens=c["sentence"].split()) for c in chunk],
            )

    response = stub.CorpusPerplexity(batches())
    assert response.model == "test-nounk"
    _assert_stats(response.stats, _expected_stats(cases))
