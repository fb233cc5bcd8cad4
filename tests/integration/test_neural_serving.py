"""Neural and interpolated models through a real server: scores, batching, mixing, load errors."""

from __future__ import annotations

import math
import queue
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest
import yaml
from neural_folders import (
    VOCAB,
    eager_token_log_probs,
    tiny_model,
    write_onnx_folder,
    write_torchscript_folder,
)
from served import ServerFactory

from lmserve.export.rnn.model import RecurrentLM
from lmserve.server.front.process.app import BackgroundServer
from lmserve.server.manifest import ModelManifest, sha256_of, write_manifest
from lmserve.v1 import lm_service_pb2 as pb
from lmserve.v1 import lm_service_pb2_grpc

SENTENCE = "the cat sat on the mat"
LONG = " ".join(["the big dog ran to the house and"] * 12)  # 96 words: several chunks of 16
UNIGRAM_ARPA = """\\data\\
ngram 1=8

\\1-grams:
-1.0\t<unk>
-99\t<s>
-0.9\t</s>
-0.5\tthe
-1.1\tcat
-1.3\tsat
-1.2\tmat
-1.4\ton

\\end\\
"""


def _ids(text: str) -> list[int]:
    return [VOCAB.index(w) if w in VOCAB else 0 for w in text.split()]


def _mixture(folder: Path, name: str, components: list[tuple[str, float]]) -> None:
    folder.mkdir()
    manifest = ModelManifest.model_validate(
        {
            "name": name,
            "kind": "interpolated",
            "format": "interpolation",
            "files": {},
            "architecture": {"components": [{"model": m, "weight": w} for m, w in components]},
        }
    )
    write_manifest(folder, manifest)


@pytest.fixture(scope="module")
def lstm() -> RecurrentLM:
    return tiny_model("lstm", seed=1)


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory, lstm: RecurrentLM) -> Path:
    root = tmp_path_factory.mktemp("neural-models")
    write_onnx_folder(lstm, VOCAB, root / "lstm-onnx", name="lstm-onnx")
    write_torchscript_folder(lstm, VOCAB, root / "lstm-ts", name="lstm-ts")
    (root / "unigram").mkdir()
    (root / "unigram" / "model.arpa").write_text(UNIGRAM_ARPA)
    write_manifest(
        root / "unigram",
        ModelManifest.model_validate(
            {
                "name": "unigram",
                "kind": "ngram",
                "format": "arpa",
                "files": {"arpa": {"path": "model.arpa"}},
            }
        ),
    )
    _mixture(root / "mix", "mix", [("lstm-onnx", 0.7), ("unigram", 0.3)])

    # Broken: each fails alone, naming the file and the reason.
    shutil.copytree(root / "lstm-onnx", root / "corrupt-onnx")
    (root / "corrupt-onnx" / "step.onnx").write_bytes(b"not an onnx graph")
    manifest = yaml.safe_load((root / "corrupt-onnx" / "model.yaml").read_text())
    manifest["name"] = "corrupt-onnx"
    manifest["files"]["step"]["sha256"] = sha256_of(root / "corrupt-onnx" / "step.onnx")
    (root / "corrupt-onnx" / "model.yaml").write_text(yaml.safe_dump(manifest))
    shutil.copytree(root / "lstm-onnx", root / "bad-checksum-onnx")
    manifest["name"] = "bad-checksum-onnx"
    manifest["files"]["step"]["sha256"] = "0" * 64
    (root / "bad-checksum-onnx" / "model.yaml").write_text(yaml.safe_dump(manifest))
    (root / "mix-char").mkdir()
    write_manifest(
        root / "mix-char",
        ModelManifest.model_validate(
            {
                "name": "mix-char",
                "kind": "interpolated",
                "format": "interpolation",
                "files": {},
                "tokenizer": {"kind": "word", "lowercase": True},
                "architecture": {"components": [{"model": "lstm-onnx", "weight": 1.0}]},
            }
        ),
    )
    return root


