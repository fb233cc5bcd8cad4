"""The Python client and the client CLI against the real server of `conftest.py`.

Scores must equal the server's own answer through the raw generated stub and KenLM's reference
scores (`../shared/data/kenlm-tests/reference.jsonl`, log10 * ln 10); failures must arrive as the
client's exceptions and as non-zero exit codes with one line on stderr.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections import defaultdict
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from integration_data import MAX_TEXTS

from lmserve.client import (
    AsyncLmServeClient,
    InvalidArgumentError,
    LmServeClient,
    ModelNotFoundError,
    PerplexityStats,
    TextScore,
    UnavailableError,
)
from lmserve.client.types import HealthStatus
from lmserve.server.front.process.app import BackgroundServer
from lmserve.v1 import lm_service_pb2 as pb
from lmserve.v1 import lm_service_pb2_grpc

LN10 = math.log(10)
# Sentences of KenLM's test model's words, one OOV ("zebra") and an empty one.
TEXTS = ["looking on a little more loin", "in the zebra", "", "higher . . ,", "also call for"]
Reference = dict[tuple[bool, bool], list[dict[str, Any]]]


@pytest.fixture(scope="module")
def target(server: BackgroundServer) -> str:
    return server.address


@pytest.fixture()
def client(target: str) -> Iterator[LmServeClient]:
    with LmServeClient(target, timeout=10) as c:
        yield c


@pytest.fixture(scope="module")
def reference(shared_data: Path) -> Reference:
    """KenLM's scores of `test.arpa` (served as model "test"), grouped by (bos, eos)."""
    groups: Reference = defaultdict(list)
    with (shared_data / "kenlm-tests" / "reference.jsonl").open(encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            if row["model"] == "test.arpa":
                groups[(row["bos"], row["eos"])].append(row)
    assert len(groups) == 4
    return groups


# -- models ------------------------------------------------------------------------------------


def test_list_and_get_models(
    client: LmServeClient, stub: lm_service_pb2_grpc.LanguageModelServiceStub
) -> None:
    models = {m.name: m for m in client.list_models()}
    raw = {m.name: m for m in stub.ListModels(pb.ListModelsRequest(), timeout=10).models}
    assert list(models) == list(raw)
    assert {n for n, m in models.items() if m.ready} == {
        n for n, m in raw.items() if m.state == pb.MODEL_STATE_READY
    }
    info = client.get_model("kjv3")
    assert info == models["kjv3"]
    assert (info.kind, info.format, info.state, info.order) == ("ngram", "ngram_binary", "ready", 3)
    assert info.vocab_size == raw["kjv3"].vocab_size > 0
    assert info.tokenizer.lowercase and info.tokenizer.kind == "word"
    assert {"score", "perplexity"} <= info.capabilities
    assert dict(info.provenance.metrics) == dict(raw["kjv3"].provenance.metrics)
    assert models["missing-file"].state == "failed" and models["missing-file"].load_error


# -- scoring: client == raw stub == KenLM --------------------------------------------------------


@pytest.mark.parametrize(
    ("bos", "eos"), [(True, True), (False, True), (True, False), (False, False)]
)
def test_score_equals_raw_stub_and_kenlm(
    client: LmServeClient,
    stub: lm_service_pb2_grpc.LanguageModelServiceStub,
    reference: Reference,
    bos: bool,
    eos: bool,
) -> None:
    rows = reference[(bos, eos)]
    sentences = [r["sentence"] for r in rows]
    totals = client.score("test", sentences, bos=bos, eos=eos)
    raw = stub.Score(
        pb.ScoreRequest(model="test", texts=sentences, options=pb.ScoreOptions(bos=bos, eos=eos)),
        timeout=10,
    ).results
    assert [(r.log_prob, r.token_count, r.oov_count) for r in totals] == [
        (r.log_prob, r.token_count, r.oov_count) for r in raw
    ]
    detailed = client.score("test", sentences, bos=bos, eos=eos, return_tokens=True)
    for row, total, result in zip(rows, totals, detailed, strict=True):
        assert total.tokens is None
        assert result.log_prob == pytest.approx(row["total_log10"] * LN10, abs=1e-4)
        assert (result.log_prob, result.token_count, result.oov_count) == (
            total.log_prob,
            total.token_count,
            total.oov_count,
        )
        assert result.tokens is not None
        assert result.token_count == len(row["tokens"]) == len(result.tokens)
        assert result.oov_count == sum(t["oov"] for t in row["tokens"])
        words = row["sentence"].split() + (["</s>"] if eos else [])
        assert [t.token for t in result.tokens] == words
        for ours, kenlm in zip(result.tokens, row["tokens"], strict=True):
            assert ours.log_prob == pytest.approx(kenlm["log10"] * LN10, abs=1e-4)
            assert (ours.ngram_length, ours.oov) == (kenlm["ngram_length"], kenlm["oov"])


def test_token_lists_score_like_texts(client: LmServeClient) -> None:
    as_texts = client.score("test", TEXTS, return_tokens=True)
    as_lists = client.score("test", [t.split() for t in TEXTS], return_tokens=True)
    assert as_lists == as_texts


def test_perplexity_and_corpus_perplexity(client: LmServeClient, reference: Reference) -> None:
    rows = reference[(True, True)]
    sentences = [r["sentence"] for r in rows]
    stats = client.perplexity("test", sentences)
    tokens = [t for r in rows for t in r["tokens"]]
    log_prob = sum(t["log10"] for t in tokens) * LN10
    kept = [t["log10"] for t in tokens if not t["oov"]]
    assert (stats.text_count, stats.token_count) == (len(rows), len(tokens))
    assert stats.oov_count == len(tokens) - len(kept) > 0
    assert stats.log_prob == pytest.approx(log_prob, abs=1e-3)
    assert stats.perplexity == pytest.approx(math.exp(-log_prob / len(tokens)), rel=1e-6)
    assert stats.perplexity_excluding_oov == pytest.approx(
        math.exp(-sum(kept) * LN10 / len(kept)), rel=1e-6
    )

    streamed = client.corpus_perplexity(
        "test", (sentences[i : i + 40] for i in range(0, len(sentences), 40))
    )
    assert (streamed.text_count, streamed.token_count, streamed.oov_count) == (
        stats.text_count,
        stats.token_count,
        stats.oov_count,
    )
    assert streamed.log_prob == pytest.approx(stats.log_prob, abs=1e-9)
    assert streamed.perplexity_excluding_oov == pytest.approx(stats.perplexity_excluding_oov)


def test_async_client_gives_the_same_answers(target: str, client: LmServeClient) -> None:
    async def ask() -> tuple[list[TextScore], PerplexityStats, HealthStatus]:
        async with AsyncLmServeClient(target, timeout=10) as aclient:

            async def batches() -> AsyncIterator[list[str]]:
                for i in range(0, len(TEXTS), 2):
                    yield TEXTS[i : i + 2]

            return (
                await aclient.score("test", TEXTS, return_tokens=True),
                await aclient.corpus_perplexity("test", batches()),
                await aclient.health("test"),
            )

    scores, corpus, health = asyncio.run(ask())
    assert scores == client.score("test", TEXTS, return_tokens=True)
    assert corpus.log_prob == pytest.approx(client.perplexity("test", TEXTS).log_prob, abs=1e-9)
    assert corpus.token_count == sum(len(t.split()) + 1 for t in TEXTS)
    assert health.serving


# -- errors and health ---------------------------------------------------------------------------


def test_unknown_model_is_model_not_found(client: LmServeClient) -> None:
    with pytest.raises(ModelNotFoundError) as info:
        client.score("no-such-model", ["the cat"])
    assert info.value.code is grpc.StatusCode.NOT_FOUND
    assert "no-such-model" in info.value.message
    with pytest.raises(ModelNotFoundError):
        client.get_model("no-such-model")


def test_too_many_texts_is_invalid_argument(client: LmServeClient) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        client.score("test", ["the cat"] * (MAX_TEXTS + 1))
    assert info.value.code is grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.message


def test_failed_model_is_unavailable(client: LmServeClient) -> None:
    with pytest.raises(UnavailableError):
        client.score("missing-file", ["the cat"])


def test_health(client: LmServeClient) -> None:
    assert client.health().serving
    assert client.health("test").serving
    assert client.health("missing-file").status == "NOT_SERVING"
    with pytest.raises(ModelNotFoundError):
        client.health("no-such-model")


# -- the CLI -------------------------------------------------------------------------------------


def cli(*argv: str) -> int:
    from lmserve.server.cli import main

    return main(list(argv))


def test_cli_score(target: str, client: LmServeClient, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli("score", "--target", target, "--model", "test", *TEXTS[:3]) == 0
    lines = capsys.readouterr().out.splitlines()
    expected = client.score("test", TEXTS[:3])
    assert len(lines) == 3
    for line, text, result in zip(lines, TEXTS[:3], expected, strict=True):
        log_prob, tokens, oovs, shown = line.split("\t")
        assert float(log_prob) == pytest.approx(result.log_prob, abs=1e-6)
        assert (int(tokens), int(oovs), shown) == (result.token_count, result.oov_count, text)


def test_cli_score_file_json_tokens(
    target: str, client: LmServeClient, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    argv = ["score", "--target", target, "--model", "test", "--no-bos", "--json", "--tokens"]
    assert cli(*argv, "--batch-size", "4", "--file", str(corpus)) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    expected = client.score("test", TEXTS, bos=False, return_tokens=True)
    assert [r["text"] for r in rows] == TEXTS
    for row, result in zip(rows, expected, strict=True):
        assert row["log_prob"] == result.log_prob
        assert result.tokens is not None
        assert [t["log_prob"] for t in row["tokens"]] == [t.log_prob for t in result.tokens]


def test_cli_ppl(
    target: str, client: LmServeClient, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TEXTS * 3) + "\n", encoding="utf-8")
    assert cli("ppl", "--target", target, "--model", "test", "--batch-size", "5", str(corpus)) == 0
    out = capsys.readouterr().out
    stats = client.perplexity("test", TEXTS * 3)
    assert f"{stats.perplexity:.4f}" in out
    assert f"{stats.perplexity_excluding_oov:.4f}" in out
    assert f"tokens: {stats.token_count}" in out and "</s>" in out

    assert cli("ppl", "--target", target, "--model", "test", "--json", str(corpus)) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["perplexity"] == pytest.approx(stats.perplexity)
    assert data["text_count"] == 3 * len(TEXTS)


def test_cli_ppl_matches_kenlm_on_kjv(
    target: str, shared_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import kenlm

    kjv = shared_data / "kjv"
    lines = (kjv / "test.txt").read_text(encoding="utf-8").splitlines()[:300]
    corpus = tmp_path / "kjv.txt"
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    argv = ["ppl", "--target", target, "--model", "kjv3", "--json", "--batch-size", "64"]
    assert cli(*argv, str(corpus)) == 0
    ours = json.loads(capsys.readouterr().out)
    model = kenlm.Model(str(kjv / "kenlm" / "kjv.3gram.arpa"))
    scored = [s for line in lines for s in model.full_scores(line)]
    log10 = sum(p for p, _, _ in scored)
    kept = [p for p, _, oov in scored if not oov]
    assert (ours["text_count"], ours["token_count"]) == (len(lines), len(scored))
    assert ours["oov_count"] == len(scored) - len(kept)
    assert ours["perplexity"] == pytest.approx(10 ** (-log10 / len(scored)), rel=1e-5)
    assert ours["perplexity_excluding_oov"] == pytest.approx(
        10 ** (-sum(kept) / len(kept)), rel=1e-5
    )


def test_cli_models_and_health(target: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli("models", "--target", target) == 0
    out = capsys.readouterr().out
    assert "kjv3" in out and "missing-file" in out
    assert any(line.startswith("missing-file: ") for line in out.splitlines())  # its load error
    assert cli("models", "--target", target, "--json", "test") == 0
    assert json.loads(capsys.readouterr().out)["order"] == 5
    assert cli("health", "--target", target) == 0
    assert cli("health", "--target", target, "--model", "test") == 0
    assert cli("health", "--target", target, "--model", "missing-file") != 0
    assert "NOT_SERVING" in capsys.readouterr().out


def test_cli_errors_exit_non_zero_with_one_line(
    target: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli("score", "--target", target, "--model", "nope", "the cat") != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "NOT_FOUND" in err and "nope" in err
    assert cli("ppl", "--target", target, "--model", "test", str(tmp_path / "missing.txt")) != 0
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
