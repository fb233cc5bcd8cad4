"""A feed-forward (Bengio) LM trained by `lmserve train-neural --cell ffnn` on a tiny KJV corpus,
exported to ONNX and TorchScript, served by a real server on a real port through every RPC:
Score, Perplexity, Generate, BeamSearch, Rerank and Complete, each checked against PyTorch eager
or against another RPC, and bad input answered with a clear status."""

from __future__ import annotations

import math
import queue
import shutil
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import torch
import yaml
from served import ServerFactory

from lmserve.client import GeneratedToken, LmServeClient
from lmserve.export.rnn.data import encode_sentences
from lmserve.export.rnn.ffnn import FeedForwardLM
from lmserve.export.trainers.loop import BEST_CHECKPOINT
from lmserve.export.trainers.recurrent import evaluate, load_checkpoint
from lmserve.server.cli import main
from lmserve.server.families.catalog import make_stepper
from lmserve.server.front.process.app import BackgroundServer
from lmserve.server.registry.repository import load_entry
from lmserve.v1 import lm_service_pb2 as pb
from lmserve.v1 import lm_service_pb2_grpc

CORPUS = Path(__file__).resolve().parents[2] / "export/lmserve/export/corpora/kjv"
MODELS = ("ffnn-onnx", "ffnn-ts")
ORDER = 4


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A tiny ffnn trained and exported by the commands users run."""
    root = tmp_path_factory.mktemp("ffnn")
    for split, n in (("train", 300), ("valid", 40)):
        lines = (CORPUS / f"{split}.txt").read_text(encoding="utf-8").splitlines()[:n]
        (root / f"{split}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    repo = root / "models"
    threads = torch.get_num_threads()
    args = [
        "train-neural", str(root / "train.txt"), str(root / "run"),
        "--heldout", str(root / "valid.txt"), "--cell", "ffnn", "--order", str(ORDER),
        "--embedding-size", "16", "--hidden-size", "24", "--no-tie-weights", "--dropout", "0",
        "--epochs", "2", "--batch-size", "32", "--lr", "1e-2", "--threads", "1",
        "--no-progress", "--export", str(repo / "ffnn-onnx"),
    ]  # fmt: skip
    try:
        assert main(args) == 0
        checkpoint = str(root / "run" / BEST_CHECKPOINT)
        export = ["export-rnn", checkpoint, str(repo / "ffnn-ts"), "--format", "torchscript"]
        assert main(export) == 0
    finally:
        torch.set_num_threads(threads)
    # Broken: the architecture lost its order; it fails alone, naming the reason.
    shutil.copytree(repo / "ffnn-onnx", repo / "ffnn-no-order")
    manifest = yaml.safe_load((repo / "ffnn-no-order" / "model.yaml").read_text())
    manifest["name"] = "ffnn-no-order"
    del manifest["architecture"]["order"]
    (repo / "ffnn-no-order" / "model.yaml").write_text(yaml.safe_dump(manifest))
    model, data = load_checkpoint(root / "run" / BEST_CHECKPOINT)
    assert isinstance(model, FeedForwardLM)
    return {"repo": repo, "model": model, "vocab": data["vocab"], "root": root}


@pytest.fixture(scope="module")
def server(serve: ServerFactory, trained: dict[str, Any]) -> Iterator[BackgroundServer]:
    # Its own (no other module serves this repository), stopped when the module ends.
    with serve.private(
        trained["repo"],
        max_chunk_tokens=4,  # texts cross several chunks, the window carried between
        max_active_sequences=8,
        # The base model's exact answers: the session cache is off here and tested in
        # test_complete_cache.py.
        complete_cache_weight=0.0,
    ) as running:
        yield running


@pytest.fixture(scope="module")
def stub(server: BackgroundServer) -> Iterator[lm_service_pb2_grpc.LanguageModelServiceStub]:
    with grpc.insecure_channel(server.address) as channel:
        yield lm_service_pb2_grpc.LanguageModelServiceStub(channel)


@pytest.fixture(scope="module")
def client(server: BackgroundServer) -> Iterator[LmServeClient]:
    with LmServeClient(server.address, timeout=30) as c:
        yield c


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return (CORPUS / "test.txt").read_text(encoding="utf-8").splitlines()[:12]


def _ids(vocab: Sequence[str], text: str) -> list[int]:
    index = {w: i for i, w in enumerate(vocab)}
    return [index.get(w, 0) for w in text.split()]


@torch.no_grad()
def _eager(model: FeedForwardLM, inputs: Sequence[int]) -> np.ndarray:
    """log P(. | <s> inputs[:t+1]) [len(inputs), V] from the PyTorch model (natural logs)."""
    logits, _ = model(torch.tensor([list(inputs)]), model.initial_state(1))
    return torch.log_softmax(logits.double(), dim=-1)[0].numpy()


def _eager_token_log_probs(model: FeedForwardLM, ids: Sequence[int]) -> list[float]:
    lp = _eager(model, [1, *ids])  # <s> is id 1 in train-rnn vocabularies
    return [float(lp[t, w]) for t, w in enumerate([*ids, 2])]  # ... and </s> id 2


@pytest.mark.parametrize("model", MODELS)
def test_score_equals_the_pytorch_model_and_batching_changes_nothing(
    stub: lm_service_pb2_grpc.LanguageModelServiceStub,
    trained: dict[str, Any],
    texts: list[str],
    model: str,
) -> None:
    request = pb.ScoreRequest(model=model, texts=texts, return_tokens=True)
    results = list(stub.Score(request).results)
    for text, result in zip(texts, results, strict=True):
        expected = _eager_token_log_probs(trained["model"], _ids(trained["vocab"], text))
        np.testing.assert_allclose(list(result.details.log_probs), expected, atol=1e-4)
        assert result.token_count == len(text.split()) + 1
    alone = [stub.Score(pb.ScoreRequest(model=model, texts=[t])).results[0] for t in texts[:4]]
    np.testing.assert_allclose(
        [r.log_prob for r in alone], [r.log_prob for r in results[:4]], atol=1e-5
    )


def test_perplexity_equals_the_training_evaluation(
    stub: lm_service_pb2_grpc.LanguageModelServiceStub, trained: dict[str, Any], texts: list[str]
) -> None:
    stats = stub.Perplexity(pb.PerplexityRequest(model="ffnn-onnx", texts=texts)).stats
    index = {w: i for i, w in enumerate(trained["vocab"])}
    reference = evaluate(trained["model"], encode_sentences([t.split() for t in texts], index))
    assert stats.token_count == reference.tokens
    assert stats.perplexity == pytest.approx(reference.perplexity, rel=1e-4)
    assert stats.perplexity < len(trained["vocab"])  # it learned something


def _tokens(client: LmServeClient, model: str, prompt: Sequence[int], **options: Any) -> list[int]:
    return [
        e.token_id
        for e in client.generate(model, prompt, **options)
        if isinstance(e, GeneratedToken)
    ]


@pytest.mark.parametrize("model", MODELS)
def test_greedy_generation_follows_the_pytorch_argmax(
    client: LmServeClient, trained: dict[str, Any], model: str
) -> None:
    prompt = _ids(trained["vocab"], "and the lord said unto")
    got = _tokens(client, model, prompt, max_new_tokens=10, temperature=0.0, ignore_eos=True)
    history = [1, *prompt]
    expected = []
    for _ in range(10):
        lp = _eager(trained["model"], history)[-1]
        lp[2] = -np.inf  # ignore_eos
        token = int(np.argmax(lp))
        expected.append(token)
        history.append(token)
    assert got == expected


def test_seeded_generation_is_the_same_alone_and_in_a_busy_batch(client: LmServeClient) -> None:
    options = {"max_new_tokens": 25, "seed": 77, "ignore_eos": True, "top_k": 20}
    alone = _tokens(client, "ffnn-onnx", [], **options)
    assert _tokens(client, "ffnn-onnx", [], **options) == alone
    with ThreadPoolExecutor(4) as pool:
        others = [
            pool.submit(
                _tokens, client, "ffnn-onnx", [], max_new_tokens=9 + 5 * i, seed=i, ignore_eos=True
            )
            for i in range(3)
        ]
        time.sleep(0.02)
        busy = pool.submit(_tokens, client, "ffnn-onnx", [], **options).result()
        assert [len(o.result()) for o in others] == [9, 14, 19]
    assert busy == alone
    assert _tokens(client, "ffnn-onnx", [], **{**options, "seed": 78}) != alone


def test_beam_search_equals_the_direct_call_and_the_pytorch_scores(
    server: BackgroundServer, client: LmServeClient, trained: dict[str, Any]
) -> None:
    from lmserve.server.decoding.beam import beam_search
    from lmserve.server.decoding.params import BeamParams

    # The same folder loaded here, with its weights (the front holds none: they are in the
    # model's worker).
    backend = load_entry(trained["repo"] / "ffnn-ts").backend
    assert backend is not None
    prompt = _ids(trained["vocab"], "in the beginning")
    params = BeamParams(beam_width=4, max_length=6, num_return=3)
    direct = beam_search(make_stepper(backend), prompt, params)
    got = client.beam_search("ffnn-ts", prompt, beam_width=4, max_length=6, num_return=3)
    assert len(got) == 3
    assert [h.token_ids for h in got] == [tuple(h.token_ids) for h in direct]
    for hypothesis in got:
        lp = _eager(trained["model"], [1, *prompt, *hypothesis.token_ids])
        steps = range(len(prompt), len(prompt) + len(hypothesis.token_ids))
        expected = sum(lp[t, w] for t, w in zip(steps, hypothesis.token_ids, strict=True))
        if hypothesis.finish_reason == "end_of_sentence" and 2 not in hypothesis.token_ids:
            expected += lp[len(prompt) + len(hypothesis.token_ids), 2]
        assert hypothesis.log_prob == pytest.approx(expected, abs=1e-4)


def test_rerank_lm_scores_equal_score(
    stub: lm_service_pb2_grpc.LanguageModelServiceStub, texts: list[str]
) -> None:
    n_best = [texts[0], " ".join(texts[0].split()[:-1]), texts[1], f"{texts[0]} and"]
    request = pb.RerankRequest(
        model="ffnn-onnx",
        lists=[pb.NBestList(id="a", hypotheses=[pb.Hypothesis(text=t) for t in n_best])],
    )
    [reranked] = stub.Rerank(request).lists
    expected = [
        r.log_prob for r in stub.Score(pb.ScoreRequest(model="ffnn-onnx", texts=n_best)).results
    ]
    got = sorted((h.index, h.lm_log_prob) for h in reranked.hypotheses)
    np.testing.assert_allclose([lp for _, lp in got], expected, atol=1e-4)
    assert [h.rank for h in reranked.hypotheses] == list(range(len(n_best)))


@pytest.mark.parametrize("model", MODELS)
def test_complete_equals_a_brute_force_rescore(
    stub: lm_service_pb2_grpc.LanguageModelServiceStub, trained: dict[str, Any], model: str
) -> None:
    context = "and god said unto"
    words = [w for w in trained["vocab"] if not w.startswith("<")]
    no_eos = pb.ScoreOptions(eos=False)
    scored = stub.Score(
        pb.ScoreRequest(
            model=model, texts=[context] + [f"{context} {w}" for w in words], options=no_eos
        )
    ).results
    by_word = {w: r.log_prob - scored[0].log_prob for w, r in zip(words, scored[1:], strict=True)}
    best = sorted(by_word.items(), key=lambda item: (-item[1], item[0]))
    outbox: queue.Queue[pb.CompleteRequest | None] = queue.Queue()
    answers = stub.Complete(iter(outbox.get, None), timeout=30)
    outbox.put(pb.CompleteRequest(model=model, append_text=context, k=5))
    first = next(answers)
    outbox.put(pb.CompleteRequest(partial_word="m", k=3))
    second = next(answers)
    outbox.put(None)
    assert [c.word for c in first.completions] == [w for w, _ in best[:5]]
    np.testing.assert_allclose(
        [c.log_prob for c in first.completions], [lp for _, lp in best[:5]], atol=1e-4
    )
    expected_m = [w for w, _ in best if w.startswith("m")][:3]
    assert [c.word for c in second.completions] == expected_m
    assert first.context_tokens == 4


def test_get_model_reports_the_order(stub: lm_service_pb2_grpc.LanguageModelServiceStub) -> None:
    info = stub.GetModel(pb.GetModelRequest(model="ffnn-onnx")).model
    assert info.state == pb.MODEL_STATE_READY
    assert (info.order, info.hidden_size, info.embedding_size) == (ORDER, 24, 16)
    assert info.kind == pb.MODEL_KIND_FFNN


def test_bad_input_gets_a_clear_status(stub: lm_service_pb2_grpc.LanguageModelServiceStub) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        stub.Score(
            pb.ScoreRequest(model="ffnn-onnx", texts=["a"], options=pb.ScoreOptions(bos=False))
        )
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert "bos" in (caught.value.details() or "")
    info = stub.GetModel(pb.GetModelRequest(model="ffnn-no-order")).model
    assert info.state == pb.MODEL_STATE_FAILED and "needs an order" in info.load_error
    with pytest.raises(grpc.RpcError) as caught:
        stub.Score(pb.ScoreRequest(model="ffnn-no-order", texts=["the"]))
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert math.isfinite(
        stub.Score(pb.ScoreRequest(model="ffnn-onnx", texts=["the"])).results[0].log_prob
    )
