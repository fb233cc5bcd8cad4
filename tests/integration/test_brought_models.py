"""Neural LMs written outside this project, brought in the three ways (a torch module through
`export_module`, an ONNX file through `lmserve import-onnx`, a TorchScript file through
`lmserve import-torchscript`) and served by a real server on a real port: Score equals the
module's own log-probs, greedy and seeded Generate equal a reference loop over the module,
BeamSearch's scores equal the module's, Rerank's LM scores and Complete's words equal a
rescoring with the module, GetModel reports where each came from, and /v1 serves them."""

from __future__ import annotations

import json
import queue
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from brought_models import (
    BOS,
    EOS,
    LSTM_CONTRACT,
    SEQ_FIRST_CONTRACT,
    VOCAB,
    WINDOW_CONTRACT,
    eager_log_probs,
    eager_token_log_probs,
    export_gru_onnx,
    gru_lm,
    ids_of,
    save_gru_script,
    seq_first_lm,
    tiny_lstm,
    window_lm,
)
from served import ServerFactory
from torch import nn

from lmserve.client import GeneratedToken, LmServeClient
from lmserve.export.custom import export_module
from lmserve.server.cli import main
from lmserve.server.decoding.reference_sampling import draw_cumulative
from lmserve.server.decoding.sampling import request_generators
from lmserve.server.front.process.app import BackgroundServer
from lmserve.v1 import lm_service_pb2 as pb
from lmserve.v1 import lm_service_pb2_grpc

TEXTS = ["the cat sat on the mat", "god said let there be red", "a big dog ran to the house and"]
LONG = " ".join(["the small dog ran to a big red house and"] * 4)  # crosses many chunks of 4


@pytest.fixture(scope="module")
def modules() -> dict[str, nn.Module]:
    lstm, gru = tiny_lstm(), gru_lm()
    return {
        "tiny-lstm": lstm,
        "tiny-lstm-ts": lstm,
        "gru-onnx": gru,
        "gru-onnx-bf": gru,
        "gru-ts": gru,
        "seq-first": seq_first_lm(),
        "window": window_lm(),
    }


@pytest.fixture(scope="module")
def repository(
    tmp_path_factory: pytest.TempPathFactory,
    modules: dict[str, nn.Module],
    brought_folders: dict[str, Path],
) -> Path:
    root = tmp_path_factory.mktemp("brought")
    repo = root / "models"
    repo.mkdir()
    # gru-onnx (`import-onnx`) and tiny-lstm-ts (TorchScript through `export_module`): the
    # session's, built from the same seeded modules as `modules` (the conformance matrix serves
    # them too).
    for name in ("gru-onnx", "tiny-lstm-ts"):
        (repo / name).symlink_to(brought_folders[name], target_is_directory=True)
    lstm = modules["tiny-lstm"]
    export_module(lstm, repo / "tiny-lstm", vocab=VOCAB, contract=LSTM_CONTRACT, kind="lstm")
    export_module(
        modules["seq-first"], repo / "seq-first", vocab=VOCAB, contract=SEQ_FIRST_CONTRACT
    )
    export_module(
        modules["window"], repo / "window", vocab=VOCAB, contract=WINDOW_CONTRACT, kind="ffnn"
    )
    vocab = root / "vocab.txt"
    vocab.write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    gru = modules["gru-onnx"]
    export_gru_onnx(gru, root / "gru-bf.onnx", batch_first_state=True)
    save_gru_script(gru, root / "gru.pt")
    common = ["--vocab", str(vocab), "--kind", "gru"]
    assert main(["import-onnx", str(root / "gru-bf.onnx"), str(repo / "gru-onnx-bf"), *common,
                 "--state", "hidden_in:hidden_out:0"]) == 0  # fmt: skip
    assert main(["import-torchscript", str(root / "gru.pt"), str(repo / "gru-ts"), *common,
                 "--state", "h:2,batch,16"]) == 0  # fmt: skip
    return repo


