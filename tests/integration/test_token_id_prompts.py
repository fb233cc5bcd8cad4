"""Token-id prompts on transformers imported from Hugging Face checkpoints (tiny GPT-2 and
Llama, `hf_models`), served by a real server on a real port, one model each (so the tokenizer
endpoints need no model name, as lm-evaluation-harness's remote tokenizer calls them).

A prompt of ids is scored on exactly those ids, as vLLM scores it: a leading `<s>` id is the
start (null log-prob), else the first id is the context (null log-prob). Every figure is
compared with transformers' own forward on the same ids, and lm-evaluation-harness's `hf` model
with its `local-completions` model against the served checkpoint."""

from __future__ import annotations

import json
import math
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import torch
from hf_models import load
from served import ServerFactory
from tokenizers import Tokenizer

from lmserve.server.front.process.app import BackgroundServer
from lmserve.v1 import lm_service_pb2 as pb
from lmserve.v1 import lm_service_pb2_grpc

SENTENCE = "And God said, Let there be light"
# Multiple choice: context, choices, the right one (what the harness's `hf` model picks is
# compared, not this label).
CHOICES = [
    ("In the beginning God created the", [" heaven", " earth", " light"]),
    ("And God said, Let there be", [" light", " darkness", " form"]),
    ("And the earth was without", [" form", " light", " God"]),
    ("And God saw the light, that it was", [" good", " void", " deep"]),
    ("", [" And", " darkness"]),
]
TEXTS = [
    "And God said, Let there be light: and there was light.",
    "And the earth was without form, and void.",
    "In the beginning God created the heaven and the earth.",
]
BUILDS = ["gpt2", "llama"]


