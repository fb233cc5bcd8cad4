"""The OpenAI-compatible API (/v1) through a real server, with the `openai` package as the client:
what it answers must be what the gRPC port answers for the same request (Score for echo,
Generate for completions), its errors OpenAI's, its streams OpenAI's server-sent events.

Models: the session server's `kjv3` (a word 3-gram) and the shipped `models/kjv-lstm`, served by
a server of this module with few generation slots and no queue (so overload is reachable) and
the engine in-process (so the tests can see its active sequences).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import AsyncGenerator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import openai
import pytest
from http_calls import post
from integration_data import AUTH_TOKEN
from prometheus_client import CollectorRegistry

from lmserve.server.errors import ModelOutputError
from lmserve.server.front.api.http.calls import HttpCalls
from lmserve.server.front.api.http.openai_api import DONE, CompletionAnswer
from lmserve.server.front.api.http.openai_completions import CompletionSteps, Piece, Step
from lmserve.server.front.api.http.openai_schema import parse_completion
from lmserve.server.front.api.observed_call import CallObserver
from lmserve.server.front.process.app import BackgroundServer, start_background_server
from lmserve.server.metrics import Metrics
from lmserve.server.settings import load_settings
from lmserve.v1 import lm_service_pb2 as pb
from lmserve.v1 import lm_service_pb2_grpc

REPO = Path(__file__).resolve().parents[2]
TOKEN = AUTH_TOKEN
PROMPT = "And God said unto Moses, zzqx"  # capitals, punctuation and an unknown word
SLOTS = 4
Stub = lm_service_pb2_grpc.LanguageModelServiceStub


@dataclass
class Target:
    model: str
    server: BackgroundServer
    client: openai.OpenAI
    stub: Stub


def _client(server: BackgroundServer, key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"http://127.0.0.1:{server.http_port}/v1", api_key=key, max_retries=0, timeout=30
    )


@pytest.fixture(scope="module")
def lstm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundServer]:
    root = tmp_path_factory.mktemp("openai-models")
    (root / "kjv-lstm").symlink_to(REPO / "models" / "kjv-lstm", target_is_directory=True)
    settings = {"model_repository": root, "host": "127.0.0.1", "port": 0, "http_port": 0}
    settings |= {"metrics_enabled": False, "engine_workers": False}
    settings |= {"max_active_sequences": SLOTS, "max_queued_requests": 0}
    settings |= {"max_new_tokens": 1_000_000}
    with start_background_server(load_settings(settings), registry=CollectorRegistry()) as s:
        yield s


@pytest.fixture(scope="module")
def lstm_stub(lstm_server: BackgroundServer) -> Iterator[Stub]:
    with grpc.insecure_channel(lstm_server.address) as channel:
        yield Stub(channel)


@pytest.fixture(scope="module")
def client(server: BackgroundServer) -> openai.OpenAI:
    return _client(server)


@pytest.fixture(params=["kjv3", "kjv-lstm"])
def target(
    request: pytest.FixtureRequest, server: BackgroundServer, client: openai.OpenAI, stub: Stub
) -> Target:
    if request.param == "kjv3":
        return Target("kjv3", server, client, stub)
    lstm = request.getfixturevalue("lstm_server")
    return Target("kjv-lstm", lstm, _client(lstm), request.getfixturevalue("lstm_stub"))


def _generate(stub: Stub, **fields: Any) -> tuple[list[pb.GeneratedToken], pb.GenerationFinished]:
    """One sample by gRPC Generate: its tokens and its end."""
    tokens, finished = [], []
    for message in stub.Generate(pb.GenerateRequest(**fields), timeout=30):
        tokens += message.tokens
        if message.HasField("finished"):
            finished.append(message.finished)
    [end] = finished
    return tokens, end


def _error(exc: openai.APIStatusError) -> dict[str, Any]:
    """The `error` object of an answer (the client keeps it as the exception's body)."""
    assert isinstance(exc.body, dict)
    return exc.body


def _events(port: int, body: dict[str, Any]) -> list[str]:
    """A raw streamed completion: its SSE `data:` payloads, in order."""
    status, headers, raw = post(
        port, "/v1/completions", json.dumps(body).encode(), {"content-type": "application/json"}
    )
    assert status == 200, raw
    assert headers["content-type"].startswith("text/event-stream")
    text = raw.decode()
    assert text.endswith("\n\n")
    return [event.removeprefix("data: ") for event in text[:-2].split("\n\n")]


# -- models -----------------------------------------------------------------------------------


def test_models_lists_the_ready_models(client: openai.OpenAI, stub: Stub) -> None:
    listed = client.models.list().data
    infos = stub.ListModels(pb.ListModelsRequest(), timeout=10).models
    ready = {m.name for m in infos if m.state == pb.MODEL_STATE_READY}
    assert ready and len(ready) < len(infos)  # the broken models are in the repository
    assert {m.id for m in listed} == ready
    assert all(m.object == "model" and m.owned_by == "lmserve" for m in listed)
    model = client.models.retrieve("kjv3")
    assert (model.id, model.object, model.owned_by) == ("kjv3", "model", "lmserve")
    assert isinstance(model.created, int)
    broken = client.models.retrieve("bad-checksum").model_dump()  # in the repository, not serving
    assert broken["ready"] is False and "sha256" in broken["load_error"]
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("no-such-model")
    assert "kjv3" in str(info.value.message)


# -- echo: the prompt scored exactly as Score scores it ---------------------------------------


def test_echo_scores_the_prompt_as_score_does(target: Target) -> None:
    done = target.client.completions.create(
        model=target.model, prompt=PROMPT, max_tokens=0, echo=True, logprobs=1
    )
    [choice] = done.choices
    request = pb.ScoreRequest(
        model=target.model, texts=[PROMPT], return_tokens=True, options=pb.ScoreOptions(eos=False)
    )
    [scored] = target.stub.Score(request, timeout=10).results
    assert choice.text == PROMPT and choice.finish_reason == "length"
    assert choice.logprobs is not None
    assert choice.logprobs.tokens == list(scored.details.tokens)
    assert "zzqx" in choice.logprobs.tokens  # the unknown word is scored as <unk>, named itself
    token_logprobs = choice.logprobs.token_logprobs or []
    assert len(token_logprobs) == len(scored.details.log_probs) == scored.token_count
    assert token_logprobs == pytest.approx(list(scored.details.log_probs), abs=1e-4)
    offsets = choice.logprobs.text_offset or []
    assert [
        PROMPT[o : o + len(t)].lower() for o, t in zip(offsets, choice.logprobs.tokens, strict=True)
    ] == [t.lower() for t in choice.logprobs.tokens]
    assert done.usage is not None
    assert (done.usage.prompt_tokens, done.usage.completion_tokens) == (scored.token_count, 0)


def test_echoed_positions_carry_the_models_top_alternatives(
    client: openai.OpenAI, stub: Stub
) -> None:
    """What lm-evaluation-harness reads: each echoed position's N most probable tokens, each
    checked here against Score of the prefix followed by that token (another code path)."""
    prompt = "and god said unto moses"
    done = client.completions.create(
        model="kjv3", prompt=prompt, max_tokens=0, echo=True, logprobs=3
    )
    logprobs = done.choices[0].logprobs
    assert logprobs is not None and logprobs.top_logprobs and logprobs.token_logprobs
    tokens = logprobs.tokens or []
    for i, (top, own) in enumerate(
        zip(logprobs.top_logprobs, logprobs.token_logprobs, strict=True)
    ):
        assert top is not None and len(top) == 3
        assert own is not None and max(top.values()) >= own - 1e-9  # the top is the top
        if tokens[i] in top:
            assert top[tokens[i]] == own  # the same number, so a greedy check can compare
        lists = [pb.TokenList(tokens=[*tokens[:i], word]) for word in top]
        request = pb.ScoreRequest(
            model="kjv3", token_lists=lists, return_tokens=True, options=pb.ScoreOptions(eos=False)
        )
        scored = stub.Score(request, timeout=10).results
        expected = [result.details.log_probs[-1] for result in scored]
        assert list(top.values()) == pytest.approx(expected, abs=1e-4)
    assert "said" in logprobs.top_logprobs[2]  # "and god" -> "said" is among the likeliest


def test_echo_with_a_completion_joins_prompt_and_completion(target: Target) -> None:
    done = target.client.completions.create(
        model=target.model, prompt="and god said", max_tokens=4, temperature=0, echo=True
    )
    _, end = _generate(
        target.stub,
        model=target.model,
        prompt="and god said",
        sampling=pb.SamplingParams(temperature=0),
        stopping=pb.StoppingCriteria(max_new_tokens=4),
    )
    assert done.choices[0].text == f"and god said {end.text}"


# -- completions equal Generate -----------------------------------------------------------------


@pytest.mark.parametrize(
    "sampling",
    [{"temperature": 0.0}, {"temperature": 0.9, "seed": 7}, {"temperature": 1.0, "seed": 2}],
    ids=["greedy", "seeded", "seeded-2"],
)
def test_completions_equal_generate(target: Target, sampling: dict[str, Any]) -> None:
    done = target.client.completions.create(
        model=target.model, prompt="and god said", max_tokens=12, logprobs=0, **sampling
    )
    tokens, end = _generate(
        target.stub,
        model=target.model,
        prompt="and god said",
        sampling=pb.SamplingParams(**sampling),
        stopping=pb.StoppingCriteria(max_new_tokens=12),
        logprobs=True,
    )
    [choice] = done.choices
    assert choice.text == end.text and choice.text
    assert choice.logprobs is not None
    texts, log_probs = [t.text for t in tokens], [t.log_prob for t in tokens]
    if end.reason == pb.FINISH_REASON_END_OF_SENTENCE:
        # The `</s>` it generated is listed last (not in the text): the rest of its total.
        texts.append("</s>")
        log_probs.append(end.log_prob - sum(log_probs))
    assert choice.logprobs.tokens == texts
    assert choice.logprobs.token_logprobs == pytest.approx(log_probs, abs=1e-9)
    expected = {pb.FINISH_REASON_LENGTH: "length", pb.FINISH_REASON_END_OF_SENTENCE: "stop"}
    assert choice.finish_reason == expected[end.reason]
    assert done.usage is not None
    assert done.usage.completion_tokens == end.usage.generated_tokens == len(tokens)
    assert done.usage.prompt_tokens == end.usage.prompt_tokens == 3
    assert done.usage.total_tokens == 3 + len(tokens)


def test_vllm_extras_reach_generate(target: Target) -> None:
    extras = {"top_k": 5, "min_p": 0.05, "typical_p": 0.9, "repetition_penalty": 1.3}
    done = target.client.completions.create(
        model=target.model, prompt="and god", max_tokens=10, seed=11, extra_body=extras
    )
    _, end = _generate(
        target.stub,
        model=target.model,
        prompt="and god",
        sampling=pb.SamplingParams(seed=11, **extras),
        stopping=pb.StoppingCriteria(max_new_tokens=10),
    )
    assert done.choices[0].text == end.text
    plain = target.client.completions.create(
        model=target.model, prompt="and god", max_tokens=10, seed=11
    )
    _, unfiltered = _generate(
        target.stub,
        model=target.model,
        prompt="and god",
        sampling=pb.SamplingParams(seed=11),
        stopping=pb.StoppingCriteria(max_new_tokens=10),
    )
    assert plain.choices[0].text == unfiltered.text
    # top_k 1 is greedy whatever the temperature; ignore_eos with min_tokens runs to the length.
    top1 = target.client.completions.create(
        model=target.model, prompt="and god", max_tokens=6, seed=3, extra_body={"top_k": 1}
    )
    greedy = target.client.completions.create(
        model=target.model, prompt="and god", max_tokens=6, temperature=0
    )
    assert top1.choices[0].text == greedy.choices[0].text
    long = target.client.completions.create(
        model=target.model,
        prompt="and god",
        max_tokens=40,
        seed=5,
        extra_body={"ignore_eos": True, "min_tokens": 40},
    )
    assert long.usage is not None and long.usage.completion_tokens == 40
    assert long.choices[0].finish_reason == "length"


# -- streaming ------------------------------------------------------------------------------------


def test_streaming_yields_the_same_text(target: Target) -> None:
    fields: dict[str, Any] = {"model": target.model, "prompt": "in the beginning"}
    fields |= {"max_tokens": 15, "seed": 4, "logprobs": 2}
    whole = target.client.completions.create(**fields)
    chunks = list(
        target.client.completions.create(
            **fields, stream=True, stream_options={"include_usage": True}
        )
    )
    *parts, last = chunks
    assert "".join(c.choices[0].text for c in parts) == whole.choices[0].text
    assert [t for c in parts for t in (c.choices[0].logprobs.tokens or [])] == (
        whole.choices[0].logprobs.tokens  # type: ignore[union-attr]
    )
    assert parts[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    assert all(c.choices[0].finish_reason is None for c in parts[:-1])
    assert last.choices == [] and last.usage == whole.usage
    events = _events(target.server.http_port or 0, fields | {"stream": True})
    assert events[-1] == "[DONE]"
    decoded = [json.loads(e) for e in events[:-1]]
    assert all(d["object"] == "text_completion" and "usage" not in d for d in decoded)
    assert "".join(d["choices"][0]["text"] for d in decoded) == whole.choices[0].text


def test_a_failure_mid_stream_is_one_error_event_then_done() -> None:
    # No request a real model answers fails once streaming, so the stream's writer is driven
    # here by a prompt whose generation fails after its first token.
    metrics = Metrics(CollectorRegistry())

    async def failing() -> AsyncGenerator[Step, None]:
        yield [(0, Piece(text="and", tokens=["and"], offsets=[0]))]
        raise ModelOutputError("the model produced NaN for this sequence")

    async def events() -> list[str]:
        steps = CompletionSteps([failing()])
        await steps.start()
        call = contextlib.AsyncExitStack()
        calls = HttpCalls(CallObserver(metrics, front="http"), None)
        await call.enter_async_context(calls.call("Completions", {}))
        body = parse_completion(b'{"model": "m", "prompt": "a", "stream": true}')
        return [e async for e in CompletionAnswer(body, "r1", 1).events(call, steps)]

    first, error, done = asyncio.run(events())
    assert json.loads(first.removeprefix("data: "))["choices"][0]["text"] == "and"
    assert error.startswith("data: ") and error.endswith("\n\n")
    assert json.loads(error.removeprefix("data: ")) == {
        "error": {
            "message": "the model produced NaN for this sequence",
            "type": "server_error",
            "param": None,
            "code": "internal",
        }
    }
    assert done == DONE == "data: [DONE]\n\n"
    labels = {"method": "Completions", "model": "", "code": "INTERNAL", "front": "http"}
    assert metrics.registry.get_sample_value("lmserve_requests_total", labels) == 1


def test_streamed_echo_comes_first(client: openai.OpenAI) -> None:
    chunks = list(
        client.completions.create(
            model="kjv3", prompt="and god said", max_tokens=3, echo=True, stream=True, seed=1
        )
    )
    assert chunks[0].choices[0].text == "and god said"
    whole = client.completions.create(
        model="kjv3", prompt="and god said", max_tokens=3, echo=True, seed=1
    )
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text


# -- logprobs, n, several prompts, stop -------------------------------------------------------


def test_logprobs_gives_the_top_alternatives(target: Target) -> None:
    done = target.client.completions.create(
        model=target.model, prompt="and the king", max_tokens=8, temperature=0, logprobs=3
    )
    logprobs = done.choices[0].logprobs
    assert logprobs is not None and logprobs.top_logprobs and logprobs.token_logprobs
    count = len(logprobs.tokens or [])
    assert len(logprobs.top_logprobs) == len(logprobs.token_logprobs) == count >= 3
    for chosen, top in zip(logprobs.token_logprobs, logprobs.top_logprobs, strict=True):
        assert top is not None and len(top) == 3
        assert all(v <= 0 for v in top.values())
        assert sum(2.718281828459045**v for v in top.values()) <= 1 + 1e-6  # natural logs
        assert chosen == pytest.approx(max(top.values()))  # greedy took the best
    assert logprobs.text_offset == [
        sum(len(t) for t in (logprobs.tokens or [])[:k]) for k in range(count)
    ]


def test_n_and_several_prompts_give_a_choice_each(client: openai.OpenAI) -> None:
    three = client.completions.create(
        model="kjv3", prompt="and god said", max_tokens=10, n=3, seed=9
    )
    assert [c.index for c in three.choices] == [0, 1, 2]
    assert len({c.text for c in three.choices}) > 1  # independent samples
    prompts = ["and god said", "in the beginning"]
    both = client.completions.create(model="kjv3", prompt=prompts, max_tokens=5, n=2, temperature=0)
    assert [c.index for c in both.choices] == [0, 1, 2, 3]
    generated = 0
    for i, prompt in enumerate(prompts):
        alone = client.completions.create(model="kjv3", prompt=prompt, max_tokens=5, temperature=0)
        assert [c.text for c in both.choices[2 * i : 2 * i + 2]] == [alone.choices[0].text] * 2
        assert alone.usage is not None
        generated += 2 * alone.usage.completion_tokens
    assert both.usage is not None
    assert (both.usage.prompt_tokens, both.usage.completion_tokens) == (6, generated)
    assert generated > 4


def test_token_id_prompts(client: openai.OpenAI, stub: Stub) -> None:
    request = pb.ScoreRequest(
        model="kjv3", texts=["and god said"], return_tokens=True, options=pb.ScoreOptions(eos=False)
    )
    [scored] = stub.Score(request, timeout=10).results
    ids = list(scored.details.token_ids)
    by_text = client.completions.create(
        model="kjv3", prompt="and god said", max_tokens=5, temperature=0
    )
    for prompt in (ids, [ids]):
        by_ids = client.completions.create(model="kjv3", prompt=prompt, max_tokens=5, temperature=0)
        assert by_ids.choices[0].text == by_text.choices[0].text
    # Echoed, token ids score exactly as the text they are (what evaluation clients send).
    fields: dict[str, Any] = {"model": "kjv3", "max_tokens": 0, "echo": True, "logprobs": 1}
    echoed_text = client.completions.create(prompt="and god said", **fields).choices[0]
    echoed_ids = client.completions.create(prompt=ids, **fields).choices[0]
    assert echoed_ids.text == echoed_text.text == "and god said"
    assert echoed_ids.logprobs is not None and echoed_text.logprobs is not None
    assert echoed_ids.logprobs.tokens == echoed_text.logprobs.tokens
    assert echoed_ids.logprobs.token_logprobs == echoed_text.logprobs.token_logprobs
    with pytest.raises(openai.BadRequestError) as bad:
        client.completions.create(prompt=[10**9], **fields)
    assert "token id must be in" in _error(bad.value)["message"]


def test_stop_strings_end_the_text(client: openai.OpenAI) -> None:
    fields: dict[str, Any] = {"model": "kjv3", "prompt": "and god said", "max_tokens": 10}
    fields |= {"seed": 6, "extra_body": {"ignore_eos": True}}
    free = client.completions.create(**fields)
    text = free.choices[0].text
    words = text.split()
    stop = " " + words[3]
    for given in (stop, [stop, "qqqq"]):
        done = client.completions.create(**fields, stop=given)
        assert done.choices[0].text == text[: text.index(stop)]
        assert done.choices[0].finish_reason == "stop"


# -- errors ---------------------------------------------------------------------------------------


def test_errors_are_openai_errors(client: openai.OpenAI, server: BackgroundServer) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        client.completions.create(model="no-such-model", prompt="a")
    assert "kjv3" in missing.value.message and "test-nounk" in missing.value.message
    assert isinstance(missing.value.body, dict)
    assert (missing.value.body["param"], missing.value.body["code"]) == ("model", "model_not_found")
    with pytest.raises(openai.NotFoundError):  # refused before a stream begins: a status
        client.completions.create(model="no-such-model", prompt="a", stream=True)
    with pytest.raises(openai.BadRequestError) as bad:
        client.completions.create(model="kjv3", prompt="a", temperature=-1)
    assert isinstance(bad.value.body, dict)
    assert bad.value.body["param"] == "temperature"
    assert bad.value.body["type"] == "invalid_request_error"
    assert "temperature: must be >= 0" in bad.value.message
    for unsupported in ({"suffix": "x"}, {"best_of": 3}, {"logit_bias": {"5": 1.0}}):
        with pytest.raises(openai.BadRequestError) as refused:
            client.completions.create(model="kjv3", prompt="a", **unsupported)  # type: ignore[call-overload]
        [name] = unsupported
        assert _error(refused.value)["param"] == name
        assert _error(refused.value)["message"].startswith(f"{name}: ")
    with pytest.raises(openai.BadRequestError) as unknown:
        client.completions.create(model="kjv3", prompt="a", extra_body={"guided_json": {}})
    assert "guided_json" in unknown.value.message and "top_k" in unknown.value.message
    with pytest.raises(openai.BadRequestError) as zero:
        client.completions.create(model="kjv3", prompt="a", max_tokens=0)
    assert "echo" in zero.value.message
    port = server.http_port or 0
    headers = {"content-type": "application/json", "x-request-id": "oa-7"}
    status, got, raw = post(port, "/v1/completions", b"{not json", headers)
    assert (status, got["x-request-id"]) == (400, "oa-7")
    error = json.loads(raw)["error"]
    assert "not JSON" in error["message"] and error["type"] == "invalid_request_error"
    wrong_type = json.dumps({"model": "kjv3", "prompt": "a", "max_tokens": "many"}).encode()
    status, _, raw = post(port, "/v1/completions", wrong_type, headers)
    assert status == 400 and json.loads(raw)["error"]["param"] == "max_tokens"


def test_request_ids_and_metrics_are_the_grpc_ports(
    client: openai.OpenAI, server: BackgroundServer
) -> None:
    registry = server.running.metrics.registry
    labels = {"method": "Completions", "model": "kjv3", "code": "OK", "front": "http"}
    before = registry.get_sample_value("lmserve_requests_total", labels) or 0
    raw = client.completions.with_raw_response.create(
        model="kjv3", prompt="and", max_tokens=2, extra_headers={"x-request-id": "oa-req-1"}
    )
    assert raw.headers["x-request-id"] == "oa-req-1"
    assert raw.parse().id == "cmpl-oa-req-1"
    assert registry.get_sample_value("lmserve_requests_total", labels) == before + 1
    models = client.models.with_raw_response.list()
    assert len(models.headers["x-request-id"]) == 32


def test_bearer_token_is_required(auth_server: BackgroundServer) -> None:
    s = auth_server  # the session's server that asks for AUTH_TOKEN
    for key in ("none", "wrong"):
        with pytest.raises(openai.AuthenticationError):
            _client(s, key).completions.create(model="kjv3", prompt="a", max_tokens=2)
        with pytest.raises(openai.AuthenticationError):
            _client(s, key).models.list()
    status, _, raw = post(s.http_port or 0, "/v1/completions", b"{}", {})  # no header at all
    assert status == 401
    assert json.loads(raw)["error"]["type"] == "authentication_error"
    allowed = _client(s, TOKEN)
    done = allowed.completions.create(
        model="kjv3", prompt="and god", max_tokens=2, extra_body={"ignore_eos": True}
    )
    assert done.usage is not None and done.usage.completion_tokens == 2
    assert "kjv3" in {m.id for m in allowed.models.list().data}


# -- overload and clients that leave ------------------------------------------------------------


def _active(server: BackgroundServer) -> int:
    scheduler = server.running.models.ready("kjv-lstm").engine.scheduler  # type: ignore[attr-defined]
    return len(scheduler.active)


def _wait_active(server: BackgroundServer, expected: int) -> None:
    deadline = time.monotonic() + 10
    while _active(server) != expected and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _active(server) == expected


@contextlib.contextmanager
def _raw_request(server: BackgroundServer, body: dict[str, Any]) -> Iterator[socket.socket]:
    """A completion request on a raw socket, closed (the client leaving) at the block's end."""
    data = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", server.http_port or 0), timeout=10)
    head = (
        f"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        f"content-length: {len(data)}\r\n\r\n"
    )
    try:
        sock.sendall(head.encode() + data)
        yield sock
    finally:
        sock.close()


def test_a_full_server_answers_429_with_retry_after(lstm_server: BackgroundServer) -> None:
    _wait_active(lstm_server, 0)
    hold = {"model": "kjv-lstm", "prompt": "and", "max_tokens": 100_000, "n": SLOTS}
    with _raw_request(lstm_server, hold | {"stream": True, "ignore_eos": True}) as sock:
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        _wait_active(lstm_server, SLOTS)
        with pytest.raises(openai.RateLimitError) as full:
            _client(lstm_server).completions.create(model="kjv-lstm", prompt="and")
        assert int(full.value.response.headers["retry-after"]) >= 1
        assert isinstance(full.value.body, dict) and full.value.body["type"] == "rate_limit_error"
    _wait_active(lstm_server, 0)


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
@pytest.mark.parametrize("prompt", ["and", ["and", "in the"]], ids=["one-prompt", "two-prompts"])
def test_a_client_that_leaves_cancels_its_generation(
    lstm_server: BackgroundServer, stream: bool, prompt: str | list[str]
) -> None:
    _wait_active(lstm_server, 0)
    registry = lstm_server.running.metrics.registry
    labels = {"method": "Completions", "model": "kjv-lstm", "code": "CANCELLED", "front": "http"}
    before = registry.get_sample_value("lmserve_requests_total", labels) or 0
    body = {"model": "kjv-lstm", "prompt": prompt, "max_tokens": 100_000, "ignore_eos": True}
    with _raw_request(lstm_server, body | {"stream": stream}) as sock:
        if stream:
            assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        _wait_active(lstm_server, 1 if isinstance(prompt, str) else len(prompt))
    _wait_active(lstm_server, 0)  # long before 100,000 tokens
    deadline = time.monotonic() + 5
    while registry.get_sample_value("lmserve_requests_total", labels) != before + 1:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    done = _client(lstm_server).completions.create(model="kjv-lstm", prompt="and", max_tokens=3)
    assert done.usage is not None and done.usage.completion_tokens == 3
