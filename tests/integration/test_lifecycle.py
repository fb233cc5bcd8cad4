"""`lmserve serve`'s lifecycle as a user meets it, with real processes: a taken port, the
shutdown notice, and SIGTERM while Generate streams run."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from serve_process import (
    ServeProcess,
    clean_env,
    engine_worker_pids,
    process_exists,
    process_title,
    serve_command,
    wait_until,
)

from lmserve.client import GenerationFinished, LmServeClient
from lmserve.client.errors import UnavailableError
from lmserve.v1 import lm_service_pb2 as pb
from lmserve.v1 import lm_service_pb2_grpc

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def test_a_second_server_on_a_taken_port_exits_with_one_clear_line(
    model_repository: Path,
) -> None:
    with ServeProcess(model_repository) as first:
        second = subprocess.run(
            serve_command(model_repository, "--port", str(first.port)),
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode == 1
        lines = second.stderr.strip().splitlines()
        assert lines == [f"lmserve serve: cannot bind 127.0.0.1:{first.port}: address in use"]
        # The first server still has the port to itself, and answers.
        with LmServeClient(first.address) as client:
            assert client.score("test", ["looking on a little"])[0].token_count == 5


def _health(channel: grpc.Channel) -> int:
    stub = health_pb2_grpc.HealthStub(channel)
    return stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status


def test_sigterm_turns_health_not_serving_while_still_serving_the_notice(
    model_repository: Path,
) -> None:
    notice = 4.0
    with ServeProcess(model_repository, "--shutdown-notice-seconds", str(notice)) as server:
        with grpc.insecure_channel(server.address) as channel:
            assert _health(channel) == SERVING
            signalled = time.monotonic()
            server.process.send_signal(signal.SIGTERM)
            assert wait_until(lambda: _health(channel) == NOT_SERVING, timeout=notice / 2)
            # Load balancers see NOT_SERVING; requests that still come are answered.
            stub = lm_service_pb2_grpc.LanguageModelServiceStub(channel)
            reply = stub.Score(pb.ScoreRequest(model="test", texts=["a little"]), timeout=5)
            # The HTTP front drains the same way: /healthz says so, calls are still answered.
            http = f"http://127.0.0.1:{server.http_port}"
            with pytest.raises(urllib.error.HTTPError) as draining:
                urllib.request.urlopen(f"{http}/healthz", timeout=5)
            assert (draining.value.code, draining.value.read()) == (503, b"NOT_SERVING\n")
            score = urllib.request.Request(
                f"{http}/lmserve.v1.LanguageModelService/Score",
                data=json.dumps({"model": "test", "texts": ["a little"]}).encode(),
                headers={"content-type": "application/json"},
            )
            with urllib.request.urlopen(score, timeout=5) as answer:
                assert json.loads(answer.read())["results"][0]["tokenCount"] == 3
            assert time.monotonic() - signalled < notice, "too slow to check within the notice"
            assert reply.results[0].token_count == 3
        assert server.wait(timeout=notice + 15) == 0
        assert time.monotonic() - signalled >= notice  # the notice was served in full


@pytest.fixture
def lstm_repository(tmp_path: Path, repo_root: Path) -> Path:
    (tmp_path / "kjv-lstm").symlink_to(repo_root / "models" / "kjv-lstm")
    return tmp_path


def test_sigterm_lets_running_generate_streams_finish(lstm_repository: Path) -> None:
    flags = ("--shutdown-notice-seconds", "0", "--grace-period-seconds", "60")
    with ServeProcess(lstm_repository, *flags) as server, LmServeClient(server.address) as client:
        started = threading.Barrier(9)
        finished: list[GenerationFinished] = []
        errors: list[BaseException] = []

        def generate(seed: int) -> None:
            try:
                events = client.generate(
                    "kjv-lstm", "and god said", max_new_tokens=400, ignore_eos=True, seed=seed
                )
                first = True
                for event in events:
                    if first:
                        started.wait(timeout=30)
                        first = False
                    if isinstance(event, GenerationFinished):
                        finished.append(event)
            except BaseException as exc:
                errors.append(exc)
                started.abort()

        streams = [threading.Thread(target=generate, args=(seed,)) for seed in range(8)]
        for stream in streams:
            stream.start()
        started.wait(timeout=30)  # every stream has its first token
        workers = engine_worker_pids(server.process.pid)
        assert [process_title(p) for p in workers] == ["lmserve: engine kjv-lstm"]
        server.process.send_signal(signal.SIGTERM)
        running_at_signal = 8 - len(finished)
        for stream in streams:
            stream.join(timeout=60)
        last_ended = time.monotonic()
        assert not errors, errors
        assert running_at_signal > 0, "the streams ended before SIGTERM: the test proves nothing"
        assert sorted(f.reason for f in finished) == ["length"] * 8
        assert all(f.usage.generated_tokens == 400 for f in finished)
        assert server.wait(timeout=15) == 0
        # Exits once the last stream ended, not after the 60 s grace period; its worker too.
        assert time.monotonic() - last_ended < 15
        assert not any(process_exists(p) for p in workers)
        # New calls after the shutdown are refused rather than hanging.
        with pytest.raises(UnavailableError):
            client.list_models(timeout=5)


@pytest.mark.parametrize("notice", ["30", "0"], ids=["during-notice", "during-grace"])
def test_a_second_signal_stops_at_once(lstm_repository: Path, notice: str) -> None:
    flags = ("--shutdown-notice-seconds", notice, "--grace-period-seconds", "60")
    with ServeProcess(lstm_repository, *flags) as server, LmServeClient(server.address) as client:
        events = client.generate(
            "kjv-lstm", "and god said", max_new_tokens=4000, ignore_eos=True, timeout=120
        )
        next(events)  # a stream that would run for far longer than this test
        server.process.send_signal(signal.SIGTERM)
        assert wait_until(lambda: "shutting down" in server.stderr(), timeout=10)
        assert next(events)  # still served: the first signal waits for it
        server.process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        with pytest.raises(UnavailableError):
            for _ in events:
                pass
        assert server.wait(timeout=15) == 0
        assert time.monotonic() - signalled < 15
        assert "second signal: stopping now" in server.stderr()


@pytest.mark.parametrize("flag", ["--metrics-port", "--http-port"])
def test_a_taken_metrics_or_http_port_is_refused_too(model_repository: Path, flag: str) -> None:
    with ServeProcess(model_repository) as first:
        taken = first.metrics_port if flag == "--metrics-port" else first.http_port
        assert taken
        second = subprocess.run(
            serve_command(model_repository, flag, str(taken)),
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode == 1
        expected = f"lmserve serve: cannot bind 127.0.0.1:{taken}: address in use"
        assert second.stderr.strip().splitlines() == [expected]
