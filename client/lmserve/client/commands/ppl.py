"""`lmserve ppl --model M FILE`: perplexity of a text file, one line per sentence, streamed to the
server in batches over CorpusPerplexity. Prints perplexity with and without OOVs, the counts and
the convention (natural logs, `<s>` context only, one `</s>` per line counted, as KenLM does);
for a character or BPE model also the perplexity per word (words plus one `</s>` a line).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

from lmserve.client.commands._common import (
    add_connection_arguments,
    open_text,
    positive_int,
    read_batches,
    with_client,
)

if TYPE_CHECKING:
    from lmserve.client import LmServeClient, PerplexityStats
    from lmserve.client._requests import Inputs

HELP = "Perplexity of a text file (one sentence per line) under a model of a running server."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE", help="one sentence per line ('-': stdin)")
    parser.add_argument("--model", required=True, help="the model's name")
    parser.add_argument("--no-bos", action="store_true", help="do not start lines from <s>")
    parser.add_argument("--no-eos", action="store_true", help="do not score </s> per line")
    parser.add_argument(
        "--pretokenized",
        action="store_true",
        help="each line is the model's tokens separated by spaces (no tokenizer is run)",
    )
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON line")
    parser.add_argument(
        "--batch-size",
        type=positive_int,
        default=1000,
        help="lines per streamed message (default 1000)",
    )
    # The deadline covers the whole stream, so it is longer than for one request.
    add_connection_arguments(parser, timeout=600.0)


def pretokenized(batches: Iterator[list[str]], split: bool) -> Iterator[Inputs]:
    """The batches as they are, or each line split into its tokens."""
    for batch in batches:
        yield [line.split() for line in batch] if split else batch


def convention(bos: bool, eos: bool) -> str:
    parts = ["natural-log probabilities"]
    parts.append("<s> as context only" if bos else "no <s> context")
    parts.append("one </s> per line scored and counted" if eos else "no </s>")
    parts.append("OOVs scored as <unk>")
    return ", ".join(parts)


def _report(stats: PerplexityStats, conv: str) -> str:
    lines = [
        f"perplexity (OOVs included): {stats.perplexity:.4f}",
        f"perplexity (OOVs excluded): {stats.perplexity_excluding_oov:.4f}",
        f"log-probability (nats):     {stats.log_prob:.4f}",
        f"lines: {stats.text_count}  tokens: {stats.token_count}  OOVs: {stats.oov_count}",
    ]
    if stats.word_count and stats.word_count != stats.token_count:
        # Character/BPE tokens: the figures above are per token, this one compares across models.
        lines[1:1] = [f"perplexity per word:        {stats.perplexity_per_word:.4f}"]
        lines[-1] += f"  words: {stats.word_count}"
    return "\n".join([*lines, f"convention: {conv}"])


def run(args: argparse.Namespace) -> int:
    bos, eos = not args.no_bos, not args.no_eos

    def body(client: LmServeClient) -> int:
        stream = open_text(args.file)
        try:
            stats = client.corpus_perplexity(
                args.model,
                pretokenized(read_batches(stream, args.batch_size), args.pretokenized),
                bos=bos,
                eos=eos,
                timeout=args.timeout,
            )
        finally:
            if stream is not sys.stdin:
                stream.close()
        if args.json:
            from dataclasses import asdict

            print(
                json.dumps(
                    {"model": args.model, **asdict(stats), "convention": convention(bos, eos)}
                )
            )
        else:
            print(_report(stats, convention(bos, eos)))
        return 0

    return with_client("ppl", args, body)
