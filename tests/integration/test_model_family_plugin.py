"""A kind of model is one family module: the tests' own unigram family (tests/unigram_family.py),
named in the `model_families` setting, is served through every RPC by a real server whose
engine worker imports it, with no other module changed. Every figure is checked against the
counts by hand."""

from __future__ import annotations

import math
import os
import queue
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from prometheus_client import CollectorRegistry
from unigram_family import log_probs_of, vocabulary_of, write_unigram_folder

from lmserve.server.front.process.app import BackgroundServer, start_background_server
from lmserve.server.settings import load_settings
from lmserve.v1 import lm_service_pb2 as pb
from lmserve.v1 import lm_service_pb2_grpc

TESTS = Path(__file__).resolve().parents[1]
COUNTS = {
    "the": 60,
    "lord": 20,
    "god": 15,
    "said": 12,
    "thee": 9,
    "then": 6,
    "there": 4,
    "light": 3,
    "</s>": 10,
}
VOCAB = vocabulary_of(COUNTS)
LOG_PROBS = log_probs_of(COUNTS, VOCAB)
MODEL = "uni"


def lp(word: str) -> float:
    return float(LOG_PROBS[VOCAB.index.get(word, VOCAB.unk_id)])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundServer]:
    repository = tmp_path_factory.mktemp("unigram-repo")
    write_unigram_folder(repository / MODEL, COUNTS, MODEL)
    # The engine worker is a fresh interpreter: it finds the family where the front does.
    previous = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), previous]))
    settings = load_settings(
        {
            "model_repository": repository,
            "host": "127.0.0.1",
            "port": 0,
            "metrics_enabled": False,
            "model_families": ["unigram_family:FAMILY"],
            "complete_cache_weight": 0.0,  # the model's own answers, no session cache mixed in
        }
    )
    running = start_background_server(settings, registry=CollectorRegistry())
    try:
        yield running
    finally:
        running.stop(grace=1.0)
        if previous is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = previous


@pytest.fixture(scope="module")
def stub(server: BackgroundServer) -> Iterator[lm_service_pb2_grpc.LanguageModelServiceStub]:
    with grpc.insecure_channel(server.address) as channel:
        yield lm_service_pb2_grpc.LanguageModelServiceStub(channel)


def test_get_model_reports_the_family_model_as_ready(
    stub: lm_service_pb2_grpc.LanguageModelServiceStub,
) -> None:
    info = stub.GetModel(pb.GetModelRequest(model=MODEL)).model
    assert info.state == pb.MODEL_STATE_READY, info.load_error
    assert info.kind == pb.MODEL_KIND_UNSPECIFIED  # a kind the proto does not name yet
    assert info.order == 1  # the family's own GetModel extra
    assert info.vocab_size == len(VOCAB)


def test_score_is_each_tokens_smoothed_unigram_log_prob(
    stub: lm_service_pb2_grpc.LanguageModelServiceStub,
) -> None:
    texts = ["The lord said", "god said let there be light"]
    response = stub.Score(pb.ScoreRequest(model=MODEL, texts=texts, return_tokens=True))
    for text, result in zip(texts, response.results, strict=True):
        words = [*text.lower().split(), "</s>"]
        np.testing.assert_allclose(result.details.log_probs, [lp(w) for w in words], atol=1e-9)
        assert result.log_prob == pytest.approx(sum(lp(w) for w in words))
        assert result.oov_count == sum(w not in VOCAB.index for w in words)
    assert response.results[1].oov_count == 2  # "let", "be"


def test_perplexity_is_exp_of_the_mean_negative_log_prob(
    stub: lm_service_pb2_grpc.LanguageModelServiceStub,
) -> None:
    texts = ["the lord", "then there was light"]
    stats = stub.Perplexity(pb.PerplexityRequest(model=MODEL, texts=texts)).stats
    words = [w for t in texts for w in [*t.split(), "</s>"]]
    total = sum(lp(w) for w in words)
    assert stats.token_count == len(words)
    assert stats.log_prob == pytest.approx(total)
    assert stats.perplexity == pytest.approx(math.exp(-total / len(words)))


