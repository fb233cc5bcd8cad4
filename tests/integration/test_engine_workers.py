"""Engine worker processes through a real server: each model computes in a process of its own,
answers exactly what the in-process engine answers, and a worker's death stays with its model.

Models: KenLM's small test ARPA (n-gram) and a tiny exported LSTM (ONNX). Raw gRPC stubs (no
client retries), so every failure a caller would see is counted.
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from metrics_scrape import scrape
from neural_folders import VOCAB
from serve_process import (
    ServeProcess,
    engine_worker_pids,
    process_exists,
    process_title,
    wait_until,
)
from served import ServerFactory

from lmserve.server.backends.ngram.model import NgramModel
from lmserve.server.front.process.app import BackgroundServer
from lmserve.server.front.workers.supervisor import WorkerEngine
from lmserve.v1 import lm_service_pb2 as pb
from lmserve.v1 import lm_service_pb2_grpc

Stub = lm_service_pb2_grpc.LanguageModelServiceStub
TEXTS = ["the cat sat on the mat", "a dog", "the mat sat on the cat and the dog"]


@pytest.fixture(scope="module")
def repository(
    tmp_path_factory: pytest.TempPathFactory, model_repository: Path, tiny_lstm: Path
) -> Path:
    root = tmp_path_factory.mktemp("worker-models")
    shutil.copytree(model_repository / "test", root / "test")
    (root / "lstm").symlink_to(tiny_lstm, target_is_directory=True)
    return root


METRICS = {"metrics_enabled": True, "metrics_host": "127.0.0.1", "metrics_port": 0}


def _start(serve: ServerFactory, repository: Path, **settings: object) -> BackgroundServer:
    """A server of the test's own (it kills a worker, or needs other settings)."""
    return serve.private(repository, **METRICS, **settings)


@pytest.fixture
def server(serve: ServerFactory, repository: Path) -> BackgroundServer:
    """The module's shared server: tests that leave it as they found it (none kills a worker)."""
    return serve(repository, **METRICS)


@pytest.fixture
def stub(server: BackgroundServer) -> Iterator[Stub]:
    with grpc.insecure_channel(server.address) as channel:
        yield Stub(channel)


def _engine(server: BackgroundServer, model: str) -> WorkerEngine:
    engine = server.running.models.ready(model).engine
    assert isinstance(engine, WorkerEngine)
    return engine


def _health(address: str, model: str) -> int:
    with grpc.insecure_channel(address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=f"lmserve.v1.LanguageModelService/{model}"),
            timeout=5,
        )
    return int(reply.status)


def _score(stub: Stub, model: str) -> list[float]:
    reply = stub.Score(pb.ScoreRequest(model=model, texts=TEXTS), timeout=10)
    return [r.log_prob for r in reply.results]


def _everything(stub: Stub, model: str) -> dict[str, object]:
    """One answer of every model RPC, as plain values."""
    long = pb.ScoreRequest(model=model, texts=["the cat sat on the mat " * 300] * 40)
    generated = [
        (t.sample_index, t.token_id, round(t.log_prob, 6))
        for r in stub.Generate(
            pb.GenerateRequest(
                model=model,
                prompt="the cat",
                n=2,
                logprobs=True,
                sampling=pb.SamplingParams(temperature=1.0, seed=11),
                stopping=pb.StoppingCriteria(max_new_tokens=30, ignore_eos=True),
            ),
            timeout=30,
        )
        for t in r.tokens
    ]
    beams = stub.BeamSearch(
        pb.BeamSearchRequest(model=model, prompt="the", beam_width=3, max_length=6, num_return=3),
        timeout=30,
    )
    ranked = stub.Rerank(
        pb.RerankRequest(
            model=model,
            lists=[pb.NBestList(hypotheses=[pb.Hypothesis(text=t) for t in TEXTS])],
        ),
        timeout=30,
    )
    completions = [
        [(c.word, round(c.log_prob, 6)) for c in reply.completions]
        for reply in stub.Complete(
            iter(
                [
                    pb.CompleteRequest(model=model, append_text="the cat", partial_word="s", k=3),
                    pb.CompleteRequest(rollback_tokens=1, partial_word="", k=3),
                ]
            ),
            timeout=30,
        )
    ]
    return {
        "score": [round(x, 6) for x in _score(stub, model)],
        "long": [round(r.log_prob, 4) for r in stub.Score(long, timeout=60).results],
        "generate": generated,
        "beam": [(h.text, round(h.score, 6)) for h in beams.hypotheses],
        "rerank": [(h.index, h.rank, round(h.lm_log_prob, 6)) for h in ranked.lists[0].hypotheses],
        "complete": completions[0],
    }


