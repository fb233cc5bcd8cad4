"""`lmserve generate`: stream a continuation from a model of a running server, token by token.

Tokens are printed as they arrive (flushed one by one); with `--n` > 1 each line is prefixed with
its sample number and samples are printed when they finish. `--beam WIDTH` runs beam search
instead and prints the hypotheses best first (`SCORE<TAB>LOG_PROB<TAB>TEXT`, nats).
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from lmserve.client.commands._common import add_connection_arguments, positive_int, with_client

if TYPE_CHECKING:
    from lmserve.client import LmServeClient

HELP = "Generate a continuation of a prompt, printing tokens as they arrive (or --beam search)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="the model's name")
    parser.add_argument("--prompt", default="", help="the prompt text (default: start of sentence)")
    parser.add_argument("--max-new-tokens", type=positive_int, default=20, metavar="N")
    parser.add_argument("--temperature", type=float, help="0 = greedy (default 1.0)")
    parser.add_argument("--top-k", type=int, metavar="K")
    parser.add_argument("--top-p", type=float, metavar="P")
    parser.add_argument("--seed", type=int, help="seed of the request's random generator")
    parser.add_argument("--stop", action="append", default=[], help="a stop string (repeatable)")
    parser.add_argument("--n", type=positive_int, default=1, help="independent samples")
    parser.add_argument(
        "--beam", type=positive_int, metavar="WIDTH", help="beam search of this width instead"
    )
    parser.add_argument(
        "--verbose", action="store_true", help="print each sample's finish reason and usage"
    )
    add_connection_arguments(parser, timeout=300.0)


def _stream(client: LmServeClient, args: argparse.Namespace) -> int:
    from lmserve.client import GeneratedToken

    options: dict[str, Any] = {
        "temperature": args.temperature,
        "top_k": args.top_k,
        "top_p": args.top_p,
        "seed": args.seed,
        "stop": args.stop,
        "n": args.n,
    }
    out = sys.stdout
    pending: dict[int, list[str]] = {}
    for event in client.generate(
        args.model, args.prompt, max_new_tokens=args.max_new_tokens, **options
    ):
        if isinstance(event, GeneratedToken):
            if args.n == 1:  # one stream: print each piece the moment it arrives
                out.write(event.text)
                out.flush()
            else:
                pending.setdefault(event.sample_index, []).append(event.text)
            continue
        if args.n == 1:
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


def _beam(client: LmServeClient, args: argparse.Namespace) -> int:
    hypotheses = client.beam_search(
        args.model,
        args.prompt,
        beam_width=args.beam,
        max_length=args.max_new_tokens,
        num_return=min(args.n, args.beam),
    )
    for h in hypotheses:
        sys.stdout.write(f"{h.score:.6f}\t{h.log_prob:.6f}\t{h.text}\n")
    return 0


def run(args: argparse.Namespace) -> int:
    def body(client: LmServeClient) -> int:
        return _beam(client, args) if args.beam else _stream(client, args)

    return with_client("generate", args, body)
