"""`lmserve score`: score texts on a running server, one output line per text.

Each line is `LOG_PROB<TAB>TOKENS<TAB>OOVS<TAB>TEXT`: the total log-probability in nats (`</s>`
included unless --no-eos), the scored token count and the OOV count; with `--bias FILE` the
biased total (`LOG_PROB + bias`) follows LOG_PROB. `--tokens` adds one indented
line per token (token, log-prob in nats, matched n-gram length, OOV mark); `--json` prints one JSON
object per text instead (JSON Lines).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from lmserve.client.commands._bias_args import add_bias_arguments, bias_arguments
from lmserve.client.commands._common import (
    add_connection_arguments,
    fail,
    open_text,
    positive_int,
    read_batches,
    with_client,
)

if TYPE_CHECKING:
    from lmserve.client import LmServeClient, TextScore

HELP = "Score texts with a model of a running server (log-probabilities in nats)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("texts", nargs="*", metavar="TEXT", help="texts to score")
    parser.add_argument("--model", required=True, help="the model's name")
    parser.add_argument("--file", metavar="F", help="score each line of F instead ('-': stdin)")
    parser.add_argument("--tokens", action="store_true", help="also print per-token scores")
    parser.add_argument("--no-bos", action="store_true", help="do not start from <s>")
    parser.add_argument("--no-eos", action="store_true", help="do not score </s>")
    parser.add_argument(
        "--pretokenized",
        action="store_true",
        help="each text is the model's tokens separated by spaces (no tokenizer is run)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON lines: one per text")
    parser.add_argument(
        "--batch-size",
        type=positive_int,
        default=500,
        help="texts per Score request when reading a file (default 500)",
    )
    add_bias_arguments(parser)
    add_connection_arguments(parser)


def _to_json(text: str, result: TextScore, biased: bool = False) -> dict[str, Any]:
    data: dict[str, Any] = {
        "text": text,
        "log_prob": result.log_prob,
        "token_count": result.token_count,
        "oov_count": result.oov_count,
    }
    if biased:
        data["bias"] = result.bias
        data["biased_log_prob"] = result.biased_log_prob
        data["bias_phrases"] = list(result.bias_phrases)
    if result.tokens is not None:
        data["tokens"] = [
            {
                "token": t.token,
                "token_id": t.token_id,
                "log_prob": t.log_prob,
                "oov": t.oov,
                "ngram_length": t.ngram_length,
            }
            for t in result.tokens
        ]
    return data


def _to_lines(text: str, result: TextScore, biased: bool) -> str:
    bias = f"\t{result.biased_log_prob:.6f}" if biased else ""
    lines = [f"{result.log_prob:.6f}{bias}\t{result.token_count}\t{result.oov_count}\t{text}"]
    for t in result.tokens or ():
        n = "" if t.ngram_length is None else f"\t{t.ngram_length}-gram"
        lines.append(f"\t{t.token}\t{t.log_prob:.6f}{n}" + ("\tOOV" if t.oov else ""))
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if bool(args.texts) == bool(args.file):
        return fail("score", "give either TEXT arguments or --file (not both)")

    def body(client: LmServeClient) -> int:
        batches: Iterator[list[str]]
        stream = open_text(args.file) if args.file else None
        try:
            batches = read_batches(stream, args.batch_size) if stream else iter([args.texts])
            for batch in batches:
                inputs = [t.split() for t in batch] if args.pretokenized else batch
                results = client.score(
                    args.model,
                    inputs,
                    bos=not args.no_bos,
                    eos=not args.no_eos,
                    return_tokens=args.tokens,
                    **bias_arguments(args),
                )
                biased = args.bias is not None
                for text, result in zip(batch, results, strict=True):
                    out = (
                        json.dumps(_to_json(text, result, biased))
                        if args.json
                        else _to_lines(text, result, biased)
                    )
                    sys.stdout.write(out + "\n")
        finally:
            if stream is not None and stream is not sys.stdin:
                stream.close()
        return 0

    return with_client("score", args, body)