def test_each_model_computes_in_a_worker_named_after_it_and_answers_as_in_process(
    serve: ServerFactory, server: BackgroundServer, stub: Stub, repository: Path
) -> None:
    for model in ("test", "lstm"):
        engine = _engine(server, model)
        assert engine.pid is not None and engine.pid != os.getpid()
        assert process_title(engine.pid) == f"lmserve: engine {model}"
    through_workers = {model: _everything(stub, model) for model in ("test", "lstm")}
    with (
        _start(serve, repository, engine_workers=False) as alone,
        grpc.insecure_channel(alone.address) as channel,
    ):
        assert alone.running.workers is None
        in_process = {model: _everything(Stub(channel), model) for model in ("test", "lstm")}
    assert through_workers == in_process


def test_worker_metrics_reach_the_front_s_metrics_endpoint(
    server: BackgroundServer, stub: Stub
) -> None:
    for _ in stub.Generate(
        pb.GenerateRequest(
            model="lstm", prompt="the", stopping=pb.StoppingCriteria(max_new_tokens=7)
        ),
        timeout=30,
    ):
        pass
    samples = scrape(server)
    labels = frozenset({("model", "lstm")})
    assert samples[("lmserve_generated_tokens_total", labels)] >= 1  # counted in the worker
    for model in ("test", "lstm"):
        rss = samples[("lmserve_engine_worker_rss_bytes", frozenset({("model", model)}))]
        assert 10e6 < rss < 2e9
        assert samples[("lmserve_engine_worker_restarts_total", frozenset({("model", model)}))] == 0


def _score_loop(stub: Stub, model: str, stop: threading.Event, outcomes: list[object]) -> None:
    while not stop.is_set():
        try:
            _score(stub, model)
            outcomes.append("ok")
        except grpc.RpcError as exc:
            outcomes.append(exc.code())
            time.sleep(0.01)


@pytest.fixture
def killable(serve: ServerFactory, repository: Path) -> Iterator[tuple[BackgroundServer, Stub]]:
    """A server of the test's own, whose worker it kills, and a stub on it."""
    with _start(serve, repository) as running, grpc.insecure_channel(running.address) as channel:
        yield running, Stub(channel)


def test_a_killed_worker_fails_only_its_own_calls_and_serves_again(
    killable: tuple[BackgroundServer, Stub],
) -> None:
    server, stub = killable
    killed = _engine(server, "lstm")
    old_pid = killed.pid
    assert old_pid is not None
    outcomes: dict[str, list[object]] = {"test": [], "lstm": []}
    stop = threading.Event()
    loops = [
        threading.Thread(target=_score_loop, args=(stub, model, stop, outcomes[model]))
        for model in outcomes
    ]
    for loop in loops:
        loop.start()
    try:
        assert wait_until(lambda: len(outcomes["lstm"]) > 20, 10)
        os.kill(old_pid, signal.SIGKILL)
        killed_at = time.monotonic()
        assert wait_until(lambda: _health(server.address, "lstm") == 2, 5)  # NOT_SERVING
        assert wait_until(lambda: killed.pid != old_pid and outcomes["lstm"][-1] == "ok", 15)
        back_after = time.monotonic() - killed_at
        seen = len(outcomes["test"])
        assert wait_until(lambda: len(outcomes["test"]) > seen + 20, 10)
    finally:
        stop.set()
        for loop in loops:
            loop.join(10)
    assert set(outcomes["test"]) == {"ok"}, "the other model saw a failure"
    assert set(outcomes["lstm"]) <= {"ok", grpc.StatusCode.UNAVAILABLE}
    assert grpc.StatusCode.UNAVAILABLE in outcomes["lstm"]
    assert back_after < 15
    assert _health(server.address, "lstm") == 1  # SERVING
    assert not process_exists(old_pid)
    assert killed.pid is not None and process_title(killed.pid) == "lmserve: engine lstm"
    samples = scrape(server)
    assert samples[("lmserve_engine_worker_restarts_total", frozenset({("model", "lstm")}))] == 1


