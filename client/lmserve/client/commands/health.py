"""`lmserve health [--model M]`: ask the server's gRPC health service; exit 0 only if SERVING."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from lmserve.client.commands._common import (
    EXIT_ERROR,
    add_connection_arguments,
    add_json_argument,
    with_client,
)

if TYPE_CHECKING:
    from lmserve.client import LmServeClient

HELP = "Check that a running server (or one of its models) is serving."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="check this model instead of the whole server")
    add_json_argument(parser, '{"target", "model", "status", "serving"}')
    add_connection_arguments(parser)


def run(args: argparse.Namespace) -> int:
    def body(client: LmServeClient) -> int:
        status = client.health(args.model)
        if args.json:
            record = {"target": args.target, "model": args.model}
            print(json.dumps(record | {"status": status.status, "serving": status.serving}))
        else:
            print(f"{args.model or args.target}: {status.status}")
        return 0 if status.serving else EXIT_ERROR

    return with_client("health", args, body)
