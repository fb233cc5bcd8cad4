"""Hot reload of the model repository: models added, replaced, removed and broken while a real
server on loopback keeps answering (in-process servers; SIGHUP to a real `lmserve serve`)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry
from serve_process import ServeProcess, wait_until

from lmserve.server.front.process.app import BackgroundServer, start_background_server
from lmserve.server.front.workers.supervisor import WorkerEngine
from lmserve.server.manifest import ModelManifest, sha256_of, write_manifest
from lmserve.server.settings import load_settings
from lmserve.v1 import lm_service_pb2 as pb
from lmserve.v1 import lm_service_pb2_grpc

Stub = lm_service_pb2_grpc.LanguageModelServiceStub

# log10 P(w) of a unigram model: "a" differs between the two versions used here.
_ARPA = """\\data\\
ngram 1=4

\\1-grams:
-1.0\t<unk>
-99\t<s>
-0.5\t</s>
{a}\ta

\\end\\
"""


def write_model(folder: Path, name: str, *, a: float = -0.3, version: str = "1") -> None:
    """A one-file ARPA model folder (compiled when loaded)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.arpa").write_text(_ARPA.format(a=a))
    manifest = ModelManifest.model_validate(
        {
            "name": name,
            "version": version,
            "kind": "ngram",
            "format": "arpa",
            "files": {"arpa": {"path": "model.arpa", "sha256": sha256_of(folder / "model.arpa")}},
            "ngram": {"order": 1},
        }
    )
    write_manifest(folder, manifest)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    write_model(root / "alpha", "alpha", a=-0.3)
    return root


@pytest.fixture
def server(repo: Path) -> Iterator[BackgroundServer]:
    settings = load_settings(
        {"model_repository": repo, "host": "127.0.0.1", "port": 0, "metrics_enabled": False}
    )
    running = start_background_server(settings, registry=CollectorRegistry())
    yield running
    running.stop(grace=1.0)


@pytest.fixture
def stub(server: BackgroundServer) -> Iterator[Stub]:
    with grpc.insecure_channel(server.address) as channel:
        yield lm_service_pb2_grpc.LanguageModelServiceStub(channel)


def score(stub: Stub, model: str) -> float:
    reply = stub.Score(pb.ScoreRequest(model=model, texts=["a a"]), timeout=10)
    return reply.results[0].log_prob


def code_of(call: object) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        call()  # type: ignore[operator]
    return info.value.code()  # type: ignore[no-any-return]


def health(server: BackgroundServer, service: str) -> int:
    with grpc.insecure_channel(server.address) as channel:
        check = health_pb2_grpc.HealthStub(channel).Check
        return check(health_pb2.HealthCheckRequest(service=service), timeout=5).status  # type: ignore[no-any-return]


def reloads(server: BackgroundServer, model: str, result: str) -> float:
    value = server.running.metrics.registry.get_sample_value(
        "lmserve_model_reloads_total", {"model": model, "result": result}
    )
    return value or 0.0


def test_an_added_folder_serves_after_a_reload(
    server: BackgroundServer, stub: Stub, repo: Path
) -> None:
    assert code_of(lambda: score(stub, "beta")) is grpc.StatusCode.NOT_FOUND
    write_model(repo / "beta", "beta")
    result = server.reload()
    assert result.added == ["beta"] and not result.replaced and not result.removed
    assert score(stub, "beta") == pytest.approx(score(stub, "alpha"))
    assert health(server, "lmserve.v1.LanguageModelService/beta") == 1  # SERVING
    assert reloads(server, "beta", "added") == 1
    # Nothing changed: nothing is reloaded, the served model is the same object.
    alpha = server.running.models.ready("alpha")
    assert not server.reload().changed
    assert server.running.models.ready("alpha") is alpha


def test_a_replaced_model_switches_with_no_failed_request(
    server: BackgroundServer, stub: Stub, repo: Path
) -> None:
    before = score(stub, "alpha")
    old = server.running.models.ready("alpha")
    failures: list[BaseException] = []
    answers: list[float] = []
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            try:
                answers.append(score(stub, "alpha"))
            except grpc.RpcError as exc:
                failures.append(exc)

    clients = [threading.Thread(target=loop) for _ in range(3)]
    for client in clients:
        client.start()
    try:
        assert wait_until(lambda: len(answers) > 20, 10)
        write_model(repo / "alpha", "alpha", a=-0.9, version="2")
        result = server.reload()
        assert result.replaced == ["alpha"]
        seen = len(answers)
        assert wait_until(lambda: len(answers) > seen + 20, 10)
    finally:
        stop.set()
        for client in clients:
            client.join(10)
    assert failures == []
    after = score(stub, "alpha")
    assert after < before  # "a" is less likely in version 2
    assert set(answers) == {before, after}
    assert answers[-1] == after
    # The old model was closed once its last request left; the new one serves.
    assert server.running.models.in_use(old) == 0
    assert server.running.models.ready("alpha") is not old
    assert reloads(server, "alpha", "replaced") == 1