def test_a_worker_that_keeps_dying_marks_its_model_failed(
    serve: ServerFactory, repository: Path
) -> None:
    with (
        _start(serve, repository, worker_max_restarts=1) as server,
        grpc.insecure_channel(server.address) as channel,
    ):
        stub = Stub(channel)
        engine = _engine(server, "lstm")
        for _ in range(2):
            pid = engine.pid
            assert pid is not None
            _score(stub, "lstm")
            os.kill(pid, signal.SIGKILL)
            assert wait_until(lambda pid=pid: engine.pid != pid or engine.failure, 15)  # type: ignore[misc]
        assert engine.failure is not None and "died 2 times" in engine.failure
        with pytest.raises(grpc.RpcError) as refused:
            _score(stub, "lstm")
        assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
        assert "died 2 times" in str(refused.value.details())
        info = stub.GetModel(pb.GetModelRequest(model="lstm"), timeout=5).model
        assert info.state == pb.MODEL_STATE_FAILED and "died 2 times" in info.load_error
        assert _health(server.address, "lstm") == 2  # NOT_SERVING
        assert _score(stub, "test")  # the other model serves on
        # A reload starts it afresh, though its folder did not change.
        assert not server.reload().changed
        assert _score(stub, "lstm")
        info = stub.GetModel(pb.GetModelRequest(model="lstm"), timeout=5).model
        assert info.state == pb.MODEL_STATE_READY and not info.load_error
        assert _health(server.address, "lstm") == 1


def test_no_worker_outlives_a_killed_front(repository: Path) -> None:
    with ServeProcess(repository) as server:
        workers = engine_worker_pids(server.process.pid)
        assert sorted(process_title(p) for p in workers) == [
            "lmserve: engine lstm",
            "lmserve: engine test",
        ]
        server.process.send_signal(signal.SIGKILL)
        server.wait(timeout=10)
        assert wait_until(lambda: not any(process_exists(p) for p in workers), 5)


def _gauge(server: BackgroundServer, name: str, model: str) -> float:
    return scrape(server).get((name, frozenset({("model", model)})), 0.0)


def test_a_cancelled_stream_stops_generating_in_its_worker(
    server: BackgroundServer, stub: Stub
) -> None:
    call = stub.Generate(
        pb.GenerateRequest(
            model="lstm",
            prompt="the",
            stopping=pb.StoppingCriteria(max_new_tokens=4_000, ignore_eos=True),
        ),
        timeout=60,
    )
    next(call)
    assert _gauge(server, "lmserve_active_sequences", "lstm") == 1
    call.cancel()
    assert wait_until(lambda: _gauge(server, "lmserve_active_sequences", "lstm") == 0, 5)
    generated = _gauge(server, "lmserve_generated_tokens_total", "lstm")
    time.sleep(0.3)
    assert _gauge(server, "lmserve_generated_tokens_total", "lstm") == generated