def test_greedy_generation_repeats_the_most_probable_word(
    stub: lm_service_pb2_grpc.LanguageModelServiceStub,
) -> None:
    request = pb.GenerateRequest(
        model=MODEL,
        prompt="and god said",
        sampling=pb.SamplingParams(temperature=0.0),
        stopping=pb.StoppingCriteria(max_new_tokens=4, ignore_eos=True),
        logprobs=True,
    )
    tokens = [t for message in stub.Generate(request, timeout=30) for t in message.tokens]
    assert [t.token_id for t in tokens] == [VOCAB.index["the"]] * 4
    np.testing.assert_allclose([t.log_prob for t in tokens], [lp("the")] * 4, atol=1e-6)


def test_seeded_sampling_draws_the_same_tokens_twice(
    stub: lm_service_pb2_grpc.LanguageModelServiceStub,
) -> None:
    def draw() -> list[int]:
        request = pb.GenerateRequest(
            model=MODEL,
            sampling=pb.SamplingParams(temperature=1.0, seed=7),
            stopping=pb.StoppingCriteria(max_new_tokens=12, ignore_eos=True),
        )
        return [t.token_id for m in stub.Generate(request, timeout=30) for t in m.tokens]

    first = draw()
    assert first == draw() and len(first) == 12
    assert len(set(first)) > 1  # drawn, not the argmax


def test_beam_search_scores_each_hypothesis_by_its_tokens(
    stub: lm_service_pb2_grpc.LanguageModelServiceStub,
) -> None:
    request = pb.BeamSearchRequest(model=MODEL, prompt="the", beam_width=4, max_length=3)
    hypotheses = stub.BeamSearch(request, timeout=30).hypotheses
    assert hypotheses
    for hypothesis in hypotheses:
        words = [VOCAB.words[i] for i in hypothesis.token_ids]
        ended = hypothesis.finish_reason == "end_of_sentence" and "</s>" not in words
        expected = sum(lp(w) for w in words) + (lp("</s>") if ended else 0.0)
        assert hypothesis.log_prob == pytest.approx(expected, abs=1e-6)
    # Context-free: the best continuation ends at once (</s> beats any word after "the").
    assert hypotheses[0].log_prob == pytest.approx(max(h.log_prob for h in hypotheses))


def test_rerank_orders_by_the_lm_and_the_callers_scores(
    stub: lm_service_pb2_grpc.LanguageModelServiceStub,
) -> None:
    texts = ["the lord said", "there light", "the god"]
    acoustic = [-1.0, -0.5, -4.0]
    request = pb.RerankRequest(
        model=MODEL,
        lists=[
            pb.NBestList(
                id="u",
                hypotheses=[
                    pb.Hypothesis(text=t, scores={"am": a})
                    for t, a in zip(texts, acoustic, strict=True)
                ],
            )
        ],
        score_weights={"am": 1.0},
    )
    [ranked] = stub.Rerank(request, timeout=30).lists
    lm = [sum(lp(w) for w in [*t.split(), "</s>"]) for t in texts]
    combined = [a + m for a, m in zip(acoustic, lm, strict=True)]
    by_index = {h.index: h for h in ranked.hypotheses}
    for i in range(len(texts)):
        assert by_index[i].lm_log_prob == pytest.approx(lm[i])
        assert by_index[i].rank == sorted(combined, reverse=True).index(combined[i])


def test_complete_offers_the_most_probable_words_with_the_prefix(
    stub: lm_service_pb2_grpc.LanguageModelServiceStub,
) -> None:
    outbox: queue.Queue[pb.CompleteRequest | None] = queue.Queue()
    answers = stub.Complete(iter(outbox.get, None), timeout=30)
    outbox.put(pb.CompleteRequest(model=MODEL, append_text="and god said", partial_word="th", k=3))
    answer = next(answers)
    outbox.put(None)
    expected = sorted((w for w in COUNTS if w.startswith("th")), key=lp, reverse=True)[:3]
    assert [c.word for c in answer.completions] == expected
    np.testing.assert_allclose(
        [c.log_prob for c in answer.completions], [lp(w) for w in expected], atol=1e-6
    )


def test_a_family_that_cannot_be_imported_stops_the_server_with_the_reason(
    tmp_path: Path,
) -> None:
    settings = load_settings(
        {"model_repository": tmp_path, "port": 0, "model_families": ["no_such_module:FAMILY"]}
    )
    with pytest.raises(ValueError, match="no_such_module:FAMILY.*cannot be imported"):
        start_background_server(settings, registry=CollectorRegistry())
