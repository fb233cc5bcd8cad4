"""`lmserve rerank`: rerank n-best lists with a served model, over one RerankStream call.

Input: JSON lines (`{"id", "hypotheses": [{"text", "scores"}], "reference"?}`, `-` for stdin)
or SRILM n-best files (`--format srilm`, one file per utterance, or `--file-list` files naming
them; scores converted to nats, see `lmserve.client.nbest`). Output: the reranked lists as JSON
lines with `--json` (best first, with texts, the server's figures and the original scores) or,
by default, the 1-best text per line, in input order. A progress counter goes to stderr when
reading files on a terminal.
"""

from __future__ import annotations

import argparse
import sys
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING

from lmserve.client.commands._bias_args import add_bias_arguments, bias_arguments
from lmserve.client.commands._common import add_connection_arguments, fail, with_client
from lmserve.client.commands._nbest_args import add_input_arguments, batched, read_lists
from lmserve.client.commands._progress import Progress

if TYPE_CHECKING:
    from lmserve.client import LmServeClient
    from lmserve.client.rerank_types import NBestList

HELP = "Rerank n-best lists (JSON lines or SRILM) with a model of a running server."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", metavar="FILE", help="n-best files ('-': stdin)")
    add_input_arguments(parser)
    parser.add_argument("--lm-weight", type=float, default=1.0, help="LM weight (default 1)")
    parser.add_argument(
        "--length-bonus", type=float, default=0.0, help="added per unit of length (default 0)"
    )
    parser.add_argument("--format", choices=("jsonl", "srilm"), default="jsonl")
    parser.add_argument(
        "--file-list", action="store_true", help="srilm: each FILE lists n-best files"
    )
    parser.add_argument(
        "--output",
        choices=("jsonl", "1best"),
        help="jsonl: the reranked lists (as --json); 1best: the best text per line (default)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print JSON lines: one reranked list per line"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    add_bias_arguments(parser)
    add_connection_arguments(parser, timeout=3600.0)


def run(args: argparse.Namespace) -> int:
    from lmserve.client import nbest
    from lmserve.client.rerank_types import NBestInputError

    jsonl = args.json or args.output == "jsonl"
    write = nbest.write_jsonl if jsonl else nbest.write_1best
    progress = Progress(
        "lmserve rerank", not args.quiet and "-" not in args.files and sys.stderr.isatty()
    )
    sent: deque[list[NBestList]] = deque()

    def remembered(batches: Iterator[list[NBestList]]) -> Iterator[list[NBestList]]:
        """Keeps each batch sent (drawn in gRPC's thread) to pair with its answer."""
        for batch in batches:
            sent.append(batch)
            yield batch

    def body(client: LmServeClient) -> int:
        batches = batched(read_lists(args.files, args.format, args.file_list), args.batch_lists)
        answers = client.rerank_stream(
            args.model,
            remembered(batches),
            score_weights=dict(args.weight),
            lm_weight=args.lm_weight,
            length_bonus=args.length_bonus,
            length_unit=args.length_unit,
            bos=not args.no_bos,
            eos=not args.no_eos,
            **bias_arguments(args),
        )
        try:
            for reranked in answers:
                batch = sent.popleft()
                for original, answer in zip(batch, reranked, strict=True):
                    write(sys.stdout, original, answer)
                progress.advance(len(batch))
        finally:
            progress.close()
        return 0

    try:
        return with_client("rerank", args, body)
    except NBestInputError as exc:
        return fail("rerank", str(exc))
