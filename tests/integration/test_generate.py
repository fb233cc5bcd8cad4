"""Generate and BeamSearch through a real server: continuous batching, seeds, cancellation, limits.

Models: a hand-made bigram ARPA and a tiny exported LSTM (ONNX). The server runs with few slots
(4 active sequences, 2 queued requests) so the queue and cancellation paths are reachable.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest
from neural_folders import VOCAB
from served import ServerFactory

from lmserve.client import BeamHypothesis, GeneratedToken, GenerationFinished, LmServeClient
from lmserve.client.errors import InvalidArgumentError, ResourceExhaustedError
from lmserve.server.families.catalog import make_stepper
from lmserve.server.front.process.app import BackgroundServer
from lmserve.server.manifest import ModelManifest, write_manifest
from lmserve.v1 import lm_service_pb2 as pb

BIGRAM_ARPA = """\\data\\
ngram 1=8
ngram 2=9

\\1-grams:
-1.0\t<unk>\t0
-99\t<s>\t-0.3
-0.9\t</s>\t0
-0.5\tthe\t-0.2
-1.1\tcat\t-0.2
-1.3\tsat\t-0.2
-1.2\tmat\t-0.2
-1.4\ton\t-0.2

\\2-grams:
-0.2\t<s> the
-0.3\tthe cat
-0.6\tthe mat
-0.1\tcat sat
-0.2\tsat on
-0.1\ton the
-0.2\tmat </s>
-1.5\tcat </s>
-1.0\tthe </s>

