"""What the client commands share: the connection options and one-line error reporting.

Imports nothing heavy at module level, so `lmserve --help` does not load gRPC.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from lmserve.client import LmServeClient

DEFAULT_TARGET = "localhost:50051"  # the same as lmserve.client.DEFAULT_TARGET
# The server to call when --target is not given.
ADDRESS_ENV = "LMSERVE_ADDRESS"
EXIT_ERROR = 1


def default_target() -> str:
    """$LMSERVE_ADDRESS when set (and not empty), else localhost:50051."""
    return os.environ.get(ADDRESS_ENV) or DEFAULT_TARGET


def add_connection_arguments(parser: argparse.ArgumentParser, timeout: float = 30.0) -> None:
    parser.add_argument(
        "--target",
        "--address",
        dest="target",
        default=default_target(),
        metavar="HOST:PORT",
        help=f"the server to call (default: ${ADDRESS_ENV} if set, else {DEFAULT_TARGET}; "
        f"now {default_target()})",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=timeout,
        metavar="SECONDS",
        help=f"deadline of each call in seconds (default {timeout:g})",
    )


def add_json_argument(parser: argparse.ArgumentParser, what: str) -> None:
    """`--json`: JSON Lines (one object per line) instead of the human-readable default."""
    parser.add_argument("--json", action="store_true", help=f"print JSON lines: {what}")


def fail(command: str, message: str) -> int:
    print(f"lmserve {command}: error: {message}", file=sys.stderr)
    return EXIT_ERROR


def with_client(
    command: str, args: argparse.Namespace, body: Callable[[LmServeClient], int]
) -> int:
    """Runs `body` with a client for `args.target`; any client error becomes one stderr line
    and a non-zero exit code. Ctrl-C and a closed stdout propagate to `lmserve`'s `main`,
    which ends quietly with 130 or 141."""
    from lmserve.client import LmServeClient, LmServeClientError, UnavailableError

    try:
        with LmServeClient(args.target, timeout=args.timeout) as client:
            return body(client)
    except UnavailableError as exc:
        return fail(command, f"{exc} (server at {args.target})")
    except LmServeClientError as exc:
        return fail(command, str(exc))
    except BrokenPipeError:
        raise  # the reader went away (`| head`): `lmserve` ends quietly
    except OSError as exc:
        return fail(command, f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": "))


def open_text(path: str) -> TextIO:
    """A text file to read, `-` for standard input."""
    if path == "-":
        return sys.stdin
    return open(path, encoding="utf-8")  # noqa: SIM115 - closed by the caller


def read_batches(stream: TextIO, batch_size: int) -> Iterator[list[str]]:
    """Lines (newline removed) in lists of `batch_size`; blank lines kept, as KenLM scores them."""
    batch: list[str] = []
    for line in stream:
        batch.append(line.rstrip("\r\n"))
        if len(batch) >= batch_size:
            yield batch
            batch = []
    if batch:
        yield batch


def positive_int(value: str) -> int:
    number = int(value)
    if number <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return number