@pytest.fixture(scope="module")
def server(serve: ServerFactory, repository: Path) -> Iterator[BackgroundServer]:
    # Its own (no other module serves this repository), stopped when the module ends.
    with serve.private(
        repository,
        max_chunk_tokens=4,  # long texts cross chunks with the state carried
        complete_cache_weight=0.0,  # the model's own answers
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


MODELS = ["tiny-lstm", "tiny-lstm-ts", "gru-onnx", "gru-onnx-bf", "gru-ts", "seq-first", "window"]


@pytest.mark.parametrize("model", MODELS)
def test_score_equals_the_modules_own_log_probs(
    stub: lm_service_pb2_grpc.LanguageModelServiceStub, modules: dict[str, nn.Module], model: str
) -> None:
    texts = [*TEXTS, LONG, "zebra the"]
    results = stub.Score(pb.ScoreRequest(model=model, texts=texts, return_tokens=True)).results
    for text, result in zip(texts, results, strict=True):
        expected = eager_token_log_probs(modules[model], ids_of(text))
        np.testing.assert_allclose(list(result.details.log_probs), expected, atol=1e-4)
        assert result.token_count == len(text.split()) + 1
    assert results[-1].oov_count == 1


def _tokens(client: LmServeClient, model: str, prompt: list[int], **options: Any) -> list[int]:
    events = client.generate(model, prompt, **options)
    return [e.token_id for e in events if isinstance(e, GeneratedToken)]


@pytest.mark.parametrize("model", ["tiny-lstm", "gru-onnx", "gru-ts", "seq-first", "window"])
def test_greedy_and_seeded_generation_equal_a_loop_over_the_module(
    client: LmServeClient, modules: dict[str, nn.Module], model: str
) -> None:
    module = modules[model]
    prompt = ids_of("god said")
    for seed, temperature in ((None, 0.0), (11, 1.0), (12, 0.7)):
        options: dict[str, Any] = {"temperature": temperature, "ignore_eos": True}
        if seed is not None:
            options["seed"] = seed
        got = _tokens(client, model, prompt, max_new_tokens=12, **options)
        rng = request_generators(seed, 1)[0]
        history, expected = [BOS, *prompt], []
        for _ in range(12):
            lp = eager_log_probs(module, history)[-1]
            lp[[BOS, EOS]] = -np.inf  # <s> is never drawn; </s> under ignore_eos
            if temperature == 0.0:
                token = int(np.argmax(lp))
            else:
                weights = np.exp((lp - lp.max()) / temperature)[None, :]
                token = int(draw_cumulative(weights, np.array([1.0 - rng.random()]))[0])
            expected.append(token)
            history.append(token)
        assert got == expected, (model, seed)


@pytest.mark.parametrize("model", ["tiny-lstm", "gru-onnx-bf", "gru-ts", "window"])
def test_beam_search_scores_are_the_modules(
    client: LmServeClient, modules: dict[str, nn.Module], model: str
) -> None:
    prompt = ids_of("the cat")
    got = client.beam_search(model, prompt, beam_width=4, max_length=5, num_return=3)
    assert len(got) == 3
    assert len({h.token_ids for h in got}) == 3
    for hypothesis in got:
        ids = list(hypothesis.token_ids)
        lp = eager_log_probs(modules[model], [BOS, *prompt, *ids])
        steps = range(len(prompt), len(prompt) + len(ids))
        expected = sum(lp[t, w] for t, w in zip(steps, ids, strict=True))
        if hypothesis.finish_reason == "end_of_sentence" and EOS not in ids:
            expected += lp[len(prompt) + len(ids), EOS]
        assert hypothesis.log_prob == pytest.approx(expected, abs=1e-4)


@pytest.mark.parametrize("model", ["tiny-lstm", "gru-onnx"])
def test_rerank_lm_scores_equal_the_module(
    client: LmServeClient, modules: dict[str, nn.Module], model: str
) -> None:
    n_best = [TEXTS[0], "the cat sat on a mat", "the cat sat on mat the", "dog the sat"]
    acoustic = [-1.0, -1.2, -0.5, -3.0]
    [reranked] = client.rerank(
        model,
        [
            {
                "id": "u1",
                "hypotheses": [
                    {"text": t, "scores": {"am": a}} for t, a in zip(n_best, acoustic, strict=True)
                ],
            }
        ],
        score_weights={"am": 1.0},
        lm_weight=0.5,
    )
    expected = [sum(eager_token_log_probs(modules[model], ids_of(t))) for t in n_best]
    by_index = {h.index: h for h in reranked.hypotheses}
    for i, lm in enumerate(expected):
        assert by_index[i].lm_log_prob == pytest.approx(lm, abs=1e-4)
        assert by_index[i].combined_score == pytest.approx(acoustic[i] + 0.5 * lm, abs=1e-4)
    scores = [h.combined_score for h in reranked.hypotheses]
    assert scores == sorted(scores, reverse=True)


@pytest.mark.parametrize("model", ["tiny-lstm-ts", "gru-onnx", "seq-first", "window"])
def test_complete_offers_the_modules_most_likely_words(
    stub: lm_service_pb2_grpc.LanguageModelServiceStub, modules: dict[str, nn.Module], model: str
) -> None:
    context = "the big dog ran to"
    lp = eager_log_probs(modules[model], [BOS, *ids_of(context)])[-1]
    words = [(w, float(lp[i])) for i, w in enumerate(VOCAB) if not w.startswith("<")]
    best = sorted(words, key=lambda item: (-item[1], item[0]))
    outbox: queue.Queue[pb.CompleteRequest | None] = queue.Queue()
    answers = stub.Complete(iter(outbox.get, None), timeout=30)
    outbox.put(pb.CompleteRequest(model=model, append_text=context, k=5))
    first = next(answers)
    outbox.put(pb.CompleteRequest(partial_word="s", k=2))
    second = next(answers)
    outbox.put(None)
    assert [c.word for c in first.completions] == [w for w, _ in best[:5]]
    np.testing.assert_allclose(
        [c.log_prob for c in first.completions], [v for _, v in best[:5]], atol=1e-4
    )
    assert [c.word for c in second.completions] == [w for w, _ in best if w.startswith("s")][:2]


def test_get_model_says_where_each_model_came_from(
    stub: lm_service_pb2_grpc.LanguageModelServiceStub,
) -> None:
    infos = {m.name: m for m in stub.ListModels(pb.ListModelsRequest()).models}
    assert set(infos) == set(MODELS)
    sources = {name: info.provenance.source for name, info in infos.items()}
    assert sources["tiny-lstm"].endswith("brought_models.TinyLSTM")
    assert sources["gru-onnx"].startswith("onnx gru.onnx sha256:")
    assert sources["gru-ts"].startswith("torchscript gru.pt sha256:")
    for name, info in infos.items():
        assert info.state == pb.MODEL_STATE_READY, (name, info.load_error)
        assert info.vocab_size == len(VOCAB)
        parity = info.provenance.parity
        assert {"max_abs_diff_nats", "positions", "chunk_carry_max_abs_diff_nats"} <= set(parity)
        assert 0 <= parity["max_abs_diff_nats"] <= 1e-4 and parity["positions"] > 0, name
        assert parity["chunk_carry_max_abs_diff_nats"] <= 1e-4
    assert infos["gru-ts"].kind == pb.MODEL_KIND_GRU
    assert infos["window"].kind == pb.MODEL_KIND_FFNN
    assert infos["tiny-lstm"].format == pb.MODEL_FORMAT_ONNX
    assert infos["tiny-lstm-ts"].format == pb.MODEL_FORMAT_TORCHSCRIPT


def test_the_openai_route_scores_a_brought_model(
    server: BackgroundServer, modules: dict[str, nn.Module]
) -> None:
    body = {"model": "gru-onnx", "prompt": TEXTS[0], "max_tokens": 0, "echo": True, "logprobs": 0}
    request = urllib.request.Request(
        f"http://127.0.0.1:{server.http_port}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        answer = json.load(response)
    logprobs = answer["choices"][0]["logprobs"]["token_logprobs"]
    expected = eager_token_log_probs(modules["gru-onnx"], ids_of(TEXTS[0]))[:-1]
    # Every prompt token, the first after <s> included, as the module scores it.
    np.testing.assert_allclose(logprobs, expected, atol=1e-4)
