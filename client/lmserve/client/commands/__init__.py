"""The client's subcommands of `lmserve`, registered in the `lmserve.commands` entry-point group.

Each command module defines `HELP` (one line), `add_arguments(parser)` and `run(args) -> int`,
and imports anything heavy inside `run`, so `lmserve --help` stays fast.
"""

from __future__ import annotations

# Subcommand name -> module implementing it, in the order `--help` lists them.
COMMANDS: dict[str, str] = {
    "models": "lmserve.client.commands.models",
    "score": "lmserve.client.commands.score",
    "ppl": "lmserve.client.commands.ppl",
    "generate": "lmserve.client.commands.generate",
    "complete": "lmserve.client.commands.complete",
    "health": "lmserve.client.commands.health",
    "rerank": "lmserve.client.commands.rerank",
    "rerank-tune": "lmserve.client.commands.rerank_tune",
    "rescore-lattice": "lmserve.client.commands.rescore_lattice",
}