@pytest.fixture(scope="module")
def server(serve: ServerFactory, repository: Path) -> Iterator[BackgroundServer]:
    # Its own (no other module serves this repository), stopped when the module ends.
    with serve.private(
        repository,
        max_chunk_tokens=16,
        # Small units: requests are cut into several passes, concurrent ones share passes.
        scoring_unit_tokens=64,
        # The base model's exact answers: the session cache is off here and tested in
        # test_complete_cache.py.
        complete_cache_weight=0.0,
    ) as running:
        yield running


@pytest.fixture(scope="module")
def stub(server: BackgroundServer) -> Iterator[lm_service_pb2_grpc.LanguageModelServiceStub]:
    with grpc.insecure_channel(server.address) as channel:
        yield lm_service_pb2_grpc.LanguageModelServiceStub(channel)


def _score(
    stub: lm_service_pb2_grpc.LanguageModelServiceStub, model: str, texts: list[str]
) -> list[pb.TextScore]:
    response = stub.Score(pb.ScoreRequest(model=model, texts=texts, return_tokens=True))
    return list(response.results)


@pytest.mark.parametrize("model", ["lstm-onnx", "lstm-ts"])
def test_score_equals_the_pytorch_model(
    stub: lm_service_pb2_grpc.LanguageModelServiceStub, lstm: RecurrentLM, model: str
) -> None:
    [result] = _score(stub, model, [SENTENCE])
    expected = eager_token_log_probs(lstm, _ids(SENTENCE))
    np.testing.assert_allclose(list(result.details.log_probs), expected, atol=1e-4)
    assert result.log_prob == pytest.approx(sum(expected), abs=1e-4)
    assert list(result.details.tokens) == [*SENTENCE.split(), "</s>"]
    assert result.token_count == 7


def test_batch_equals_one_by_one_and_long_texts_are_chunked(
    stub: lm_service_pb2_grpc.LanguageModelServiceStub, lstm: RecurrentLM
) -> None:
    texts = [SENTENCE, "", LONG, "a dog in a red house", "zebra the"]
    together = [r.log_prob for r in _score(stub, "lstm-onnx", texts)]
    alone = [_score(stub, "lstm-onnx", [t])[0].log_prob for t in texts]
    np.testing.assert_allclose(together, alone, atol=1e-5)
    # The 97-token text went through 7 chunks of 16 with the state carried: it equals eager.
    assert together[2] == pytest.approx(sum(eager_token_log_probs(lstm, _ids(LONG))), abs=1e-4)
    [zebra] = _score(stub, "lstm-onnx", ["zebra the"])
    assert zebra.oov_count == 1 and list(zebra.details.oov) == [True, False, False]


@pytest.mark.parametrize("model", ["lstm-onnx", "mix"])
def test_an_empty_last_text_without_eos_scores_zero(
    stub: lm_service_pb2_grpc.LanguageModelServiceStub, model: str
) -> None:
    # It scores no position: np.add.reduceat used to raise IndexError, answered INTERNAL.
    options = pb.ScoreOptions(eos=False)
    texts = ["", SENTENCE, "", "the cat", ""]
    request = pb.ScoreRequest(model=model, texts=texts, options=options, return_tokens=True)
    together = list(stub.Score(request).results)
    alone = [
        stub.Score(pb.ScoreRequest(model=model, texts=[t], options=options)).results[0]
        for t in texts
    ]
    np.testing.assert_allclose(
        [r.log_prob for r in together], [r.log_prob for r in alone], atol=1e-5
    )
    assert [r.token_count for r in together] == [0, 6, 0, 2, 0]
    assert [r.log_prob for r in together][::2] == [0.0, 0.0, 0.0]
    assert together[1].log_prob < 0 and len(together[1].details.log_probs) == 6


def test_perplexity_of_a_neural_model(stub: lm_service_pb2_grpc.LanguageModelServiceStub) -> None:
    texts = [SENTENCE, LONG]
    stats = stub.Perplexity(pb.PerplexityRequest(model="lstm-ts", texts=texts)).stats
    total = sum(r.log_prob for r in _score(stub, "lstm-ts", texts))
    assert stats.token_count == 7 + 97
    assert stats.perplexity == pytest.approx(math.exp(-total / 104), rel=1e-5)
    # A word model's tokens are its words: the per-word figures are the per-token ones.
    assert stats.word_count == stats.token_count
    assert stats.perplexity_per_word == stats.perplexity


