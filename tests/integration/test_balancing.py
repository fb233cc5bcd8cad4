"""One client over three real `lmserve serve` processes: round-robin spreads unary calls over
all of them, and a server killed mid-loop costs no failed call (UNAVAILABLE is retried)."""

from __future__ import annotations

import json
import signal
import threading
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from serve_process import ServeProcess

from lmserve.client import LmServeClient
from lmserve.client._channel import ChannelPlan


def score_count(server: ServeProcess) -> float:
    """The OK Score calls a server's /metrics counted."""
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "lmserve_requests_total"
        and s.labels.get("method") == "Score"
        and s.labels.get("code") == "OK"
    )


@pytest.fixture(scope="module")
def three_servers(model_repository: Path) -> Iterator[list[ServeProcess]]:
    """Three `lmserve serve` processes for the module: the first may be killed by a test, the
    last never is (the DNS test needs one that answers, and calls no Score)."""
    flags = ("--shutdown-notice-seconds", "0", "--grace-period-seconds", "1")
    with ThreadPoolExecutor(3) as pool:
        servers = list(pool.map(lambda _: ServeProcess(model_repository, *flags), range(3)))
    try:
        yield servers
    finally:
        for server in servers:
            server.kill()


def test_calls_spread_over_every_server_and_survive_one_dying(
    three_servers: list[ServeProcess],
) -> None:
    with LmServeClient([s.address for s in three_servers], timeout=20) as client:
        client.wait_for_ready(timeout=20)
        for _ in range(60):
            assert client.score("test", ["looking on a little"])[0].token_count == 5
        counts = [score_count(s) for s in three_servers]
        assert sum(counts) == 60 and all(c >= 5 for c in counts), counts

        victim, survivors = three_servers[0], three_servers[1:]
        before = [score_count(s) for s in survivors]
        done = 0
        lock = threading.Lock()
        failures: list[BaseException] = []

        def call(_: int) -> None:
            nonlocal done
            try:
                assert client.score("test", ["a little"])[0].token_count == 3
            except BaseException as exc:
                failures.append(exc)
            with lock:
                done += 1
                if done == 50:  # kill one server while other calls are in flight
                    victim.process.send_signal(signal.SIGKILL)

        with ThreadPoolExecutor(4) as pool:
            list(pool.map(call, range(200)))
        assert failures == []
        assert victim.wait(timeout=10) == -signal.SIGKILL
        after = [score_count(s) for s in survivors]
        served = sum(after) - sum(before)
        assert served >= 150, (before, after)  # the survivors took over the victim's share


def test_a_dns_target_balances_and_sets_the_service_config(
    three_servers: list[ServeProcess],
) -> None:
    server = three_servers[-1]  # never the one killed; ListModels leaves the Score counts be
    with LmServeClient(f"dns:///127.0.0.1:{server.port}") as client:
        assert client.list_models()
    plan = ChannelPlan.build(f"dns:///localhost:{server.port}")
    config = json.loads(dict(plan.options)["grpc.service_config"])
    assert config["loadBalancingConfig"] == [{"round_robin": {}}]