def test_a_slow_reader_is_parked_in_its_worker_and_gets_every_token(
    serve: ServerFactory, repository: Path
) -> None:
    """The front reports what its handler took; the worker parks a stream whose reader fell
    `max_unread_events` behind and resumes it when it caught up: same tokens as a fast read."""
    request = pb.GenerateRequest(
        model="lstm",
        sampling=pb.SamplingParams(temperature=1.0, seed=7),
        logprobs=True,
        top_logprobs=5,  # larger messages: the 64 KiB window fills after a few hundred tokens
        stopping=pb.StoppingCriteria(max_new_tokens=2_000, ignore_eos=True),
    )
    options = [("grpc.http2.bdp_probe", 0)]  # the window stays at 64 KiB
    with (
        _start(serve, repository, max_unread_events=32) as server,
        grpc.insecure_channel(server.address, options=options) as channel,
    ):
        stub = Stub(channel)
        expected = [(t.index, t.token_id) for r in stub.Generate(request) for t in r.tokens]
        slow = stub.Generate(request, timeout=60)  # opened, not read
        assert wait_until(lambda: _gauge(server, "lmserve_parked_sequences", "lstm") == 1, 10)
        received = [(t.index, t.token_id) for r in slow for t in r.tokens]
        assert received == expected
        assert _gauge(server, "lmserve_parked_sequences", "lstm") == 0


def test_the_front_holds_no_model_weights(server: BackgroundServer, stub: Stub) -> None:
    # The front read vocabularies, codecs and manifests; the weights are in the workers.
    lstm = server.running.repository.ready("lstm")
    assert lstm.backend is None and lstm.vocab is not None
    assert lstm.scorer is not None and not lstm.scorer.has_backend
    # An n-gram binary is a memory map: the front maps it too (the pages are the worker's,
    # nothing is copied) to score small requests where they arrive.
    ngram = server.running.repository.ready("test")
    assert ngram.rules.scored_in_front and isinstance(ngram.backend, NgramModel)
    tables = [a for a in vars(ngram.backend.tables).values() if isinstance(a, np.ndarray)]
    assert tables and not any(a.flags.owndata for a in tables)  # views of the file's map
    info = stub.GetModel(pb.GetModelRequest(model="lstm")).model
    assert info.vocab_size == len(VOCAB) and info.special_tokens.eos_id == VOCAB.index("</s>")
    [result] = stub.Score(pb.ScoreRequest(model="test", texts=["a"])).results
    assert result.token_count == 2


def test_a_broken_graph_fails_in_its_worker_and_shows_in_list_models(
    serve: ServerFactory, repository: Path, tmp_path: Path
) -> None:
    root = tmp_path / "models"
    shutil.copytree(repository, root)
    (root / "lstm" / "step.onnx").write_bytes(b"not a graph")
    manifest = (root / "lstm" / "model.yaml").read_text()
    import yaml

    from lmserve.server.manifest import sha256_of

    data = yaml.safe_load(manifest)
    data["files"]["step"]["sha256"] = sha256_of(root / "lstm" / "step.onnx")
    (root / "lstm" / "model.yaml").write_text(yaml.safe_dump(data))
    with _start(serve, root) as running, grpc.insecure_channel(running.address) as channel:
        stub = Stub(channel)
        infos = {m.name: m for m in stub.ListModels(pb.ListModelsRequest()).models}
        assert infos["test"].state == pb.MODEL_STATE_READY
        assert infos["lstm"].state == pb.MODEL_STATE_FAILED
        assert infos["lstm"].load_error == "lstm/step.onnx: ONNX Runtime cannot load it"
        with pytest.raises(grpc.RpcError) as caught:
            stub.Score(pb.ScoreRequest(model="lstm", texts=["a"]))
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "failed to load" in (caught.value.details() or "")


def test_a_client_mistake_logs_no_traceback_in_the_worker(
    serve: ServerFactory, repository: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    options = pb.ScoreOptions(bos=False)  # not offered by recurrent models
    # Started here: its workers write to this test's captured stderr.
    with _start(serve, repository) as running, grpc.insecure_channel(running.address) as channel:
        stub = Stub(channel)
        for _ in range(3):
            with pytest.raises(grpc.RpcError) as caught:
                stub.Score(pb.ScoreRequest(model="lstm", texts=TEXTS, options=options))
            assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
        time.sleep(0.3)  # the worker's log lines reach its stderr
    err = capfd.readouterr().err
    assert "Traceback" not in err and " ERROR " not in err, err
    assert "refused: Unimplemented" in err
