"""`lmserve complete`: type and watch a model's next-word suggestions follow each keystroke.

Interactive (needs prompt-toolkit, `pip install 'lmserve-client[demo]'`): the suggestions and their
probabilities are shown under the input line as you type; Tab accepts the best one, Enter
starts a new sentence, Ctrl-D or Ctrl-C quits. With `--type TEXT` it runs without a terminal:
the text is typed one character at a time (a backspace character deletes one, a newline starts
a new sentence) and each keystroke's suggestions are printed, one line a keystroke (`--json`:
one JSON object a keystroke), for scripts and tests. `--user-words` and `--cache-weight` set the
session's adaptation (word-level models).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import TYPE_CHECKING, Any

from lmserve.client.commands._common import (
    add_connection_arguments,
    add_json_argument,
    fail,
    positive_int,
    with_client,
)
from lmserve.client.commands._complete_session import open_session

if TYPE_CHECKING:
    from lmserve.client import Completion, CompletionSession, LmServeClient

HELP = "Autocomplete as you type: live next-word suggestions from a model (or --type TEXT)."
BACKSPACE = "\b"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="the model's name")
    parser.add_argument("--k", type=positive_int, default=3, help="suggestions shown (3)")
    parser.add_argument(
        "--type",
        dest="typed",
        metavar="TEXT",
        help="type TEXT key by key (\\b deletes) and print each keystroke's suggestions",
    )
    parser.add_argument(
        "--session-id", metavar="ID", help="continue this server session (default: a new one)"
    )
    parser.add_argument(
        "--user-words",
        type=_word_list,
        action="extend",
        default=None,
        metavar="W1,W2",
        help="words to offer even when the model does not know them (names, jargon); repeatable",
    )
    parser.add_argument(
        "--cache-weight",
        type=float,
        metavar="W",
        help="weight of the session's own words in the suggestions, 0 (off) to <1 "
        "(default: the server's)",
    )
    add_json_argument(parser, "with --type, one object per keystroke")
    add_connection_arguments(parser)


def _word_list(value: str) -> list[str]:
    words = [w.strip() for w in value.split(",") if w.strip()]
    if not words:
        raise argparse.ArgumentTypeError(f"expected comma-separated words, got {value!r}")
    return words


def _completions(found: list[Completion]) -> list[dict[str, Any]]:
    return [{"word": c.word, "log_prob": c.log_prob, "prob": math.exp(c.log_prob)} for c in found]


def type_keys(session: CompletionSession, text: str) -> list[dict[str, Any]]:
    """Types `text` one key at a time; one record per keystroke (what `--type` prints)."""
    records = []
    typed = ""
    for key in text:
        if key == BACKSPACE:
            found = session.backspace()
            typed = typed[:-1]
        elif key == "\n":
            found = session.reset()
            typed = ""
        else:
            found = session.type(key)
            typed += key
        records.append(
            {
                "key": key,
                "typed": typed,
                # The committed words as typed: the session's own tokens may be BPE pieces.
                "context": typed[: len(typed) - len(session.partial)].split(),
                "partial": session.partial,
                "completions": _completions(found),
                "session_id": session.session_id,
            }
        )
    return records


def _human(record: dict[str, Any]) -> str:
    """`typed|<TAB>word (prob)  word (prob)`: what was typed, then the suggestions."""
    found = "  ".join(f"{c['word']} ({c['prob']:.3f})" for c in record["completions"])
    return f"{record['typed']}|\t{found}"


def _script(client: LmServeClient, args: argparse.Namespace) -> int:
    with open_session(client, args) as session:
        for record in type_keys(session, args.typed):
            sys.stdout.write((json.dumps(record) if args.json else _human(record)) + "\n")
            sys.stdout.flush()
    return 0


def run(args: argparse.Namespace) -> int:
    if args.typed is None:
        try:
            import prompt_toolkit  # noqa: F401
        except ImportError:
            return fail(
                "complete",
                "the interactive demo needs prompt-toolkit: pip install 'lmserve-client[demo]' "
                "(or run it with --type TEXT)",
            )
        from lmserve.client.commands.complete_app import interactive

        return with_client("complete", args, lambda client: interactive(client, args))
    return with_client("complete", args, lambda client: _script(client, args))
