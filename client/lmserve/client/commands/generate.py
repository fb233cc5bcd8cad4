"""`lmserve generate`: stream a continuation from a model of a running server, token by token.

Tokens are printed as they arrive (flushed one by one); with `--n` > 1 each line is prefixed with
its sample number and samples are printed when they finish. `--beam WIDTH` runs beam search
instead and prints the hypotheses best first (`SCORE<TAB>LOG_PROB<TAB>TEXT`, nats). `--json`
prints one object per finished sample (or hypothesis) instead.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from lmserve.client.commands._common import add_connection_arguments, add_json_argument, with_client
from lmserve.client.commands._generate_args import (
    add_generate_arguments,
    beam_options,
    prompt_of,
    sampling_options,
)

if TYPE_CHECKING:
    from lmserve.client import BeamHypothesis, GeneratedToken, GenerationFinished, LmServeClient

HELP = "Generate a continuation of a prompt, printing tokens as they arrive (or --beam search)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_generate_arguments(parser)
    parser.add_argument(
        "--verbose", action="store_true", help="print each sample's finish reason and usage"
    )
    add_json_argument(parser, "one object per finished sample (or beam hypothesis)")
    add_connection_arguments(parser, timeout=300.0)


def _token_json(token: GeneratedToken) -> dict[str, Any]:
    data: dict[str, Any] = {"index": token.index, "token_id": token.token_id, "text": token.text}
    data["log_prob"] = token.log_prob
    if token.top_logprobs:
        data["top_logprobs"] = [
            {"token_id": a.token_id, "text": a.text, "log_prob": a.log_prob}
            for a in token.top_logprobs
        ]
    return data


def _finished_json(
    event: GenerationFinished, tokens: list[GeneratedToken], args: argparse.Namespace
) -> dict[str, Any]:
    u = event.usage
    data: dict[str, Any] = {
        "sample_index": event.sample_index,
        "text": event.text,
        "finish_reason": event.reason,
        "log_prob": event.log_prob,
        "usage": {
            "prompt_tokens": u.prompt_tokens,
            "generated_tokens": u.generated_tokens,
            "time_to_first_token_seconds": u.time_to_first_token_seconds,
            "total_seconds": u.total_seconds,
        },
    }
    if args.logprobs or args.top_logprobs:
        data["tokens"] = [_token_json(t) for t in tokens]
    return data


def _stream(client: LmServeClient, args: argparse.Namespace) -> int:
    from lmserve.client import GeneratedToken

    out = sys.stdout
    pending: dict[int, list[GeneratedToken]] = {}
    events = client.generate(
        args.model, prompt_of(args), max_new_tokens=args.max_new_tokens, **sampling_options(args)
    )
    for event in events:
        if isinstance(event, GeneratedToken):
            if args.n == 1 and not args.json:  # one stream: print each piece as it arrives
                out.write(event.text)
                out.flush()
            else:
                pending.setdefault(event.sample_index, []).append(event)
            continue
        tokens = pending.pop(event.sample_index, [])
        if args.json:
            out.write(json.dumps(_finished_json(event, tokens, args)) + "\n")
        elif args.n == 1:
            out.write("\n")
        else:
            out.write(f"[{event.sample_index}] {event.text}\n")
        if args.verbose:
            u = event.usage
            print(
                f"[{event.sample_index}] finish={event.reason} tokens={u.generated_tokens} "
                f"log_prob={event.log_prob:.4f} ttft={u.time_to_first_token_seconds:.4f}s "
                f"total={u.total_seconds:.4f}s",
                file=sys.stderr,
            )
        out.flush()
    return 0


def _hypothesis_json(rank: int, h: BeamHypothesis) -> dict[str, Any]:
    return {
        "rank": rank,
        "text": h.text,
        "score": h.score,
        "log_prob": h.log_prob,
        "finish_reason": h.finish_reason,
        "token_ids": list(h.token_ids),
    }


def _beam(client: LmServeClient, args: argparse.Namespace) -> int:
    hypotheses = client.beam_search(args.model, prompt_of(args), **beam_options(args))
    for rank, h in enumerate(hypotheses):
        if args.json:
            sys.stdout.write(json.dumps(_hypothesis_json(rank, h)) + "\n")
        else:
            sys.stdout.write(f"{h.score:.6f}\t{h.log_prob:.6f}\t{h.text}\n")
    return 0


def run(args: argparse.Namespace) -> int:
    def body(client: LmServeClient) -> int:
        return _beam(client, args) if args.beam else _stream(client, args)

    return with_client("generate", args, body)
