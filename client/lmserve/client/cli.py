"""The `lmserve` command: the client's commands plus those other installed distributions add.

The client distribution owns the console script. A distribution that adds commands (the server:
serve, train-ngram, ...) registers a `name -> module` table in the `lmserve.commands`
entry-point group; nothing here imports the server, so the client runs where only it is
installed. `args.argv` holds the arguments `main` parsed, for commands that record their own
command line.

Manners: a closed output pipe (`lmserve score ... | head -1`) ends the command quietly with
status 141, Ctrl-C quietly with status 130, as shell tools do.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Mapping, Sequence
from importlib.metadata import entry_points
from types import ModuleType

from lmserve.client.commands import COMMANDS as CLIENT_COMMANDS
from lmserve.client.commands._common import ADDRESS_ENV, DEFAULT_TARGET

ENTRY_POINT_GROUP = "lmserve.commands"
EXIT_INTERRUPTED = 130  # 128 + SIGINT
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE

DESCRIPTION = (
    "Call a running lmserve server (score, perplexity, generation, reranking, autocomplete); "
    "with the server installed, also serve, train and import models. All log-probabilities are "
    f"natural logs. Client commands call ${ADDRESS_ENV} when set and --target is not given "
    f"(default {DEFAULT_TARGET}); --json prints one JSON object per line."
)


def installed_commands() -> dict[str, str]:
    """The command tables other distributions register (`lmserve.commands`), in the order found;
    a table that fails to import (a half-removed distribution) is left out."""
    found: dict[str, str] = {}
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        try:
            table = entry.load()
        except ImportError:
            continue
        if isinstance(table, Mapping):
            found.update({str(k): str(v) for k, v in table.items()})
    return found


def all_commands(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Every command: the added ones (server first), then the client's."""
    commands = {**installed_commands(), **(extra or {})}
    for name in CLIENT_COMMANDS:
        commands.pop(name, None)
    return {**commands, **CLIENT_COMMANDS}


def build_parser(
    extra: Mapping[str, str] | None = None,
) -> tuple[argparse.ArgumentParser, dict[str, ModuleType]]:
    parser = argparse.ArgumentParser(prog="lmserve", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    modules: dict[str, ModuleType] = {}
    for name, module_name in all_commands(extra).items():
        module = importlib.import_module(module_name)
        command_parser = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(command_parser)
        modules[name] = module
    return parser, modules


def _silence_stdout() -> None:
    """Points stdout at /dev/null, so the interpreter's final flush of a closed pipe is quiet."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def main(argv: Sequence[str] | None = None, extra: Mapping[str, str] | None = None) -> int:
    """Runs one command and returns its exit status. `extra` adds commands (name -> module) to
    those installed distributions register."""
    parser, modules = build_parser(extra)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.argv = argv
    try:
        result: int = modules[args.command].run(args)
        sys.stdout.flush()
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    return result


def entry() -> None:
    """The console script: `main`, with Ctrl-C during start-up quiet too."""
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(EXIT_INTERRUPTED)


if __name__ == "__main__":
    entry()
