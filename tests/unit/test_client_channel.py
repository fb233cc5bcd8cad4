"""How the client turns its targets into one gRPC target and a service config."""

from __future__ import annotations

import json

import pytest

from lmserve.client._channel import IDEMPOTENT_METHODS, ChannelPlan, join_targets


def test_a_single_target_is_left_alone_without_balancing() -> None:
    assert join_targets("localhost:50051") == ("localhost:50051", False)
    assert join_targets(["10.0.0.1:1"]) == ("10.0.0.1:1", False)
    assert "grpc.service_config" not in dict(ChannelPlan.build("localhost:50051").options)


def test_a_list_becomes_one_ipv4_or_ipv6_target() -> None:
    assert join_targets(["127.0.0.1:1", "localhost:2"]) == ("ipv4:127.0.0.1:1,127.0.0.1:2", True)
    assert join_targets(["[::1]:1", "[::1]:2"]) == ("ipv6:[::1]:1,[::1]:2", True)
    assert join_targets("dns:///lm.internal:50051") == ("dns:///lm.internal:50051", True)


@pytest.mark.parametrize(
    ("targets", "problem"),
    [
        (["lm-a:1", "lm-b:2"], "dns:///"),
        (["127.0.0.1:1", "[::1]:2"], "all IPv4 or all IPv6"),
        (["127.0.0.1", "127.0.0.1:2"], "host:port"),
        ([], "no targets"),
    ],
)
def test_bad_target_lists_are_refused_plainly(targets: list[str], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        join_targets(targets)


def test_balanced_channels_retry_unavailable_on_idempotent_unary_calls_only() -> None:
    plan = ChannelPlan.build(["127.0.0.1:1", "127.0.0.1:2"])
    config = json.loads(dict(plan.options)["grpc.service_config"])
    assert config["loadBalancingConfig"] == [{"round_robin": {}}]
    [method_config] = config["methodConfig"]
    names = {n["method"] for n in method_config["name"]}
    assert names == set(IDEMPOTENT_METHODS)
    assert "Generate" not in names and "ScoreStream" not in names
    assert method_config["retryPolicy"]["retryableStatusCodes"] == ["UNAVAILABLE"]


def test_a_token_without_tls_travels_as_metadata() -> None:
    plan = ChannelPlan.build("127.0.0.1:1", token="t0k")
    assert plan.credentials is None
    assert plan.token_metadata == (("authorization", "Bearer t0k"),)
    with pytest.raises(ValueError, match="together"):
        ChannelPlan.build("127.0.0.1:1", tls_cert_file="client.pem")