def test_a_removed_folder_is_not_found_after_a_reload(
    server: BackgroundServer, stub: Stub, repo: Path
) -> None:
    write_model(repo / "beta", "beta")
    server.reload()
    assert score(stub, "beta") < 0
    for path in sorted((repo / "beta").iterdir()):
        path.unlink()
    (repo / "beta").rmdir()
    assert server.reload().removed == ["beta"]
    assert code_of(lambda: score(stub, "beta")) is grpc.StatusCode.NOT_FOUND
    models = stub.ListModels(pb.ListModelsRequest(), timeout=5).models
    assert [m.name for m in models] == ["alpha"]
    assert health(server, "lmserve.v1.LanguageModelService/beta") == 2  # NOT_SERVING
    assert reloads(server, "beta", "removed") == 1


def test_a_broken_replacement_keeps_the_old_version_serving(
    server: BackgroundServer, stub: Stub, repo: Path
) -> None:
    before = score(stub, "alpha")
    (repo / "alpha" / "model.arpa").write_text("not an arpa file\n")  # checksum mismatch now
    result = server.reload()
    assert list(result.failed) == ["alpha"] and "alpha" in result.failed["alpha"]
    assert score(stub, "alpha") == before
    assert health(server, "lmserve.v1.LanguageModelService/alpha") == 1
    assert reloads(server, "alpha", "failed") == 1
    # Not retried while unchanged; fixed, it loads.
    assert not server.reload().failed
    write_model(repo / "alpha", "alpha", a=-0.9)
    assert server.reload().replaced == ["alpha"]
    assert score(stub, "alpha") < before


def test_name_at_version(server: BackgroundServer, stub: Stub, repo: Path) -> None:
    assert score(stub, "alpha@1") == score(stub, "alpha")
    reply = stub.GetModel(pb.GetModelRequest(model="alpha@1"), timeout=5)
    assert reply.model.name == "alpha"
    with pytest.raises(grpc.RpcError) as info:
        score(stub, "alpha@7")
    assert info.value.code() is grpc.StatusCode.NOT_FOUND
    assert "alpha@1" in (info.value.details() or "")  # names the version that is served
    assert code_of(lambda: stub.GetModel(pb.GetModelRequest(model="alpha@7"), timeout=5)) is (
        grpc.StatusCode.NOT_FOUND
    )
    write_model(repo / "alpha", "alpha", a=-0.9, version="2")
    server.reload()
    assert score(stub, "alpha@2") == score(stub, "alpha")
    assert code_of(lambda: score(stub, "alpha@1")) is grpc.StatusCode.NOT_FOUND


def test_sighup_reloads_a_real_serve_process(repo: Path) -> None:
    with ServeProcess(repo, "--shutdown-notice-seconds", "0") as server:
        with grpc.insecure_channel(server.address) as channel:
            stub = lm_service_pb2_grpc.LanguageModelServiceStub(channel)
            assert code_of(lambda: score(stub, "beta")) is grpc.StatusCode.NOT_FOUND
            write_model(repo / "beta", "beta")
            server.process.send_signal(signal.SIGHUP)

            def serves() -> bool:
                try:
                    return score(stub, "beta") < 0
                except grpc.RpcError:
                    return False

            assert wait_until(serves, 30, step=0.2), server.stderr()
            assert score(stub, "alpha") < 0
        assert "SIGHUP: reloading" in server.stderr()
        server.process.send_signal(signal.SIGTERM)
        assert server.wait(30) == 0


def test_polling_reloads_without_a_signal(repo: Path) -> None:
    settings = load_settings(
        {
            "model_repository": repo,
            "host": "127.0.0.1",
            "port": 0,
            "metrics_enabled": False,
            "reload_poll_seconds": 0.2,
        }
    )
    with start_background_server(settings, registry=CollectorRegistry()) as server:
        with grpc.insecure_channel(server.address) as channel:
            stub = lm_service_pb2_grpc.LanguageModelServiceStub(channel)
            write_model(repo / "beta", "beta")

            def serves() -> bool:
                try:
                    return score(stub, "beta") < 0
                except grpc.RpcError:
                    return False

            assert wait_until(serves, 20, step=0.1)


def test_an_open_stream_finishes_on_the_old_model_which_closes_after_it(
    server: BackgroundServer, stub: Stub, repo: Path
) -> None:
    models = server.running.models
    old = models.ready("alpha")
    outbox: list[pb.CompleteRequest | None] = []

    def requests() -> Iterator[pb.CompleteRequest]:
        for sent in range(10):
            assert wait_until(lambda sent=sent: len(outbox) > sent, 10)  # type: ignore[misc]
            message = outbox[sent]
            if message is None:
                return
            yield message

    outbox.append(pb.CompleteRequest(model="alpha", append_text="a", k=1))
    replies = stub.Complete(requests(), timeout=30)
    first = next(replies)
    assert first.model == "alpha" and first.context_tokens == 1
    assert models.in_use(old) == 1
    write_model(repo / "alpha", "alpha", a=-0.9, version="2")
    assert server.reload().replaced == ["alpha"]
    assert models.ready("alpha") is not old
    # The stream still holds (and is answered by) the old model, which is not closed yet.
    outbox.append(pb.CompleteRequest(append_text="a", k=1))
    assert next(replies).context_tokens == 2
    engine = old.engine
    assert isinstance(engine, WorkerEngine)
    assert not engine.stopped and engine.alive  # its worker still serves the stream
    outbox.append(None)
    assert list(replies) == []
    # Closed once the stream left: its worker process exits.
    assert wait_until(lambda: models.in_use(old) == 0 and engine.stopped and not engine.alive, 10)