def test_interpolated_scores_mix_the_components(
    stub: lm_service_pb2_grpc.LanguageModelServiceStub,
) -> None:
    text = "the cat sat on the red mat"  # "red" is not in the unigram: its <unk> there
    [mixed] = _score(stub, "mix", [text])
    [neural] = _score(stub, "lstm-onnx", [text])
    [unigram] = _score(stub, "unigram", [text])
    expected = [
        math.log(0.7 * math.exp(a) + 0.3 * math.exp(b))
        for a, b in zip(neural.details.log_probs, unigram.details.log_probs, strict=True)
    ]
    np.testing.assert_allclose(list(mixed.details.log_probs), expected, atol=1e-5)
    assert mixed.log_prob == pytest.approx(sum(expected), abs=1e-5)
    info = stub.GetModel(pb.GetModelRequest(model="mix")).model
    assert info.kind == pb.MODEL_KIND_INTERPOLATED and info.state == pb.MODEL_STATE_READY


def test_get_model_shows_the_neural_architecture(
    stub: lm_service_pb2_grpc.LanguageModelServiceStub,
) -> None:
    info = stub.GetModel(pb.GetModelRequest(model="lstm-onnx")).model
    assert (info.kind, info.format) == (pb.MODEL_KIND_LSTM, pb.MODEL_FORMAT_ONNX)
    assert (info.num_layers, info.hidden_size, info.embedding_size) == (2, 8, 8)
    assert info.vocab_size == len(VOCAB) and info.state == pb.MODEL_STATE_READY
    ts = stub.GetModel(pb.GetModelRequest(model="lstm-ts")).model
    assert ts.format == pb.MODEL_FORMAT_TORCHSCRIPT


@pytest.mark.parametrize(
    ("model", "file_name", "reason"),
    [
        ("corrupt-onnx", "step.onnx", "ONNX Runtime cannot load it"),
        ("bad-checksum-onnx", "step.onnx", "sha256"),
        ("mix-char", "model.yaml", "components must share"),
    ],
)
def test_broken_neural_models_fail_alone(
    stub: lm_service_pb2_grpc.LanguageModelServiceStub, model: str, file_name: str, reason: str
) -> None:
    info = stub.GetModel(pb.GetModelRequest(model=model)).model
    assert info.state == pb.MODEL_STATE_FAILED
    assert file_name in info.load_error and reason in info.load_error
    with pytest.raises(grpc.RpcError) as caught:
        stub.Score(pb.ScoreRequest(model=model, texts=["the"]))
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


def test_concurrent_requests_score_as_alone_in_bounded_passes(
    server: BackgroundServer, stub: lm_service_pb2_grpc.LanguageModelServiceStub
) -> None:
    registry = server.running.metrics.registry
    labels = {"model": "lstm-ts"}

    def batches() -> float:
        return registry.get_sample_value("lmserve_batch_size_count", labels) or 0.0

    texts = [f"the {w} sat on the mat" for w in VOCAB[3:]] + [LONG]
    expected = [_score(stub, "lstm-ts", [t])[0].log_prob for t in texts]
    before_passes, before_texts = (
        batches(),
        registry.get_sample_value("lmserve_batch_size_sum", labels) or 0.0,
    )
    with ThreadPoolExecutor(len(texts)) as pool:
        results = list(pool.map(lambda t: _score(stub, "lstm-ts", [t])[0].log_prob, texts))
    np.testing.assert_allclose(results, expected, atol=1e-5)
    passes = batches() - before_passes
    merged = (registry.get_sample_value("lmserve_batch_size_sum", labels) or 0.0) - before_texts
    assert merged == len(texts)  # every text in exactly one pass's rows
    assert 1 <= passes <= len(texts)  # passes merge concurrent requests when they queue
    assert registry.get_sample_value("lmserve_queue_duration_seconds_count", labels)


