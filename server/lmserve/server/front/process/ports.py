"""Binding the server's ports: a taken port is refused with one line that names it.

check_bindable("0.0.0.0", 50051)          # before minutes of model loading
port = bind(server, "0.0.0.0:50051", credentials)
"""

from __future__ import annotations

import errno
import socket

import grpc
from grpc import aio


def check_bindable(host: str, port: int) -> None:
    """Raises a one-line OSError when `host:port` is taken, as a bind by gRPC would find it (with
    SO_REUSEADDR, without SO_REUSEPORT). Port 0 always binds."""
    if port == 0:
        return
    name = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        infos = socket.getaddrinfo(name, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise OSError(f"cannot bind {host}:{port}: {exc.strerror}") from None
    for family, kind, proto, _, address in infos:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                why = "address in use" if exc.errno == errno.EADDRINUSE else exc.strerror
                raise OSError(f"cannot bind {host}:{port}: {why}") from None


def bind(server: aio.Server, address: str, credentials: grpc.ServerCredentials | None) -> int:
    """Adds the (secure, when there are credentials) port; a failed bind is an OSError."""
    try:
        if credentials is None:
            port = server.add_insecure_port(address)
        else:
            port = server.add_secure_port(address, credentials)
    except RuntimeError as exc:  # gRPC's "Failed to bind to address ..."
        raise OSError(f"cannot bind {address}: {exc}") from None
    if port == 0:
        raise OSError(f"cannot bind {address}")
    return port
