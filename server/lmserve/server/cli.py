"""The server's subcommands of `lmserve` (serve, train, import, export).

The `lmserve` command itself belongs to the client distribution (`lmserve.client.cli`); this
distribution registers `COMMANDS` in the `lmserve.commands` entry-point group (pyproject.toml),
so `lmserve` lists them when the server is installed. `main` here runs the same command with
these tables passed in directly, for `python -m lmserve.server.cli` and for tests that run a
checkout without installed metadata.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

# Subcommand name -> module implementing it, in the order `--help` lists them (before the
# client's commands).
COMMANDS: dict[str, str] = {
    "serve": "lmserve.server.commands.serve",
    "import-arpa": "lmserve.server.commands.import_arpa",
    "train-ngram": "lmserve.export.ngram.command",
    "train-rnn": "lmserve.export.trainers.command",
    # The same command under a name that covers the feed-forward model too.
    "train-neural": "lmserve.export.trainers.command",
    "interpolate": "lmserve.export.interpolate_command",
    "export-rnn": "lmserve.export.trainers.export_command",
    "import-onnx": "lmserve.export.custom.import_onnx_command",
    "import-torchscript": "lmserve.export.custom.import_torchscript_command",
    "import-hf": "lmserve.export.hf.command",
    "quantize": "lmserve.export.quantize_command",
    "optimize": "lmserve.export.hf.optimize_command",
}


def main(argv: Sequence[str] | None = None) -> int:
    """`lmserve` with the server's commands and the client's, whatever the installed metadata."""
    from lmserve.client.cli import main as lmserve_main

    return lmserve_main(argv, extra=COMMANDS)


if __name__ == "__main__":
    sys.exit(main())
