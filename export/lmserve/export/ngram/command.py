"""`lmserve train-ngram`: trains a back-off n-gram model and writes a servable model folder."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from lmserve.export.cli_types import existing_file, positive_float, regex
from lmserve.export.ngram.memory import DEFAULT_MEMORY, parse_memory

HELP = (
    "Train an n-gram language model (ARPA + model folder) from a text corpus, one sentence a line."
)

SMOOTHING = ("mle", "add-k", "interpolated", "kneser-ney", "modified-kneser-ney")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _memory_size(text: str) -> str:
    try:
        parse_memory(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("corpus", type=existing_file, help="training text, one sentence per line")
    parser.add_argument("model_dir", type=Path, help="model folder to write")
    parser.add_argument("--order", type=_positive_int, required=True, help="n-gram order")
    parser.add_argument(
        "--smoothing", choices=SMOOTHING, default="modified-kneser-ney", help="smoothing method"
    )
    parser.add_argument("--name", help="model name (default: MODEL_DIR's basename)")
    parser.add_argument(
        "--add-k",
        type=positive_float,
        default=1.0,
        help="pseudo-count for add-k (default 1: Laplace)",
    )
    parser.add_argument(
        "--heldout",
        type=existing_file,
        help="held-out text: tunes interpolation weights, valid perplexity",
    )
    parser.add_argument(
        "--test", type=existing_file, help="test text; its perplexity goes in the manifest"
    )
    parser.add_argument(
        "--min-count", type=_positive_int, default=1, help="words seen fewer times become <unk>"
    )
    parser.add_argument("--top-n", type=_positive_int, help="keep only the N most frequent words")
    parser.add_argument("--lowercase", action="store_true", help="lowercase before tokenizing")
    parser.add_argument(
        "--token-pattern",
        type=regex,
        help="words are this regex's matches (default: whitespace split)",
    )
    parser.add_argument(
        "--tokenizer",
        choices=("word", "char", "bpe"),
        default="word",
        help="count words, characters, or BPE pieces (words split as --token-pattern says first)",
    )
    parser.add_argument(
        "--bpe-vocab-size",
        type=_positive_int,
        default=8000,
        help="BPE vocabulary trained on CORPUS (specials included; default 8000)",
    )
    parser.add_argument(
        "--bpe-model",
        type=existing_file,
        help="an existing BPE tokenizer.json (e.g. a train-rnn model's) instead of training one",
    )
    parser.add_argument(
        "--discount-fallback",
        action="store_true",
        help="Kneser-Ney: an order whose counts give no valid discounts uses 0.5, 1, 1.5 "
        "(as lmplz --discount_fallback; character models need it)",
    )
    parser.add_argument(
        "--memory",
        type=_memory_size,
        default=DEFAULT_MEMORY,
        help="working memory for counting, as lmplz -S: a size (2G, 800M) or a share of RAM "
        # argparse %-formats help: "80%" is written "80%%"
        f"(default {DEFAULT_MEMORY.replace('%', '%%')}); a corpus that does not fit is counted "
        "in sorted runs on disk, with the same result",
    )
    parser.add_argument(
        "--temp-dir",
        type=Path,
        help="where counting spills sorted runs when the corpus exceeds --memory "
        "(default: the system's temporary folder)",
    )
    only = parser.add_mutually_exclusive_group()
    only.add_argument(
        "--arpa-only", action="store_true", help="write only MODEL_DIR/model.arpa(.gz)"
    )
    only.add_argument(
        "--binary-only",
        action="store_true",
        help="write only model.lmbin and model.yaml, no ARPA copy (the ARPA the binary is built "
        "from goes to a temporary file); without the copy a binary of an older format cannot "
        "be rebuilt from the folder: retrain it",
    )
    parser.add_argument(
        "--no-gzip", dest="gzip", action="store_false", help="write model.arpa, not .arpa.gz"
    )


def _command_line(args: argparse.Namespace) -> list[str]:
    """The options this run used, spelled as a command line (recorded in the manifest)."""
    words = ["--order", str(args.order), "--smoothing", args.smoothing]
    if args.tokenizer != "word":
        words += ["--tokenizer", args.tokenizer]
    if args.tokenizer == "bpe" and args.bpe_model is None:
        words += ["--bpe-vocab-size", str(args.bpe_vocab_size)]
    for option in ("name", "heldout", "test", "top_n", "token_pattern", "bpe_model"):
        value = getattr(args, option)
        if value is not None:
            words += ["--" + option.replace("_", "-"), str(value)]
    if args.smoothing == "add-k":
        words += ["--add-k", str(args.add_k)]
    if args.min_count != 1:
        words += ["--min-count", str(args.min_count)]
    if args.memory != DEFAULT_MEMORY:
        words += ["--memory", args.memory]
    words += [flag for flag, on in (("--lowercase", args.lowercase),
              ("--discount-fallback", args.discount_fallback),
              ("--arpa-only", args.arpa_only), ("--binary-only", args.binary_only),
              ("--no-gzip", not args.gzip)) if on]  # fmt: skip
    words += [str(args.corpus), str(args.model_dir)]
    return [shlex.quote(w) for w in words]


def run(args: argparse.Namespace) -> int:
    from lmserve.export.ngram.train import TrainConfig, train

    config = TrainConfig(
        corpus=args.corpus,
        model_dir=args.model_dir,
        order=args.order,
        smoothing=args.smoothing,
        name=args.name,
        add_k=args.add_k,
        heldout=args.heldout,
        test=args.test,
        min_count=args.min_count,
        top_n=args.top_n,
        lowercase=args.lowercase,
        token_pattern=args.token_pattern,
        arpa_only=args.arpa_only,
        binary_only=args.binary_only,
        gzip=args.gzip,
        tokenizer=args.tokenizer,
        bpe_vocab_size=args.bpe_vocab_size,
        bpe_model=args.bpe_model,
        discount_fallback=args.discount_fallback,
        memory=args.memory,
        temp_dir=args.temp_dir,
        progress=True,
    )
    try:
        result = train(config, command_line=_command_line(args))
    except (ValueError, OSError) as exc:
        print(f"lmserve train-ngram: error: {exc}", file=sys.stderr)
        return 2
    summary = {
        "arpa": None if result.arpa_path is None else str(result.arpa_path),
        "vocab_size": result.vocab_size,
        "ngrams": result.ngram_counts,
        "timings": {k: round(v, 3) for k, v in result.timings.items()},
        "peak_rss_mb": result.peak_rss_mb,
        "metrics": result.metrics,
    }
    print(json.dumps(summary, indent=2))
    return 0
