"""`lmserve serve`: serve every model of a model repository over gRPC until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from lmserve.server.commands.settings_help import use_settings_help

if TYPE_CHECKING:
    from lmserve.server.settings import Settings

HELP = "Serve the models of a model repository over gRPC (health, reflection, /metrics)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # Every default is None: an absent flag leaves the value to env, config file or default.
    parser.add_argument("--config", type=Path, help="YAML settings file (or LMSERVE_CONFIG)")
    parser.add_argument(
        "--model-repository", type=Path, help="folder of model folders (default: models)"
    )
    parser.add_argument("--host", help="gRPC address to bind (default: [::], all interfaces)")
    parser.add_argument("--port", type=int, help="gRPC port; 0 picks a free one (default: 50051)")
    parser.add_argument(
        "--http-port", type=int, help="HTTP/JSON, OpenAI API and demo page port (default: 8080)"
    )
    parser.add_argument("--metrics-port", type=int, help="Prometheus /metrics port (default: 9090)")
    parser.add_argument("--metrics-host", help="/metrics address to bind (default: 0.0.0.0)")
    parser.add_argument(
        "--health-port",
        type=int,
        help="plaintext grpc.health.v1-only port for probes when TLS is on (default: 0, off)",
    )
    parser.add_argument("--health-host", help="health port address to bind (default: 0.0.0.0)")
    parser.add_argument("--max-texts-per-request", type=int)
    parser.add_argument("--max-tokens-per-text", type=int)
    parser.add_argument("--max-concurrent-rpcs", type=int)
    parser.add_argument(
        "--shutdown-notice-seconds",
        type=float,
        help="after SIGTERM, seconds of NOT_SERVING health while still serving (default: 5)",
    )
    parser.add_argument(
        "--grace-period-seconds",
        type=float,
        help="then seconds in-flight RPCs get to finish (default: 30)",
    )
    parser.add_argument("--tls-cert-file", type=Path, help="PEM certificate chain: serve TLS")
    parser.add_argument("--tls-key-file", type=Path, help="PEM private key of --tls-cert-file")
    parser.add_argument(
        "--tls-client-ca-file", type=Path, help="PEM CA: require client certificates (mTLS)"
    )
    parser.add_argument(
        "--auth-token-file", type=Path, help="file holding the bearer token every RPC must send"
    )
    # No token flag: it would show in the process list. Declared only to refuse it, so that
    # argparse does not take `--auth-token SECRET` as an abbreviation of --auth-token-file.
    parser.add_argument("--auth-token", action=_RefuseTokenFlag, help=argparse.SUPPRESS)
    parser.add_argument(
        "--scoring-unit-tokens",
        type=int,
        help="positions (rows x padded length) in one neural scoring pass",
    )
    parser.add_argument(
        "--reload-poll-seconds",
        type=float,
        help="rescan the model repository this often (default: only on SIGHUP)",
    )
    parser.add_argument(
        "--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"], default=None
    )
    parser.add_argument(
        "--log-format",
        choices=["text", "json"],
        default=None,
        help="json: one JSON object per line, with the RPC's request id (default: text)",
    )
    # Every setting, with its environment variable and default, after the flags.
    use_settings_help(parser)


class _RefuseTokenFlag(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        parser.error("--auth-token is not a flag: use --auth-token-file or LMSERVE_AUTH_TOKEN")


def settings_from_args(args: argparse.Namespace) -> Settings:
    """The Settings for these flags (flags > env > config file > defaults)."""
    from lmserve.server.settings import load_settings

    names = (
        "config",
        "model_repository",
        "host",
        "port",
        "http_port",
        "metrics_port",
        "metrics_host",
        "health_port",
        "health_host",
        "max_texts_per_request",
        "max_tokens_per_text",
        "max_concurrent_rpcs",
        "shutdown_notice_seconds",
        "grace_period_seconds",
        "tls_cert_file",
        "tls_key_file",
        "tls_client_ca_file",
        "auth_token_file",
        "scoring_unit_tokens",
        "reload_poll_seconds",
        "log_level",
        "log_format",
    )
    return load_settings({name: getattr(args, name, None) for name in names})


def run(args: argparse.Namespace) -> int:
    import asyncio
    import sys

    from pydantic import ValidationError

    from lmserve.server.allocator import keep_freed_memory
    from lmserve.server.front.api.observe import TracingUnavailable
    from lmserve.server.front.process.app import serve
    from lmserve.server.logging_setup import setup_logging

    try:
        settings = settings_from_args(args)
    except (ValidationError, ValueError) as exc:
        print(f"lmserve serve: bad settings: {exc}", file=sys.stderr)
        return 2
    setup_logging(settings.log_level, settings.log_format)
    keep_freed_memory()  # per-step numpy temporaries stay mapped (see allocator.py)
    try:
        asyncio.run(serve(settings))
    # No repository folder, port taken, unreadable TLS or token file, tracing not installed.
    except (OSError, TracingUnavailable) as exc:
        print(f"lmserve serve: {exc}", file=sys.stderr)
        return 1
    return 0
