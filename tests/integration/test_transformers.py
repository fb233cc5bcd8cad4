"""Transformer decoders with a key/value cache, served in every RPC by a real server on a real
port: a tiny GPT-2 imported with `lmserve import-hf`, a tiny Llama (RoPE, RMSNorm, grouped-query
attention) imported through the library, and the folders `optimum-cli export onnx`
wrote for two such checkpoints (`tests/data/optimum`), served as they are, and the Llama one
after `lmserve optimize` (ONNX Runtime's fused RMSNorm and rotary embedding). Every figure is
compared with transformers' own PyTorch forward of the same checkpoint."""

from __future__ import annotations

import json
import queue
import shutil
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import torch
from hf_models import POSITIONS, load
from served import ServerFactory
from tokenizers import Tokenizer

from lmserve.client import GeneratedToken, GenerationFinished, LmServeClient
from lmserve.client.errors import InvalidArgumentError, ResourceExhaustedError
from lmserve.server.cli import main
from lmserve.server.decoding.reference_sampling import draw_cumulative
from lmserve.server.decoding.sampling import request_generators
from lmserve.server.front.process.app import BackgroundServer
from lmserve.v1 import lm_service_pb2 as pb
from lmserve.v1 import lm_service_pb2_grpc

TEXTS = [
    "And God said, Let there be light",
    "In the beginning God created the heaven and the earth.",
    "darkness",
    "And God saw the light, that it was good: and God divided the light from the darkness.",
]
MODELS = {
    "tiny-gpt2": "gpt2",
    "tiny-llama": "llama",
    "optimum-gpt2": "optimum/gpt2",
    "optimum-llama": "optimum/llama",
    "optimum-llama-fused": "optimum/llama",
}
OPTIMUM = Path(__file__).resolve().parents[1] / "data" / "optimum"
CACHE_BUDGET = 100_000  # bytes: two full-length GPT-2 samples fit, four do not


@pytest.fixture(scope="module")
def checkpoints(hf_checkpoints: dict[str, Path]) -> dict[str, Path]:
    # The session's tiny GPT-2 and Llama, and the checkpoints optimum exported (built the same
    # way, kept with optimum's folders).
    return hf_checkpoints | {f"optimum/{b}": OPTIMUM / f"{b}-checkpoint" for b in ("gpt2", "llama")}


@pytest.fixture(scope="module")
def models(checkpoints: dict[str, Path]) -> dict[str, Any]:
    return {name: load(checkpoints[build]) for name, build in MODELS.items()}


@pytest.fixture(scope="module")
def tokenizers(checkpoints: dict[str, Path]) -> dict[str, Tokenizer]:
    return {
        name: Tokenizer.from_file(str(checkpoints[build] / "tokenizer.json"))
        for name, build in MODELS.items()
    }


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory, hf_folders: dict[str, Path]) -> Path:
    repo = tmp_path_factory.mktemp("transformers") / "models"
    repo.mkdir()
    # tiny-gpt2 (`lmserve import-hf`) and tiny-llama (the library): the session's folders.
    for build in ("gpt2", "llama"):
        (repo / f"tiny-{build}").symlink_to(hf_folders[build], target_is_directory=True)
    for build in ("gpt2", "llama"):  # what optimum-cli wrote, no model.yaml
        shutil.copytree(OPTIMUM / build, repo / f"optimum-{build}")
    # optimum's Llama through ONNX Runtime's optimizer (`lmserve optimize`).
    assert main(["optimize", str(OPTIMUM / "llama"), str(repo / "optimum-llama-fused")]) == 0
    return repo


@pytest.fixture(scope="module")
def server(serve: ServerFactory, repository: Path) -> Iterator[BackgroundServer]:
    # Its own (no other module serves this repository), stopped when the module ends.
    with serve.private(
        repository,
        complete_cache_weight=0.0,  # the model's own answers
        max_cache_bytes=CACHE_BUDGET,
    ) as running:
        yield running


