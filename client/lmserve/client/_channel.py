"""How both clients build their channel: TLS (and mTLS) credentials, the bearer token, and
round-robin balancing with retries over several servers.

    plan = ChannelPlan.build(["127.0.0.1:50051", "127.0.0.1:50052"], token="...")
    channel = grpc.insecure_channel(plan.target, options=plan.options)

A list of targets becomes one `ipv4:`/`ipv6:` target; a `dns:///name:port` target balances over
every address the name resolves to. Either way the service config asks for `round_robin` and
retries UNAVAILABLE on the idempotent unary RPCs, so a server that dies costs no failed call.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

SERVICE = "lmserve.v1.LanguageModelService"
# Safe to send twice: they change nothing on the server.
IDEMPOTENT_METHODS = ("Score", "Perplexity", "ListModels", "GetModel", "Rerank", "BeamSearch")

RETRY_POLICY = {
    "maxAttempts": 5,
    "initialBackoff": "0.05s",
    "maxBackoff": "1s",
    "backoffMultiplier": 2,
    "retryableStatusCodes": ["UNAVAILABLE"],
}
BALANCING_CONFIG = {
    "loadBalancingConfig": [{"round_robin": {}}],
    "methodConfig": [
        {
            "name": [{"service": SERVICE, "method": m} for m in IDEMPOTENT_METHODS],
            "retryPolicy": RETRY_POLICY,
        }
    ],
}

Targets = str | Sequence[str]


def join_targets(targets: Targets) -> tuple[str, bool]:
    """One gRPC target for `targets`, and whether to balance over its addresses."""
    if isinstance(targets, str):
        return targets, targets.startswith(("dns:", "ipv4:", "ipv6:"))
    if not targets:
        raise ValueError("no targets given")
    if len(targets) == 1:
        return targets[0], False
    hosts = [_split_host_port(t) for t in targets]
    versions = {ipaddress.ip_address(h).version for h, _ in hosts}
    if len(versions) != 1:
        raise ValueError("a list of targets must be all IPv4 or all IPv6 addresses")
    if versions == {4}:
        return "ipv4:" + ",".join(f"{h}:{p}" for h, p in hosts), True
    return "ipv6:" + ",".join(f"[{h}]:{p}" for h, p in hosts), True


def _split_host_port(target: str) -> tuple[str, str]:
    host, sep, port = target.rpartition(":")
    host = host.strip("[]")
    if host == "localhost":
        host = "127.0.0.1"
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(
            f"{target!r}: a list of targets takes IP addresses (host:port); "
            "for a name, pass one 'dns:///name:port' target"
        ) from None
    if not sep or not port.isdigit():
        raise ValueError(f"{target!r}: expected host:port")
    return host, port


def _pem(path: str | Path | None) -> bytes | None:
    return None if path is None else Path(path).read_bytes()


@dataclass(frozen=True)
class ChannelPlan:
    """What a channel needs: its target, options, and credentials (None: plaintext)."""

    target: str
    options: list[tuple[str, Any]]
    credentials: grpc.ChannelCredentials | None
    # Set when a token must travel as metadata (plaintext channels take no call credentials).
    token_metadata: tuple[tuple[str, str], ...] | None

    @classmethod
    def build(
        cls,
        targets: Targets,
        *,
        options: Sequence[tuple[str, Any]] = (),
        credentials: grpc.ChannelCredentials | None = None,
        tls_ca_file: str | Path | None = None,
        tls_cert_file: str | Path | None = None,
        tls_key_file: str | Path | None = None,
        token: str | None = None,
    ) -> ChannelPlan:
        """TLS when `credentials` or any TLS file is given (`tls_ca_file` None: the system's
        roots); a client certificate and key for mTLS; `token` sent as a bearer token."""
        target, balance = join_targets(targets)
        opts = list(options)
        if balance and not any(k == "grpc.service_config" for k, _ in opts):
            opts.append(("grpc.service_config", json.dumps(BALANCING_CONFIG)))
        if (tls_cert_file is None) != (tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file go together")
        if credentials is None and (tls_ca_file or tls_cert_file):
            credentials = grpc.ssl_channel_credentials(
                root_certificates=_pem(tls_ca_file),
                private_key=_pem(tls_key_file),
                certificate_chain=_pem(tls_cert_file),
            )
        metadata = None
        if token is not None and credentials is not None:
            credentials = grpc.composite_channel_credentials(
                credentials, grpc.access_token_call_credentials(token)
            )
        elif token is not None:
            metadata = (("authorization", f"Bearer {token}"),)
        return cls(target, opts, credentials, metadata)

    def sync_channel(self) -> grpc.Channel:
        if self.credentials is not None:
            channel = grpc.secure_channel(self.target, self.credentials, options=self.options)
        else:
            channel = grpc.insecure_channel(self.target, options=self.options)
        if self.token_metadata is None:
            return channel
        return grpc.intercept_channel(channel, _SyncMetadata(self.token_metadata))

    def async_channel(self) -> grpc.aio.Channel:
        interceptors: list[Any] = []  # the grpc stubs type this list loosely
        if self.token_metadata is not None:
            metadata = self.token_metadata
            interceptors = [
                _AsyncUnaryUnary(metadata),
                _AsyncUnaryStream(metadata),
                _AsyncStreamUnary(metadata),
                _AsyncStreamStream(metadata),
            ]
        if self.credentials is not None:
            return grpc.aio.secure_channel(
                self.target, self.credentials, options=self.options, interceptors=interceptors
            )
        return grpc.aio.insecure_channel(
            self.target, options=self.options, interceptors=interceptors
        )


def _with_metadata(details: Any, extra: tuple[tuple[str, str], ...], cls: Any) -> Any:
    metadata = [*(details.metadata or ()), *extra]
    return cls(
        details.method,
        details.timeout,
        metadata,
        details.credentials,
        details.wait_for_ready,
        *([details.compression] if cls is _SyncDetails else []),
    )


@dataclass(frozen=True)
class _SyncDetails(grpc.ClientCallDetails):
    method: str
    timeout: float | None
    metadata: Any
    credentials: Any
    wait_for_ready: bool | None
    compression: Any


class _SyncMetadata(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds the token metadata to every call of a plaintext sync channel."""

    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self._metadata = metadata

    def _details(self, details: Any) -> Any:
        return _with_metadata(details, self._metadata, _SyncDetails)

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._details(details), requests)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._details(details), requests)


class _AsyncBase:
    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self._metadata = metadata

    def _details(self, details: Any) -> Any:
        return _with_metadata(details, self._metadata, grpc.aio.ClientCallDetails)


class _AsyncUnaryUnary(_AsyncBase, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)


class _AsyncUnaryStream(_AsyncBase, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)


class _AsyncStreamUnary(_AsyncBase, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(self._details(details), requests)


class _AsyncStreamStream(_AsyncBase, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(self._details(details), requests)
