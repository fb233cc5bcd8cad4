"""`train-rnn`'s configuration errors as one plain line each, in the command's own flags.

pydantic's own report ("1 validation error for RecurrentLMConfig ... For further information
visit https://errors.pydantic.dev/...") names model fields and a web page; a person at the
command line needs the flag to change and the value that was wrong.
"""

from __future__ import annotations

import argparse

from pydantic import ValidationError

DEFAULT_FFNN_ORDER = 5
# The transformer's flags are None when not given (other cells refuse them); these fill in.
DEFAULT_HEADS = 4
DEFAULT_MAX_POSITIONS = 256

# The smallest vocabulary a model takes (three specials and a word): the architecture's flags
# are checked with it before the corpus gives the real one.
MIN_VOCAB_SIZE = 4

# Config field -> the flag that sets it.
FLAGS = {
    "cell": "--cell",
    "embedding_size": "--embedding-size",
    "hidden_size": "--hidden-size",
    "num_layers": "--layers",
    "dropout": "--dropout",
    "tie_weights": "--tie-weights",
    "order": "--order",
    "vocab_size": "--vocab-size",
    "epochs": "--epochs",
    "batch_size": "--batch-size",
    "bptt": "--bptt",
    "optimizer": "--optimizer",
    "lr": "--lr",
    "weight_decay": "--weight-decay",
    "clip": "--clip",
    "lr_decay": "--lr-decay",
    "patience": "--patience",
    "seed": "--seed",
    "max_minutes": "--max-minutes",
    "threads": "--threads",
    "heads": "--heads",
    "max_positions": "--max-positions",
    "family": "--family",
    "warmup_steps": "--warmup-steps",
    "lr_schedule": "--lr-schedule",
    "precision": "--precision",
}
# Flags only the transformer reads, by their argparse names.
TRANSFORMER_ONLY = ("heads", "max_positions", "family")


def architecture_problem(args: argparse.Namespace) -> str | None:
    """The flag combinations the architecture cannot take, said as what to change; None when
    they fit. Checked before the corpus is read."""
    if args.cell == "transformer":
        return _transformer_problem(args)
    for name in TRANSFORMER_ONLY:
        if getattr(args, name, None) is not None:
            return f"{FLAGS[name]} is for --cell transformer only: drop it"
    if getattr(args, "precision", "fp32") != "fp32":
        return f"--precision {args.precision} is for --cell transformer only: drop it"
    width = args.hidden_size if args.embedding_size is None else args.embedding_size
    if args.tie_weights and width != args.hidden_size:
        return (
            f"--embedding-size {width} and --hidden-size {args.hidden_size} "
            "differ, but tied weights (the default) share one matrix between the embedding and "
            "the decoder: give equal sizes, or add --no-tie-weights"
        )
    if args.order is not None and args.cell != "ffnn":
        return f"--order is for --cell ffnn only (this is --cell {args.cell}): drop --order"
    if args.cell == "ffnn" and args.layers != 1:
        return f"--cell ffnn has one hidden layer: drop --layers {args.layers}"
    return None


def _transformer_problem(args: argparse.Namespace) -> str | None:
    if args.embedding_size is not None and args.embedding_size != args.hidden_size:
        return (
            f"--cell transformer has one width, --hidden-size {args.hidden_size}: "
            f"drop --embedding-size {args.embedding_size}"
        )
    if args.order is not None:
        return "--order is for --cell ffnn only (this is --cell transformer): drop --order"
    if getattr(args, "export", None) is not None:
        if args.tokenizer != "word":
            return (
                f"a transformer exports word models only, not --tokenizer {args.tokenizer}: "
                "drop --export"
            )
        if args.export_format != "onnx":
            return "a transformer exports to ONNX only: drop --export-format"
    heads = args.heads or DEFAULT_HEADS
    if heads > 0 and args.hidden_size > 0 and args.hidden_size % heads:
        return f"--hidden-size {args.hidden_size} is not a multiple of --heads {heads}"
    return None


def flag_messages(exc: ValidationError) -> list[str]:
    """One line per error: the flag, the value given, and what it must be."""
    lines = []
    for error in exc.errors():
        message = str(error["msg"]).removeprefix("Value error, ")
        message = message.replace("Input should be", "must be")
        if error["loc"]:
            field = str(error["loc"][0])
            flag = FLAGS.get(field, "--" + field.replace("_", "-"))
            lines.append(f"{flag} {error.get('input')}: {message}")
        else:
            lines.append(message)
    return lines
