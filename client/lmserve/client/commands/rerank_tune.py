"""`lmserve rerank-tune`: the LM weight and length bonus with the lowest WER on a dev set.

The lists (JSON lines with a `reference` each) are reranked once, with lm_weight 1 and no
length bonus; since the LM log-probabilities, scores and lengths do not depend on the weights,
every grid point is then recombined locally (`lmserve.client.reranking`). Prints a table of the
grid points and the best pair; with `--json`, one JSON line per grid point (`lm_weight`,
`length_bonus`, `wer`) and a last one with the best pair. Needs `jiwer` (the `rerank` extra).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from typing import TYPE_CHECKING

from lmserve.client.commands._common import (
    add_connection_arguments,
    add_json_argument,
    fail,
    with_client,
)
from lmserve.client.commands._nbest_args import add_input_arguments, batched, read_lists

if TYPE_CHECKING:
    from lmserve.client import LmServeClient

HELP = "Tune the LM weight and length bonus of rerank for the lowest WER on a dev set."


def float_list(value: str) -> list[float]:
    """`0,0.5,1` -> [0.0, 0.5, 1.0]."""
    try:
        numbers = [float(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected numbers separated by commas: {value!r}"
        ) from None
    if not numbers:
        raise argparse.ArgumentTypeError("expected at least one number")
    return numbers


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="DEV", help="JSON-lines n-best lists with references")
    add_input_arguments(parser)
    parser.add_argument(
        "--grid-lm-weight",
        type=float_list,
        default=[0.0, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0, 1.5, 2.0],
        metavar="W,W,...",
        help="LM weights to try",
    )
    parser.add_argument(
        "--grid-length-bonus",
        type=float_list,
        default=[0.0],
        metavar="B,B,...",
        help="length bonuses to try (default 0)",
    )
    add_json_argument(parser, "one per grid point, then the best")
    add_connection_arguments(parser, timeout=3600.0)


def run(args: argparse.Namespace) -> int:
    from lmserve.client.rerank_types import NBestInputError
    from lmserve.client.reranking import best_point, grid_search

    try:
        import jiwer
    except ImportError:
        return fail("rerank-tune", "needs jiwer: pip install 'lmserve-client[rerank]'")

    def body(client: LmServeClient) -> int:
        lists = list(read_lists([args.file], "jsonl", False))
        reranked = [
            answer
            for answers in client.rerank_stream(
                args.model,
                batched(iter(lists), args.batch_lists),
                length_unit=args.length_unit,
                bos=not args.no_bos,
                eos=not args.no_eos,
            )
            for answer in answers
        ]
        points = grid_search(
            lists,
            reranked,
            args.grid_lm_weight,
            args.grid_length_bonus,
            lambda refs, hyps: float(jiwer.wer(list(refs), list(hyps))),
            dict(args.weight),
        )
        best = best_point(points)
        if args.json:
            for point in points:
                print(json.dumps(asdict(point)))
            print(json.dumps({"best": asdict(best), "lists": len(lists)}))
            return 0
        print("LM_WEIGHT\tLENGTH_BONUS\tWER")
        for point in points:
            print(f"{point.lm_weight:g}\t{point.length_bonus:g}\t{point.wer:.4f}")
        print(
            f"best: --lm-weight {best.lm_weight:g} --length-bonus {best.length_bonus:g} "
            f"(WER {best.wer:.4f} over {len(lists)} lists)"
        )
        return 0

    try:
        return with_client("rerank-tune", args, body)
    except (NBestInputError, ValueError) as exc:
        return fail("rerank-tune", str(exc))