\\end\\
"""
MODELS = ("bigram", "lstm")


@pytest.fixture(scope="module")
def server(
    serve: ServerFactory, tmp_path_factory: pytest.TempPathFactory, tiny_lstm: Path
) -> BackgroundServer:
    root = tmp_path_factory.mktemp("generate-models")
    (root / "lstm").symlink_to(tiny_lstm, target_is_directory=True)
    (root / "bigram").mkdir()
    (root / "bigram" / "model.arpa").write_text(BIGRAM_ARPA)
    write_manifest(
        root / "bigram",
        ModelManifest.model_validate(
            {
                "name": "bigram",
                "kind": "ngram",
                "format": "arpa",
                "files": {"arpa": {"path": "model.arpa"}},
            }
        ),
    )
    return serve(
        root,
        # In-process engine: these tests watch the scheduler itself (its slots, steps and
        # parked streams); test_engine_workers checks the same calls through a worker.
        engine_workers=False,
        max_active_sequences=4,
        max_queued_requests=2,
        max_new_tokens=1_000_000,
    )


@pytest.fixture(scope="module")
def client(server: BackgroundServer) -> Iterator[LmServeClient]:
    with LmServeClient(server.address, timeout=20) as c:
        yield c


def _scheduler(server: BackgroundServer, model: str):  # type: ignore[no-untyped-def]
    return server.running.models.ready(model).engine.scheduler  # type: ignore[attr-defined]


def _active(server: BackgroundServer, model: str) -> float:
    value = server.running.metrics.registry.get_sample_value(
        "lmserve_active_sequences", {"model": model}
    )
    return value or 0.0


def _tokens(client: LmServeClient, model: str, **options: object) -> list[int]:
    return [
        e.token_id
        for e in client.generate(model, **options)  # type: ignore[arg-type]
        if isinstance(e, GeneratedToken)
    ]


def _wait_idle(server: BackgroundServer, model: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    scheduler = _scheduler(server, model)
    while (scheduler.active or scheduler.pending) and time.monotonic() < deadline:
        time.sleep(0.01)


@pytest.mark.parametrize("model", MODELS)
def test_greedy_equals_argmax_stepping(
    server: BackgroundServer, client: LmServeClient, model: str
) -> None:
    prompt = [VOCAB.index("the")] if model == "lstm" else []
    events = list(
        client.generate(
            model, prompt, max_new_tokens=8, temperature=0.0, ignore_eos=True, logprobs=True
        )
    )
    backend = server.running.repository.ready(model).backend
    stepper = make_stepper(backend)
    lp, state = stepper.prefill([prompt])
    expected, expected_lp = [], []
    for _ in range(8):
        lp[0, backend.vocab.eos_id] = -np.inf
        token = int(np.argmax(lp[0]))
        expected.append(token)
        expected_lp.append(float(lp[0, token]))
        lp, state = stepper.step(np.array([token]), state)
    tokens = [e for e in events if isinstance(e, GeneratedToken)]
    assert [t.token_id for t in tokens] == expected
    assert [t.index for t in tokens] == list(range(8))
    assert [t.log_prob for t in tokens] == pytest.approx(expected_lp, abs=1e-5)
    [finished] = [e for e in events if isinstance(e, GenerationFinished)]
    assert finished.reason == "length"
    assert finished.usage.generated_tokens == 8
    assert finished.usage.prompt_tokens == len(prompt)
    assert finished.text == "".join(t.text for t in tokens)
    words = [backend.vocab.words[i] for i in expected]
    assert finished.text == " ".join(words)


@pytest.mark.parametrize("model", MODELS)
def test_seeded_output_is_the_same_alone_and_in_a_busy_batch(
    server: BackgroundServer, client: LmServeClient, model: str
) -> None:
    options = {"max_new_tokens": 30, "seed": 1234, "ignore_eos": True, "top_k": 5}
    alone = _tokens(client, model, **options)
    again = _tokens(client, model, **options)
    assert alone == again
    # The same request among other streams (different seeds and lengths) started together.
    with ThreadPoolExecutor(4) as pool:
        others = [
            pool.submit(_tokens, client, model, max_new_tokens=10 + 7 * i, seed=i, ignore_eos=True)
            for i in range(3)
        ]
        time.sleep(0.02)
        busy = pool.submit(_tokens, client, model, **options).result()
        assert all(len(o.result()) == 10 + 7 * i for i, o in enumerate(others))
    assert busy == alone
    assert _tokens(client, model, **{**options, "seed": 99}) != alone


def test_n_samples_each_finish_and_differ(client: LmServeClient) -> None:
    events = list(client.generate("lstm", max_new_tokens=12, n=3, seed=5, ignore_eos=True))
    finished = sorted(
        (e for e in events if isinstance(e, GenerationFinished)), key=lambda e: e.sample_index
    )
    assert [f.sample_index for f in finished] == [0, 1, 2]
    per_sample = [
        [e.token_id for e in events if isinstance(e, GeneratedToken) and e.sample_index == k]
        for k in range(3)
    ]
    assert all(len(s) == 12 for s in per_sample)
    assert len({tuple(s) for s in per_sample}) > 1
    assert all(f.reason == "length" for f in finished)


def test_stream_interval_groups_steps_into_messages(server: BackgroundServer) -> None:
    # The raw stub, to see the messages themselves: 10 tokens, 4 steps a message -> 4 + 4 + 2,
    # the sample's end riding on the last; the same tokens as with a message per step. Steps
    # that finish while the previous message is still being written join the next message
    # (the in-process server shares one GIL, so that happens here), so a message may hold
    # more whole groups, never a split one.
    from lmserve.client import _requests as req

    def messages(interval: int, n: int = 1) -> list[pb.GenerateResponse]:
        request = req.generate_request(
            "lstm", "", max_new_tokens=10, seed=8, ignore_eos=True, n=n,
            stream_interval=interval,
        )  # fmt: skip
        with LmServeClient(server.address, timeout=20) as c:
            return list(c.stub.Generate(request, timeout=20))

    def counts(ms: list[pb.GenerateResponse]) -> list[int]:
        return [len(m.tokens) for m in ms]

    def ids(ms: list[pb.GenerateResponse]) -> list[int]:
        return [t.token_id for m in ms for t in m.tokens]

    grouped, single = messages(4), messages(1)
    assert sum(counts(grouped)) == 10
    assert all(c % 4 == 0 for c in counts(grouped)[:-1])
    assert counts(grouped)[-1] % 4 == 2  # the last group holds the 2 steps left
    assert [m.HasField("finished") for m in grouped] == [False] * (len(grouped) - 1) + [True]
    assert [t.index for m in single for t in m.tokens] == list(range(10))
    assert ids(grouped) == ids(single)
    # n samples: a step's tokens (one per sample) travel in one message; the last step's end
    # closes a message per sample.
    two = messages(1, n=2)
    assert sum(counts(two)) == 20
    assert sum(m.HasField("finished") for m in two) == 2
    assert all(c % 2 == 0 for c in counts(two)[:-2])


def test_stop_strings_are_trimmed(client: LmServeClient) -> None:
    # Greedy from <s>: "the cat sat on the cat ..."; stop at "sat on".
    events = list(client.generate("bigram", max_new_tokens=10, temperature=0.0, stop=["sat on"]))
    [finished] = [e for e in events if isinstance(e, GenerationFinished)]
    assert finished.reason == "stop"
    assert finished.text == "the cat "
    assert "".join(e.text for e in events if isinstance(e, GeneratedToken)) == "the cat "


def test_text_held_back_for_a_stop_string_is_streamed_when_a_stop_id_ends_it(
    server: BackgroundServer, client: LmServeClient
) -> None:
    # Greedy after "on": "the cat sat ...". "cat" may start the stop string "cat on", so it is
    # held back; the stop id "sat" then ends the sample and "cat" must still reach the stream.
    sat = server.running.repository.ready("bigram").backend.vocab.index["sat"]
    events = list(
        client.generate(
            "bigram",
            "on",
            max_new_tokens=10,
            temperature=0.0,
            stop=["cat on"],
            stop_token_ids=[sat],
        )
    )
    [finished] = [e for e in events if isinstance(e, GenerationFinished)]
    tokens = [e for e in events if isinstance(e, GeneratedToken)]
    assert finished.reason == "stop" and finished.text == "the cat"
    assert "".join(t.text for t in tokens) == "the cat"
    assert tokens[-1].token_id == sat and tokens[-1].text == "cat"
    assert finished.usage.generated_tokens == len(tokens)


def test_end_of_sentence_and_top_logprobs(client: LmServeClient) -> None:
    events = list(
        client.generate("bigram", "the mat", max_new_tokens=10, temperature=0.0, top_logprobs=3)
    )
    [finished] = [e for e in events if isinstance(e, GenerationFinished)]
    assert finished.reason == "end_of_sentence"
    assert finished.usage.prompt_tokens == 2


def test_cancelling_a_stream_frees_its_slot(server: BackgroundServer) -> None:
    _wait_idle(server, "lstm")
    with LmServeClient(server.address, timeout=20) as c:
        stream = c.generate("lstm", max_new_tokens=5000, ignore_eos=True, seed=1)
        for _ in range(3):
            next(stream)
        scheduler = _scheduler(server, "lstm")
        assert len(scheduler.active) == 1
        stream.close()  # cancels the call
        deadline = time.monotonic() + 5
        while scheduler.active and time.monotonic() < deadline:
            time.sleep(0.005)
        assert not scheduler.active
        assert _active(server, "lstm") == 0
        steps = scheduler.steps
        time.sleep(0.1)
        assert scheduler.steps == steps  # nothing more computed for it


def test_deadline_cancels_the_stream(server: BackgroundServer, client: LmServeClient) -> None:
    with pytest.raises(Exception) as info:
        list(client.generate("lstm", max_new_tokens=1_000_000, ignore_eos=True, timeout=0.3))
    assert "DEADLINE" in str(info.value)
    _wait_idle(server, "lstm")
    assert not _scheduler(server, "lstm").active


def test_a_full_queue_answers_resource_exhausted(server: BackgroundServer) -> None:
    _wait_idle(server, "bigram")
    with LmServeClient(server.address, timeout=20) as c:
        # 4 slots held by streams that run until closed, 2 requests queued: the next one is
        # refused. (The bigram steps in microseconds: a few thousand tokens end too soon.)
        holders = [
            c.generate("bigram", max_new_tokens=1_000_000, ignore_eos=True) for _ in range(4)
        ]
        for h in holders:
            next(h)
        queued = [c.generate("bigram", max_new_tokens=5, ignore_eos=True) for _ in range(2)]
        with ThreadPoolExecutor(2) as pool:
            waiting = [pool.submit(next, q) for q in queued]
            deadline = time.monotonic() + 5
            while _scheduler(server, "bigram").pending < 2 and time.monotonic() < deadline:
                time.sleep(0.005)
            with pytest.raises(ResourceExhaustedError):
                list(c.generate("bigram", max_new_tokens=5))
            for h in holders:
                h.close()
            assert all(isinstance(w.result(timeout=10), GeneratedToken) for w in waiting)
        for q in queued:
            q.close()


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"temperature": -1.0}, "sampling.temperature"),
        ({"top_p": 1.5}, "sampling.top_p"),
        ({"max_new_tokens": 0}, "stopping.max_new_tokens"),
        ({"max_new_tokens": 10**7}, "stopping.max_new_tokens"),
        ({"n": 100}, "n"),
        ({"top_logprobs": 1000}, "top_logprobs"),
        ({"stop": [""]}, "stopping.stop"),
        ({"prompt": [999]}, "prompt_token_ids[0]"),
        ({"stream_interval": -1}, "stream_interval"),
    ],
)
def test_invalid_parameters_name_the_field(
    client: LmServeClient, options: dict[str, object], field: str
) -> None:
    prompt = options.pop("prompt", "")
    max_new = options.pop("max_new_tokens", 5)
    with pytest.raises(InvalidArgumentError) as info:
        list(client.generate("bigram", prompt, max_new_tokens=max_new, **options))  # type: ignore[arg-type]
    assert field in info.value.message


def test_unknown_model_is_not_found(client: LmServeClient) -> None:
    with pytest.raises(Exception) as info:
        list(client.generate("nope", max_new_tokens=3))
    assert getattr(info.value, "code", None) is grpc.StatusCode.NOT_FOUND


class _Recorder:
    """A stdout that records each write, to see tokens printed one by one."""

    def __init__(self) -> None:
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return len(text)

    def flush(self) -> None:
        self.writes.append("<flush>")


def test_the_generate_command_prints_tokens_as_they_arrive(
    server: BackgroundServer, client: LmServeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lmserve.server.cli import main

    out = _Recorder()
    monkeypatch.setattr("sys.stdout", out)
    argv = ["generate", "--model", "lstm", "--target", server.address, "--max-new-tokens", "6"]
    assert main([*argv, "--temperature", "0", "--seed", "3"]) == 0
    expected = [
        e.text
        for e in client.generate("lstm", max_new_tokens=6, temperature=0.0)
        if isinstance(e, GeneratedToken)
    ]
    # Each piece is written and flushed on its own, then the line ends.
    pieces = [w for w in out.writes if w != "<flush>"]
    assert pieces[: len(expected)] == expected
    assert out.writes[: 2 * len(expected)] == [x for p in expected for x in (p, "<flush>")]
    assert pieces[len(expected)] == "\n"


def test_beam_search_through_the_server_equals_the_direct_call(
    server: BackgroundServer, client: LmServeClient
) -> None:
    from lmserve.server.decoding import beam
    from lmserve.server.decoding.params import BeamParams

    backend = server.running.repository.ready("lstm").backend
    prompt = [VOCAB.index("the")]
    direct = beam.beam_search(
        make_stepper(backend), prompt, BeamParams(beam_width=4, max_length=6, num_return=3)
    )
    got = client.beam_search("lstm", prompt, beam_width=4, max_length=6, num_return=3)
    assert [h.token_ids for h in got] == [tuple(h.token_ids) for h in direct]
    assert [h.score for h in got] == pytest.approx([h.score for h in direct])


def test_async_client_generates_and_searches_as_the_sync_one(
    server: BackgroundServer, client: LmServeClient
) -> None:
    # The asyncio client: same seeded tokens, same beams; leaving a stream early frees its
    # slot as the sync client's does.
    import asyncio

    from lmserve.client import AsyncLmServeClient

    options = {"seed": 21, "ignore_eos": True, "top_k": 20}
    expected = _tokens(client, "lstm", max_new_tokens=12, **options)
    beams = client.beam_search("lstm", "the", beam_width=3, max_length=5, num_return=2)
    _wait_idle(server, "lstm")

    async def run() -> tuple[list[int], list[BeamHypothesis], int, int]:
        async with AsyncLmServeClient(server.address, timeout=20) as aclient:
            tokens = [
                e.token_id
                async for e in aclient.generate("lstm", max_new_tokens=12, **options)
                if isinstance(e, GeneratedToken)
            ]
            found = await aclient.beam_search(
                "lstm", "the", beam_width=3, max_length=5, num_return=2
            )
            stream = aclient.generate("lstm", max_new_tokens=1_000_000, ignore_eos=True, seed=2)
            scheduler = _scheduler(server, "lstm")
            during = 0
            async for _ in stream:
                during = len(scheduler.active)
                break
            await stream.aclose()  # leaving early cancels the call
            deadline = time.monotonic() + 5
            while scheduler.active and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            return tokens, list(found), during, len(scheduler.active)

    tokens, found, during, active_after = asyncio.run(run())
    assert tokens == expected and len(tokens) == 12
    assert [h.token_ids for h in found] == [h.token_ids for h in beams]
    assert during == 1 and active_after == 0