@pytest.fixture(scope="module", params=BUILDS)
def build(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def folders(
    build: str,
    tmp_path_factory: pytest.TempPathFactory,
    hf_checkpoints: dict[str, Path],
    hf_folders: dict[str, Path],
) -> tuple[Path, Path]:
    """The checkpoint and its imported model folder (the session's), alone in its repository."""
    models = tmp_path_factory.mktemp(f"ids-{build}") / "models"
    models.mkdir()
    (models / f"tiny-{build}").symlink_to(hf_folders[build], target_is_directory=True)
    return hf_checkpoints[build], models


@pytest.fixture(scope="module")
def server(serve: ServerFactory, folders: tuple[Path, Path]) -> Iterator[BackgroundServer]:
    # Its own (no other module serves this repository), stopped when the module ends.
    with serve.private(folders[1]) as running:
        yield running


@pytest.fixture(scope="module")
def model(folders: tuple[Path, Path]) -> Any:
    return load(folders[0])


@pytest.fixture(scope="module")
def tokenizer(folders: tuple[Path, Path]) -> Tokenizer:
    return Tokenizer.from_file(str(folders[0] / "tokenizer.json"))


def _post(server: BackgroundServer, path: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(
        f"http://127.0.0.1:{server.http_port}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response)


def _echo(server: BackgroundServer, build: str, prompt: str | list[int]) -> dict[str, Any]:
    body = {"model": f"tiny-{build}", "prompt": prompt, "max_tokens": 0, "echo": True}
    answer = _post(server, "/v1/completions", {**body, "logprobs": 1})
    logprobs: dict[str, Any] = answer["choices"][0]["logprobs"]
    return logprobs


def _forward(model: Any, ids: list[int]) -> list[float]:
    """transformers' log P(ids[i] | ids[:i]) for i >= 1: exactly the ids, nothing added."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]
    lp = torch.log_softmax(logits.double(), dim=-1).numpy()
    return [float(lp[i - 1, ids[i]]) for i in range(1, len(ids))]


def test_a_token_id_prompt_is_scored_on_exactly_its_ids(
    server: BackgroundServer, build: str, model: Any, tokenizer: Tokenizer
) -> None:
    ids = tokenizer.encode(SENTENCE).ids
    echoed = _echo(server, build, ids)
    assert echoed["tokens"] == [tokenizer.decode([i]) for i in ids]
    assert "".join(echoed["tokens"]) == SENTENCE
    assert echoed["token_logprobs"][0] is None  # nothing before it to predict it from
    np.testing.assert_allclose(echoed["token_logprobs"][1:], _forward(model, ids), atol=1e-4)


def test_a_leading_start_id_is_the_start_and_matches_the_text_prompt(
    server: BackgroundServer, build: str, model: Any, tokenizer: Tokenizer
) -> None:
    ids = tokenizer.encode(SENTENCE).ids
    bos = int(model.config.bos_token_id)
    echoed = _echo(server, build, [bos, *ids])
    assert len(echoed["tokens"]) == len(ids) + 1
    assert echoed["token_logprobs"][0] is None
    expected = _forward(model, [bos, *ids])
    np.testing.assert_allclose(echoed["token_logprobs"][1:], expected, atol=1e-4)
    # A text is read from <s> too, and the tokenizer cuts it into these very ids.
    text = _echo(server, build, SENTENCE)
    assert text["tokens"] == echoed["tokens"][1:]
    np.testing.assert_allclose(text["token_logprobs"], echoed["token_logprobs"][1:], atol=1e-9)


def test_score_takes_token_ids_and_refuses_one_out_of_range(
    server: BackgroundServer, build: str, model: Any, tokenizer: Tokenizer
) -> None:
    ids = tokenizer.encode(SENTENCE).ids
    name = f"tiny-{build}"
    with grpc.insecure_channel(server.address) as channel:
        stub = lm_service_pb2_grpc.LanguageModelServiceStub(channel)
        answer = stub.Score(
            pb.ScoreRequest(
                model=name,
                token_ids=[pb.TokenIds(ids=ids)],
                options=pb.ScoreOptions(eos=False),
                return_tokens=True,
            )
        )
        [result] = answer.results
        assert list(result.details.token_ids) == ids
        bos = int(model.config.bos_token_id)
        np.testing.assert_allclose(
            result.details.log_probs, _forward(model, [bos, *ids]), atol=1e-4
        )
        # bos off: the first id is the context, the ids after it are scored.
        off = stub.Score(
            pb.ScoreRequest(
                model=name,
                token_ids=[pb.TokenIds(ids=ids)],
                options=pb.ScoreOptions(bos=False, eos=False),
                return_tokens=True,
            )
        ).results[0]
        assert off.token_count == len(ids) - 1
        assert list(off.details.token_ids) == ids[1:]
        np.testing.assert_allclose(off.details.log_probs, _forward(model, ids), atol=1e-4)
        with pytest.raises(grpc.RpcError) as caught:
            bad = pb.TokenIds(ids=[ids[0], 10**6])
            stub.Score(pb.ScoreRequest(model=name, token_ids=[bad]))
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "token_ids[0].ids[1]" in (caught.value.details() or "")


def test_tokenize_detokenize_and_id_prompted_generation_are_exact(
    server: BackgroundServer, build: str, model: Any, tokenizer: Tokenizer
) -> None:
    ids = _post(server, "/tokenize", {"prompt": SENTENCE})["tokens"]
    assert ids == tokenizer.encode(SENTENCE).ids
    assert _post(server, "/detokenize", {"tokens": ids})["prompt"] == SENTENCE
    bos = int(model.config.bos_token_id)
    with_start = _post(server, "/tokenize", {"prompt": SENTENCE, "add_special_tokens": True})
    assert with_start["tokens"] == [bos, *ids]
    # Greedy generation from the ids with their start equals the text prompt's, and
    # transformers' own greedy continuation of `<s> ids` (the start read once, not twice).
    body = {"model": f"tiny-{build}", "max_tokens": 6, "temperature": 0}
    from_ids = _post(server, "/v1/completions", {**body, "prompt": [bos, *ids]})
    from_text = _post(server, "/v1/completions", {**body, "prompt": SENTENCE})
    assert from_ids["choices"][0]["text"] == from_text["choices"][0]["text"]
    read = [bos, *ids]
    with torch.no_grad():
        for _ in range(6):
            read.append(int(model(torch.tensor([read])).logits[0, -1].argmax()))
    assert from_ids["choices"][0]["text"] == tokenizer.decode(read[len(ids) + 1 :])


# -- lm-evaluation-harness: its `hf` model against `local-completions` on the served model --


def _hf_tokenizer(folder: Path, build: str) -> Any:
    from transformers import PreTrainedTokenizerFast

    specials = (
        {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"}
        if build == "gpt2"
        else {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    )
    return PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"), **specials)


def _instances(kind: str, arguments: list[tuple[str, ...]]) -> list[Any]:
    from lm_eval.api.instance import Instance

    return [
        Instance(request_type=kind, doc={}, arguments=args, idx=i)  # type: ignore[arg-type]
        for i, args in enumerate(arguments)
    ]


def test_the_harness_hf_model_and_the_served_model_agree(
    server: BackgroundServer, build: str, model: Any, folders: tuple[Path, Path]
) -> None:
    from lm_eval.models.huggingface import HFLM
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    local = HFLM(pretrained=model, tokenizer=_hf_tokenizer(folders[0], build), batch_size=4)
    served = LocalCompletionsAPI(
        base_url=f"http://127.0.0.1:{server.http_port}/v1/completions",
        model=f"tiny-{build}",
        tokenizer_backend="remote",
        tokenized_requests=True,
        num_concurrent=1,
        max_retries=1,
        batch_size=4,
        max_length=64,
    )
    pairs = [(context, choice) for context, choices in CHOICES for choice in choices]
    ours = [lp for lp, _ in local.loglikelihood(_instances("loglikelihood", pairs))]
    theirs = [lp for lp, _ in served.loglikelihood(_instances("loglikelihood", pairs))]
    np.testing.assert_allclose(theirs, ours, atol=2e-3)
    picks = []
    at = 0
    for _, choices in CHOICES:
        picks.append(
            (
                int(np.argmax(ours[at : at + len(choices)])),
                int(np.argmax(theirs[at : at + len(choices)])),
            )
        )
        at += len(choices)
    assert [a for a, _ in picks] == [b for _, b in picks]  # the same accuracy, choice by choice
    texts = [(text,) for text in TEXTS]
    rolling_ours = local.loglikelihood_rolling(_instances("loglikelihood_rolling", texts))
    rolling_theirs = served.loglikelihood_rolling(_instances("loglikelihood_rolling", texts))
    words = sum(len(text.split()) for text in TEXTS)
    ppl_ours = math.exp(-sum(rolling_ours) / words)
    ppl_theirs = math.exp(-sum(rolling_theirs) / words)
    assert ppl_theirs == pytest.approx(ppl_ours, rel=1e-3)
