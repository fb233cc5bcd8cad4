"""The `lmserve` command: one entry point whose subcommands live in their own modules.

Each command module defines `HELP` (one line), `add_arguments(parser)` and `run(args) -> int`,
and imports anything heavy inside `run`, so `lmserve --help` and client commands stay fast.
`args.argv` holds the arguments `main` parsed (`["train-rnn", ...]`), for commands that record
their own command line.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType

# Subcommand name -> module implementing it, in the order `--help` lists them.
COMMANDS: dict[str, str] = {
    "serve": "lmserve.server.commands.serve",
    "import-arpa": "lmserve.server.commands.import_arpa",
    "train-ngram": "lmserve.export.ngram.command",
    "train-rnn": "lmserve.export.rnn.command",
    # The same command under a name that covers the feed-forward model too.
    "train-neural": "lmserve.export.rnn.command",
    "interpolate": "lmserve.export.interpolate_command",
    "export-rnn": "lmserve.export.rnn.export_command",
    "models": "lmserve.client.commands.models",
    "score": "lmserve.client.commands.score",
    "ppl": "lmserve.client.commands.ppl",
    "generate": "lmserve.client.commands.generate",
    "complete": "lmserve.client.commands.complete",
    "health": "lmserve.client.commands.health",
    "rerank": "lmserve.client.commands.rerank",
    "rerank-tune": "lmserve.client.commands.rerank_tune",
}


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, ModuleType]]:
    parser = argparse.ArgumentParser(
        prog="lmserve",
        description="Serve n-gram and recurrent language models over gRPC, train and import them, "
        "and call a running server. All log-probabilities are natural logs.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    modules: dict[str, ModuleType] = {}
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(module_name)
        command_parser = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(command_parser)
        modules[name] = module
    return parser, modules


def main(argv: Sequence[str] | None = None) -> int:
    """Runs one command; `args.argv` is the command line it parsed (the program name left out),
    so that commands recording how they were run record this call, not the process's."""
    parser, modules = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.argv = argv
    result: int = modules[args.command].run(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