def test_a_failing_request_does_not_poison_its_batch(
    stub: lm_service_pb2_grpc.LanguageModelServiceStub,
) -> None:
    def call(options: pb.ScoreOptions | None) -> float | grpc.StatusCode:
        request = pb.ScoreRequest(model="lstm-onnx", texts=[SENTENCE], options=options)
        try:
            return float(stub.Score(request).results[0].log_prob)
        except grpc.RpcError as exc:
            return exc.code()

    no_bos = pb.ScoreOptions(bos=False)
    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(call, [None, no_bos, None, None, no_bos, None]))
    good = [r for r in results if isinstance(r, float)]
    assert len(good) == 4 and max(good) - min(good) < 1e-6
    assert results[1] == results[4] == grpc.StatusCode.UNIMPLEMENTED


N_BEST = [
    "the cat sat on the mat",
    "the cat sat on a mat",
    "the cat sat",
    "the dog sat on the mat",
    "the cat sat on the mat the end",
    "",
]


def _hypothesis(text: str) -> pb.Hypothesis:
    """Text, or an empty token list for the empty hypothesis (proto3 cannot send text="")."""
    return pb.Hypothesis(text=text) if text else pb.Hypothesis(tokens=pb.TokenList())


@pytest.mark.parametrize("model", ["lstm-onnx", "lstm-ts", "mix"])
def test_rerank_lm_scores_equal_score_and_prefixes_are_computed_once(
    stub: lm_service_pb2_grpc.LanguageModelServiceStub, model: str
) -> None:
    request = pb.RerankRequest(
        model=model,
        lists=[
            pb.NBestList(id="a", hypotheses=[_hypothesis(t) for t in N_BEST]),
            pb.NBestList(id="b", hypotheses=[_hypothesis(t) for t in N_BEST[:3]]),
        ],
    )
    response = stub.Rerank(request)
    expected = [r.log_prob for r in _score(stub, model, N_BEST)]
    for reranked, texts in zip(response.lists, (N_BEST, N_BEST[:3]), strict=True):
        got = sorted((h.index, h.lm_log_prob) for h in reranked.hypotheses)
        np.testing.assert_allclose([lp for _, lp in got], expected[: len(texts)], atol=1e-4)
    assert response.request_tokens == sum(len(t.split()) + 1 for t in N_BEST + N_BEST[:3])
    assert 0 < response.computed_tokens < response.request_tokens / 2


def test_rerank_on_a_recurrent_model_refuses_bos_false(
    stub: lm_service_pb2_grpc.LanguageModelServiceStub,
) -> None:
    request = pb.RerankRequest(
        model="lstm-onnx",
        lists=[pb.NBestList(hypotheses=[pb.Hypothesis(text=SENTENCE)])],
        options=pb.ScoreOptions(bos=False),
    )
    with pytest.raises(grpc.RpcError) as caught:
        stub.Rerank(request)
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED


@pytest.mark.parametrize("model", ["lstm-onnx", "mix"])
def test_complete_equals_a_brute_force_rescore(
    stub: lm_service_pb2_grpc.LanguageModelServiceStub, model: str
) -> None:
    context = "the cat sat on"
    words = [w for w in VOCAB if not w.startswith("<")]
    no_eos = pb.ScoreOptions(eos=False)
    texts = [context] + [f"{context} {w}" for w in words]
    scored = stub.Score(pb.ScoreRequest(model=model, texts=texts, options=no_eos)).results
    by_word = {w: r.log_prob - scored[0].log_prob for w, r in zip(words, scored[1:], strict=True)}
    best = sorted(by_word.items(), key=lambda item: (-item[1], item[0]))
    outbox: queue.Queue[pb.CompleteRequest | None] = queue.Queue()
    answers = stub.Complete(iter(outbox.get, None), timeout=10)
    outbox.put(pb.CompleteRequest(model=model, append_text=context, k=4))
    first = next(answers)  # one message at a time: a waiting newer one would skip this one
    outbox.put(pb.CompleteRequest(partial_word="t", k=3))  # no model step: partial word only
    second = next(answers)
    outbox.put(None)
    assert not first.skipped and not second.skipped
    assert [c.word for c in first.completions] == [w for w, _ in best[:4]]
    np.testing.assert_allclose(
        [c.log_prob for c in first.completions], [lp for _, lp in best[:4]], atol=1e-4
    )
    expected_t = [(w, lp) for w, lp in best if w.startswith("t")][:3]
    assert [c.word for c in second.completions] == [w for w, _ in expected_t]
    assert first.context_tokens == second.context_tokens == 4
