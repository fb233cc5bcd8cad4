"""The options of `lmserve generate`: every GenerateRequest and BeamSearchRequest field.

Kept apart from the command so the command module holds only what it prints. Options left out
stay absent from the request, so the server's documented defaults apply.
"""

from __future__ import annotations

import argparse
from typing import Any

from lmserve.client.commands._common import positive_int

LENGTH_PENALTIES = ("none", "gnmt", "average")
# (flag, type, metavar, help) of each SamplingParams field, in proto order.
SAMPLING = (
    ("--temperature", float, "T", "divides the logits; 0 = greedy (default 1.0)"),
    ("--top-k", int, "K", "keep the K most probable tokens (default: no limit)"),
    ("--top-p", float, "P", "nucleus sampling: smallest set reaching probability P, (0, 1]"),
    ("--min-p", float, "P", "drop tokens below P x the most probable one's, [0, 1]"),
    ("--typical-p", float, "P", "locally typical sampling, (0, 1]"),
    ("--repetition-penalty", float, "R", "divide the logits of tokens seen (>= 1 discourages)"),
    ("--presence-penalty", float, "X", "subtracted from the logit of every token seen"),
    ("--frequency-penalty", float, "X", "subtracted once per earlier occurrence of a token"),
    ("--seed", int, "S", "seed of the request's random generator (default: random)"),
)


def token_ids(value: str) -> list[int]:
    """`1,2,3` -> [1, 2, 3]."""
    try:
        return [int(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated ids, got {value!r}") from None


def add_generate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="the model's name")
    prompt = parser.add_mutually_exclusive_group()
    prompt.add_argument("--prompt", default="", help="the prompt text (default: start of sentence)")
    prompt.add_argument("--prompt-ids", type=token_ids, metavar="IDS", help="the prompt as ids")
    parser.add_argument(
        "--max-new-tokens",
        "--max-tokens",
        type=positive_int,
        default=20,
        metavar="N",
        help="most tokens generated per sample (beam search: --max-length; default 20)",
    )
    sampling = parser.add_argument_group("sampling (Generate)")
    for flag, kind, metavar, text in SAMPLING:
        sampling.add_argument(flag, type=kind, metavar=metavar, help=text)
    sampling.add_argument(
        "--min-new-tokens", type=int, default=0, metavar="N", help="suppress </s> before N tokens"
    )
    sampling.add_argument(
        "--stop",
        action="append",
        default=[],
        metavar="TEXT",
        help="stop at this string, trimmed from the output (repeatable)",
    )
    sampling.add_argument(
        "--stop-token-ids",
        type=token_ids,
        default=[],
        metavar="IDS",
        help="stop at one of these ids (comma-separated)",
    )
    sampling.add_argument("--ignore-eos", action="store_true", help="keep going past </s>")
    sampling.add_argument("--n", type=positive_int, default=1, help="independent samples")
    sampling.add_argument(
        "--logprobs", action="store_true", help="each token's log-probability (nats; with --json)"
    )
    sampling.add_argument(
        "--top-logprobs",
        type=int,
        default=0,
        metavar="K",
        help="K most probable alternatives at each step (with --json)",
    )
    sampling.add_argument(
        "--stream-interval",
        type=positive_int,
        default=1,
        metavar="STEPS",
        help="steps per streamed message (default 1)",
    )
    parser.add_argument(
        "--no-repeat-ngram-size",
        type=int,
        metavar="N",
        help="never repeat an n-gram of this size (both modes)",
    )
    beam = parser.add_argument_group("beam search (--beam WIDTH instead of sampling)")
    beam.add_argument(
        "--beam",
        "--beam-width",
        dest="beam",
        type=positive_int,
        metavar="WIDTH",
        help="beam search of this width instead of sampling",
    )
    beam.add_argument(
        "--n-best",
        type=positive_int,
        metavar="N",
        help="hypotheses returned, best first (default: --n, at most WIDTH)",
    )
    beam.add_argument(
        "--length-penalty",
        choices=LENGTH_PENALTIES,
        default="none",
        help="length normalisation of beam scores (default none)",
    )
    beam.add_argument("--length-penalty-alpha", type=float, default=0.0, metavar="ALPHA")
    beam.add_argument(
        "--min-length", type=int, default=0, metavar="N", help="suppress </s> before N new tokens"
    )
    beam.add_argument(
        "--early-stopping", action="store_true", help="stop once N-best hypotheses finished"
    )


def prompt_of(args: argparse.Namespace) -> str | list[int]:
    ids: list[int] | None = args.prompt_ids
    return ids if ids is not None else str(args.prompt)


def sampling_options(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of `LmServeClient.generate` (besides model, prompt, max tokens)."""
    options: dict[str, Any] = {
        flag[2:].replace("-", "_"): getattr(args, flag[2:].replace("-", "_"))
        for flag, *_ in SAMPLING
    }
    return options | {
        "no_repeat_ngram_size": args.no_repeat_ngram_size,
        "min_new_tokens": args.min_new_tokens,
        "stop": args.stop,
        "stop_token_ids": args.stop_token_ids,
        "ignore_eos": args.ignore_eos,
        "n": args.n,
        "logprobs": args.logprobs,
        "top_logprobs": args.top_logprobs,
        "stream_interval": args.stream_interval,
    }


def beam_options(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of `LmServeClient.beam_search` (besides model and prompt)."""
    return {
        "beam_width": args.beam,
        "max_length": args.max_new_tokens,
        "num_return": min(args.n_best or args.n, args.beam),
        "length_penalty": args.length_penalty,
        "length_penalty_alpha": args.length_penalty_alpha,
        "min_length": args.min_length,
        "early_stopping": args.early_stopping,
        "no_repeat_ngram_size": args.no_repeat_ngram_size or 0,
        "stop_token_ids": args.stop_token_ids,
    }