@pytest.fixture(scope="module")
def stub(server: BackgroundServer) -> Iterator[lm_service_pb2_grpc.LanguageModelServiceStub]:
    with grpc.insecure_channel(server.address) as channel:
        yield lm_service_pb2_grpc.LanguageModelServiceStub(channel)


@pytest.fixture(scope="module")
def client(server: BackgroundServer) -> Iterator[LmServeClient]:
    with LmServeClient(server.address, timeout=60) as c:
        yield c


def _specials(model: Any) -> tuple[int, int]:
    return int(model.config.bos_token_id), int(model.config.eos_token_id)


def _log_probs(model: Any, ids: list[int]) -> np.ndarray:
    """transformers' own log-probs [len(ids), V] of the next token after each position."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]
    return torch.log_softmax(logits.double(), dim=-1).numpy()


def _token_log_probs(model: Any, ids: list[int], eos: bool = True) -> list[float]:
    bos, end = _specials(model)
    read = [bos, *ids]
    lp = _log_probs(model, read)
    wanted = [*ids, end] if eos else ids
    return [float(lp[t, w]) for t, w in enumerate(wanted)]


@pytest.mark.parametrize("model", sorted(MODELS))
def test_score_equals_transformers_per_token(
    stub: lm_service_pb2_grpc.LanguageModelServiceStub,
    models: dict[str, Any],
    tokenizers: dict[str, Tokenizer],
    model: str,
) -> None:
    results = stub.Score(pb.ScoreRequest(model=model, texts=TEXTS, return_tokens=True)).results
    for text, result in zip(TEXTS, results, strict=True):
        ids = tokenizers[model].encode(text).ids
        expected = _token_log_probs(models[model], ids)
        assert list(result.details.token_ids)[: len(ids)] == ids
        np.testing.assert_allclose(list(result.details.log_probs), expected, atol=1e-4)
        assert result.log_prob == pytest.approx(sum(expected), abs=1e-3)
        assert result.token_count == len(ids) + 1
        assert result.oov_count == 0  # byte-level: every text encodes


def test_a_text_longer_than_the_positions_is_refused_with_the_limit(
    stub: lm_service_pb2_grpc.LanguageModelServiceStub,
) -> None:
    long = " ".join(["And God said, Let there be light"] * 20)
    with pytest.raises(grpc.RpcError) as caught:
        stub.Score(pb.ScoreRequest(model="tiny-gpt2", texts=["light", long]))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "texts[1]" in caught.value.details()
    assert f"the model has {POSITIONS} (max_positions)" in caught.value.details()
    # The server still answers.
    assert stub.Score(pb.ScoreRequest(model="tiny-gpt2", texts=["light"])).results[0].log_prob < 0


def test_perplexity_is_per_word_as_whitespace_splits(
    stub: lm_service_pb2_grpc.LanguageModelServiceStub,
    models: dict[str, Any],
    tokenizers: dict[str, Tokenizer],
) -> None:
    stats = stub.Perplexity(pb.PerplexityRequest(model="tiny-llama", texts=TEXTS)).stats
    total = sum(
        sum(_token_log_probs(models["tiny-llama"], tokenizers["tiny-llama"].encode(t).ids))
        for t in TEXTS
    )
    words = sum(len(t.split()) for t in TEXTS) + len(TEXTS)  # one </s> a text, as every model
    assert stats.word_count == words
    assert stats.log_prob == pytest.approx(total, abs=1e-3)
    assert stats.perplexity_per_word == pytest.approx(np.exp(-total / words))


def _reference_tokens(
    model: Any, prompt: list[int], steps: int, *, seed: int | None, temperature: float
) -> list[int]:
    bos, eos = _specials(model)
    rng = request_generators(seed, 1)[0]
    history, out = [bos, *prompt], []
    for _ in range(steps):
        lp = _log_probs(model, history)[-1].astype(np.float32).astype(np.float64)
        lp[[bos, eos]] = -np.inf  # <s> is never drawn; </s> under ignore_eos
        if temperature == 0.0:
            token = int(np.argmax(lp))
        else:
            weights = np.exp((lp - lp.max()) / temperature)[None, :]
            token = int(draw_cumulative(weights, np.array([1.0 - rng.random()]))[0])
        out.append(token)
        history.append(token)
    return out


def _generated(client: LmServeClient, model: str, prompt: list[int], **options: Any) -> list[int]:
    events = client.generate(model, prompt, **options)
    return [e.token_id for e in events if isinstance(e, GeneratedToken)]


@pytest.mark.parametrize("model", sorted(MODELS))
def test_greedy_and_seeded_generation_equal_a_loop_over_transformers(
    client: LmServeClient,
    models: dict[str, Any],
    tokenizers: dict[str, Tokenizer],
    model: str,
) -> None:
    prompt = tokenizers[model].encode("And God said").ids
    for seed, temperature in ((None, 0.0), (5, 1.0)):
        options: dict[str, Any] = {"temperature": temperature, "ignore_eos": True}
        if seed is not None:
            options["seed"] = seed
        got = _generated(client, model, prompt, max_new_tokens=10, **options)
        expected = _reference_tokens(models[model], prompt, 10, seed=seed, temperature=temperature)
        assert got == expected, (model, seed)


def test_streams_of_different_lengths_step_together_each_as_alone(
    client: LmServeClient, models: dict[str, Any], tokenizers: dict[str, Tokenizer]
) -> None:
    """Concurrent streams share batched steps (left-padded caches, own position ids); each
    gets exactly the tokens it gets alone."""
    prompts = [tokenizers["tiny-llama"].encode(t).ids for t in TEXTS]
    with ThreadPoolExecutor(len(prompts)) as pool:
        futures = [
            pool.submit(
                _generated,
                client,
                "tiny-llama",
                p,
                max_new_tokens=12,
                temperature=0.0,
                ignore_eos=True,
            )
            for p in prompts
        ]
        got = [f.result() for f in futures]
    for prompt, tokens in zip(prompts, got, strict=True):
        expected = _reference_tokens(models["tiny-llama"], prompt, 12, seed=None, temperature=0.0)
        assert tokens == expected


def test_a_sample_stops_at_the_models_last_position(
    client: LmServeClient, tokenizers: dict[str, Tokenizer]
) -> None:
    prompt = tokenizers["tiny-gpt2"].encode(TEXTS[3]).ids
    room = POSITIONS - (1 + len(prompt)) + 1
    events = list(
        client.generate("tiny-gpt2", prompt, max_new_tokens=200, temperature=0.0, ignore_eos=True)
    )
    tokens = [e for e in events if isinstance(e, GeneratedToken)]
    [finish] = [e for e in events if isinstance(e, GenerationFinished)]
    assert len(tokens) == room
    assert finish.reason == "length"


def test_a_prompt_longer_than_the_positions_is_refused(
    client: LmServeClient, tokenizers: dict[str, Tokenizer]
) -> None:
    prompt = tokenizers["tiny-gpt2"].encode(" ".join(TEXTS * 2)).ids
    assert len(prompt) >= POSITIONS
    with pytest.raises(InvalidArgumentError, match=f"the model has {POSITIONS} .max_positions"):
        list(client.generate("tiny-gpt2", prompt, max_new_tokens=4))


def test_admission_refuses_a_request_whose_cache_could_never_fit(
    client: LmServeClient, stub: lm_service_pb2_grpc.LanguageModelServiceStub
) -> None:
    info = stub.GetModel(pb.GetModelRequest(model="tiny-gpt2")).model.transformer
    per_sample = POSITIONS * info.cache_bytes_per_position
    assert 2 * per_sample <= CACHE_BUDGET < 4 * per_sample
    with pytest.raises(ResourceExhaustedError, match="key/value cache"):
        list(client.generate("tiny-gpt2", [5, 6], max_new_tokens=200, n=4, ignore_eos=True))
    events = list(client.generate("tiny-gpt2", [5, 6], max_new_tokens=200, n=2, ignore_eos=True))
    finished = [e for e in events if isinstance(e, GenerationFinished)]
    assert len(finished) == 2


@pytest.mark.parametrize("model", ["tiny-gpt2", "tiny-llama"])
def test_beam_search_scores_are_transformers(
    client: LmServeClient, models: dict[str, Any], tokenizers: dict[str, Tokenizer], model: str
) -> None:
    prompt = tokenizers[model].encode("And God").ids
    _, eos = _specials(models[model])
    got = client.beam_search(model, prompt, beam_width=4, max_length=5, num_return=3)
    assert len(got) == 3 and len({h.token_ids for h in got}) == 3
    bos, _ = _specials(models[model])
    for hypothesis in got:
        ids = list(hypothesis.token_ids)
        lp = _log_probs(models[model], [bos, *prompt, *ids])
        steps = range(len(prompt), len(prompt) + len(ids))
        expected = sum(lp[t, w] for t, w in zip(steps, ids, strict=True))
        if hypothesis.finish_reason == "end_of_sentence" and eos not in ids:
            expected += lp[len(prompt) + len(ids), eos]
        assert hypothesis.log_prob == pytest.approx(expected, abs=1e-4)


def test_rerank_shares_the_common_prefix_and_equals_transformers(
    client: LmServeClient, models: dict[str, Any], tokenizers: dict[str, Tokenizer]
) -> None:
    n_best = [
        "And God said, Let there be light: and there was light.",
        "And God said, Let there be light and there was light",
        "And God said, Let there be night: and there was light.",
        "And God said, Let there be",
    ]
    acoustic = [-1.0, -1.5, -0.5, -4.0]
    [reranked] = client.rerank(
        "tiny-gpt2",
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
    by_index = {h.index: h for h in reranked.hypotheses}
    for i, text in enumerate(n_best):
        lm = sum(_token_log_probs(models["tiny-gpt2"], tokenizers["tiny-gpt2"].encode(text).ids))
        assert by_index[i].lm_log_prob == pytest.approx(lm, abs=1e-3)
        assert by_index[i].combined_score == pytest.approx(acoustic[i] + 0.5 * lm, abs=1e-3)


def _best_path_log_prob(model: Any, tokenizer: Tokenizer, context: list[int], word: str) -> float:
    """log P(the word, then a word boundary | context), over its best spelling in pieces:
    every way to cut ' word' into tokens of the vocabulary (the first piece carrying the
    space), each path's log-prob by transformers, the boundary being any piece that starts
    with whitespace or </s>."""
    bos, eos = _specials(model)
    vocab = tokenizer.get_vocab()
    text_of = {i: tokenizer.decode([i]) for i in vocab.values()}
    by_text: dict[str, list[int]] = {}
    for i, t in text_of.items():
        by_text.setdefault(t, []).append(i)
    closes = [i for i, t in text_of.items() if t[:1].isspace()] + [eos]
    spelled = " " + word

    def paths(rest: str, first: bool) -> Iterator[list[int]]:
        if not rest:
            yield []
            return
        for cut in range(1 if not first else 2, len(rest) + 1):
            for piece in by_text.get(rest[:cut], []):
                if piece in (bos, eos):
                    continue
                for tail in paths(rest[cut:], False):
                    yield [piece, *tail]

    best = -np.inf
    for path in paths(spelled, True):
        lp = _log_probs(model, [bos, *context, *path])
        n = len(context)
        total = sum(lp[n + k, t] for k, t in enumerate(path))
        end = lp[n + len(path)][sorted(set(closes))]
        total += float(np.log(np.exp(end).sum()))
        best = max(best, total)
    return float(best)


def test_complete_offers_whole_words_with_their_probability(
    stub: lm_service_pb2_grpc.LanguageModelServiceStub,
    models: dict[str, Any],
    tokenizers: dict[str, Tokenizer],
) -> None:
    context = "And God said, Let there be"
    outbox: queue.Queue[pb.CompleteRequest | None] = queue.Queue()
    answers = stub.Complete(iter(outbox.get, None), timeout=60)
    outbox.put(pb.CompleteRequest(model="tiny-gpt2", append_text=context, k=3))
    first = next(answers)
    outbox.put(pb.CompleteRequest(partial_word="li", k=2))
    second = next(answers)
    outbox.put(None)
    model, tokenizer = models["tiny-gpt2"], tokenizers["tiny-gpt2"]
    ids = tokenizer.encode(context).ids
    for answer, prefix in ((first, ""), (second, "li")):
        words = [c.word for c in answer.completions]
        assert words and all(w.startswith(prefix) and " " not in w for w in words)
        lps = [c.log_prob for c in answer.completions]
        assert lps == sorted(lps, reverse=True)
        for completion in answer.completions:
            expected = _best_path_log_prob(model, tokenizer, ids, completion.word)
            assert completion.log_prob == pytest.approx(expected, abs=1e-4), completion.word
    # No word of the corpus that starts with "li" beats the answer's last.
    corpus_words = {w for t in TEXTS for w in t.split() if w.startswith("li")}
    worst = second.completions[-1].log_prob
    for word in corpus_words - {c.word for c in second.completions}:
        assert _best_path_log_prob(model, tokenizer, ids, word) <= worst + 1e-6


def test_get_model_reports_the_transformer_and_where_it_came_from(
    stub: lm_service_pb2_grpc.LanguageModelServiceStub,
) -> None:
    infos = {m.name: m for m in stub.ListModels(pb.ListModelsRequest()).models}
    assert set(infos) == set(MODELS)
    for name, info in infos.items():
        assert info.state == pb.MODEL_STATE_READY, (name, info.load_error)
        assert info.kind == pb.MODEL_KIND_TRANSFORMER
        assert info.format == pb.MODEL_FORMAT_ONNX
        assert info.tokenizer.kind == pb.TOKENIZER_KIND_HUGGINGFACE
        assert info.transformer.max_positions == POSITIONS
        assert info.transformer.num_layers == 2
    gpt2, llama = infos["tiny-gpt2"], infos["tiny-llama"]
    assert gpt2.transformer.architecture == "GPT2LMHeadModel"
    assert llama.transformer.architecture == "LlamaForCausalLM"
    assert (llama.transformer.kv_heads, llama.transformer.head_dim) == (2, 8)
    assert llama.transformer.cache_bytes_per_position == 2 * 2 * 2 * 8 * 4
    assert gpt2.special_tokens.bos == gpt2.special_tokens.eos == "<|endoftext|>"
    assert "GPT2LMHeadModel" in gpt2.provenance.source
    for name in ("tiny-gpt2", "tiny-llama"):
        parity = infos[name].provenance.parity
        assert set(parity) == {
            "one_pass_max_abs_diff_nats",
            "two_chunks_max_abs_diff_nats",
            "left_padded_max_abs_diff_nats",
        }
        assert all(0 <= v <= 1e-4 for v in parity.values())
    for name in ("optimum-gpt2", "optimum-llama"):
        assert infos[name].provenance.source.startswith("optimum ONNX export")
        assert not infos[name].provenance.parity  # nothing was checked on the way in
        assert not infos[name].transformer.HasField("optimization")  # served as optimum wrote
    # What `lmserve optimize` fused (ONNX Runtime's optimizer), counted in the graph served,
    # and its parity against the graph optimum wrote.
    fused = infos["optimum-llama-fused"]
    assert fused.transformer.optimization.optimizer == "onnxruntime.transformers"
    assert dict(fused.transformer.optimization.fused_ops) == {
        "SkipSimplifiedLayerNormalization": 4,
        "SimplifiedLayerNormalization": 1,
        "RotaryEmbedding": 4,
    }
    assert fused.provenance.parity
    assert all(0 <= v <= 1e-4 for v in fused.provenance.parity.values())


def test_the_client_types_carry_the_transformer(client: LmServeClient) -> None:
    info = client.get_model("tiny-llama")
    assert info.kind == "transformer" and info.tokenizer.kind == "huggingface"
    assert info.transformer is not None
    assert (info.transformer.architecture, info.transformer.max_positions) == (
        "LlamaForCausalLM",
        POSITIONS,
    )
    assert client.get_model("tiny-gpt2").transformer.kv_heads == 4  # type: ignore[union-attr]
    fused = client.get_model("optimum-llama-fused").transformer
    assert fused is not None and fused.optimization is not None
    assert fused.optimization.fused_ops["RotaryEmbedding"] == 4


def test_the_openai_route_scores_and_generates_with_a_transformer(
    server: BackgroundServer, models: dict[str, Any], tokenizers: dict[str, Tokenizer]
) -> None:
    def post(body: dict[str, Any]) -> Any:
        request = urllib.request.Request(
            f"http://127.0.0.1:{server.http_port}/v1/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.load(response)

    text = TEXTS[0]
    echo = post({"model": "tiny-llama", "prompt": text, "max_tokens": 0, "echo": True,
                 "logprobs": 0})  # fmt: skip
    ids = tokenizers["tiny-llama"].encode(text).ids
    expected = _token_log_probs(models["tiny-llama"], ids)[:-1]
    np.testing.assert_allclose(echo["choices"][0]["logprobs"]["token_logprobs"], expected,
                               atol=1e-4)  # fmt: skip
    made = post({"model": "tiny-llama", "prompt": "And God", "max_tokens": 5, "temperature": 0})
    prompt = tokenizers["tiny-llama"].encode("And God").ids
    tokens = _reference_tokens(models["tiny-llama"], prompt, 5, seed=None, temperature=0.0)
    assert made["choices"][0]["text"] == tokenizers["tiny-llama"].decode(tokens)
    # Echoed, the completion follows the prompt with the spacing its own tokens carry.
    echoed = post({"model": "tiny-llama", "prompt": "And God", "max_tokens": 5, "temperature": 0,
                   "echo": True})  # fmt: skip
    assert echoed["choices"][0]["text"] == tokenizers["tiny-llama"].decode(prompt + tokens)


def test_bos_off_reads_the_first_token_as_the_context(
    stub: lm_service_pb2_grpc.LanguageModelServiceStub,
    models: dict[str, Any],
    tokenizers: dict[str, Tokenizer],
) -> None:
    options = pb.ScoreOptions(bos=False, eos=True)
    request = pb.ScoreRequest(model="tiny-gpt2", texts=[TEXTS[0]], options=options)
    [result] = stub.Score(request).results
    ids = tokenizers["tiny-gpt2"].encode(TEXTS[0]).ids
    _, end = _specials(models["tiny-gpt2"])
    lp = _log_probs(models["tiny-gpt2"], ids)
    wanted = [*ids[1:], end]  # the first token is read, not scored
    assert result.token_count == len(wanted)
    assert result.log_prob == pytest.approx(sum(lp[t, w] for t, w in enumerate(wanted)), abs=1e-3)
    with pytest.raises(grpc.RpcError) as caught:  # nothing to read from
        stub.Score(pb.ScoreRequest(model="tiny-gpt2", texts=["light", ""], options=options))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "texts[1]" in (caught.value.details() or "")


def test_bias_phrases_match_whitespace_words_over_byte_level_pieces(
    client: LmServeClient,
) -> None:
    """Biasing matches words, whatever pieces the tokenizer cuts them into (casefolded)."""
    n_best = [
        "And God said Let there be light",
        "and god said let there be night",
        "And GOD divided the light",
        "God said, light",  # "said," is a word of its own: words are what whitespace splits
    ]
    bias = {"god said": 2.0, "light": 1.5, "divided": 0.5}
    lists = [{"id": "u", "hypotheses": [{"text": t} for t in n_best]}]
    [plain] = client.rerank("tiny-gpt2", lists, lm_weight=1.0)
    [biased] = client.rerank("tiny-gpt2", lists, lm_weight=1.0, bias=bias)
    before = {h.index: h for h in plain.hypotheses}
    after = {h.index: h for h in biased.hypotheses}
    for index, boost in {0: 3.5, 1: 2.0, 2: 2.0, 3: 1.5}.items():
        assert after[index].bias == pytest.approx(boost)
        assert after[index].lm_log_prob == pytest.approx(before[index].lm_log_prob, abs=1e-6)
        assert after[index].combined_score == pytest.approx(
            before[index].combined_score + boost, abs=1e-6
        )


def test_beam_search_and_complete_refuse_a_context_past_the_positions(
    client: LmServeClient,
    stub: lm_service_pb2_grpc.LanguageModelServiceStub,
    tokenizers: dict[str, Tokenizer],
) -> None:
    long = " ".join(TEXTS * 2)
    prompt = tokenizers["tiny-llama"].encode(long).ids
    with pytest.raises(InvalidArgumentError, match="max_positions"):
        client.beam_search("tiny-llama", prompt, beam_width=2, max_length=3)
    # A search near the end stops at the last position.
    near = prompt[: POSITIONS - 3]
    hypotheses = client.beam_search("tiny-llama", near, beam_width=2, max_length=10)
    assert all(len(h.token_ids) <= POSITIONS - (1 + len(near)) + 1 for h in hypotheses)
    outbox: queue.Queue[pb.CompleteRequest | None] = queue.Queue()
    answers = stub.Complete(iter(outbox.get, None), timeout=60)
    outbox.put(pb.CompleteRequest(model="tiny-llama", append_text=long, k=3))
    with pytest.raises(grpc.RpcError) as caught:
        next(answers)
    outbox.put(None)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"more than the limit of {POSITIONS - 1}" in caught.value.details()


def test_a_backspace_slices_the_session_cache_and_answers_as_a_fresh_session(
    stub: lm_service_pb2_grpc.LanguageModelServiceStub, tokenizers: dict[str, Tokenizer]
) -> None:
    def ask(requests: list[pb.CompleteRequest]) -> list[pb.CompleteResponse]:
        outbox: queue.Queue[pb.CompleteRequest | None] = queue.Queue()
        answers = stub.Complete(iter(outbox.get, None), timeout=60)
        got = []
        for request in requests:
            outbox.put(request)
            got.append(next(answers))
        outbox.put(None)
        return got

    full = tokenizers["tiny-llama"].encode("And God said, Let there").ids
    short = tokenizers["tiny-llama"].encode("And God said").ids
    assert full[: len(short)] == short
    back_tokens = len(full) - len(short)
    typed = ask(
        [
            pb.CompleteRequest(model="tiny-llama", append_text="And God said, Let there", k=4),
            pb.CompleteRequest(rollback_tokens=back_tokens, k=4),
            pb.CompleteRequest(rollback_tokens=1, append_text=" the", k=4),
        ]
    )
    fresh = ask([pb.CompleteRequest(model="tiny-llama", append_text="And God said", k=4)])
    back = [(c.word, round(c.log_prob, 4)) for c in typed[1].completions]
    assert back == [(c.word, round(c.log_prob, 4)) for c in fresh[0].completions]
    # Rollback counts tokens: the context is now `short` less its last piece, then " the".
    tokenizer = tokenizers["tiny-llama"]
    pieces = [tokenizer.id_to_token(i) for i in short[:-1] + tokenizer.encode(" the").ids]
    again = ask([pb.CompleteRequest(model="tiny-llama", append_tokens=pieces, k=4)])
    after = [(c.word, round(c.log_prob, 4)) for c in typed[2].completions]
    assert after == [(c.word, round(c.log_prob, 4)) for c in again[0].completions]


def test_the_tokenizer_endpoints_speak_the_checkpoints_tokens(
    server: BackgroundServer, tokenizers: dict[str, Tokenizer]
) -> None:
    base = f"http://127.0.0.1:{server.http_port}"
    body = json.dumps({"model": "tiny-gpt2", "prompt": "And God said"}).encode()
    request = urllib.request.Request(
        f"{base}/tokenize", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        answer = json.load(response)
    assert answer["tokens"] == tokenizers["tiny-gpt2"].encode("And God said").ids
    assert answer["max_model_len"] == POSITIONS - 1  # <s> takes the first position
    with urllib.request.urlopen(f"{base}/tokenizer_info?model=tiny-gpt2", timeout=30) as response:
        info = json.load(response)
    assert info["bos_token"] == info["eos_token"] == "<|endoftext|>"
    assert info["tokenizer_class"] == "huggingface"
    assert info["model_max_length"] == POSITIONS - 1
