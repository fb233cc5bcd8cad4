"""`lmserve interpolate`: mixes served models, tuning the weights on held-out text by EM.

    lmserve interpolate --model-repository models --components kjv-lstm kjv-5gram \\
        --heldout valid.txt --test test.txt --name kjv-lstm-5gram models/kjv-lstm-5gram

The weights maximise the held-out likelihood of P(w|h) = sum_i w_i P_i(w|h). With the
components fixed, this is a mixture whose only parameters are the weights, so EM is exact and
monotone: each round sets w_i to the mean over held-out tokens of the posterior
w_i P_i / sum_j w_j P_j (Jelinek & Mercer, 1980). Perplexities use the n-gram convention:
natural logs, every word plus one `</s>` per line counted.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path

HELP = "Interpolate models of a repository; weights tuned by EM on held-out text."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out_dir", type=Path, help="model folder to write")
    parser.add_argument(
        "--model-repository", type=Path, required=True, help="folder holding the components"
    )
    parser.add_argument(
        "--components", nargs="+", required=True, help="names of the models to mix (2 or more)"
    )
    parser.add_argument("--heldout", type=Path, required=True, help="tunes the weights")
    parser.add_argument("--test", type=Path, help="test text; its perplexity goes in the manifest")
    parser.add_argument("--name", help="model name (default: OUT_DIR's basename)")
    parser.add_argument("--max-iterations", type=int, default=100, help="EM rounds at most")
    parser.add_argument("--batch-lines", type=int, default=128, help="lines per forward pass")


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from lmserve.export.interpolation import (
        component_log_probs,
        em_weights,
        load_components,
        mixture_perplexity,
        write_interpolated_folder,
    )
    from lmserve.server.errors import LmServeError

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    name = args.name or args.out_dir.name
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        log(f"error: model name {name!r}: letters, digits, '.', '_' and '-' only (no '+')")
        return 2
    if len(args.components) < 2:
        log("error: --components needs at least two models")
        return 2
    try:
        components = load_components(args.model_repository, args.components)
    except LmServeError as exc:
        log(f"error: {exc}")
        return 1
    heldout = args.heldout.read_text(encoding="utf-8").splitlines()
    log(f"scoring {len(heldout)} held-out lines with {', '.join(args.components)}")
    valid = component_log_probs(components, heldout, args.batch_lines)
    weights, rounds = em_weights(valid, args.max_iterations)
    log(f"EM: {rounds} rounds, weights {np.round(weights, 4).tolist()}")
    metrics = {"valid_perplexity": mixture_perplexity(valid, weights)}
    for component, column in zip(args.components, valid, strict=True):
        metrics[f"valid_perplexity_{component}"] = math.exp(-float(column.mean()))
    if args.test is not None:
        test_lines = args.test.read_text(encoding="utf-8").splitlines()
        log(f"scoring {len(test_lines)} test lines")
        test = component_log_probs(components, test_lines, args.batch_lines)
        metrics["test_perplexity"] = mixture_perplexity(test, weights)
    import shlex

    command = "lmserve " + shlex.join(getattr(args, "argv", None) or sys.argv[1:])
    write_interpolated_folder(
        args.out_dir, name, components, weights, metrics, corpus=str(args.heldout), command=command
    )
    for key, value in metrics.items():
        log(f"{key}: {value:.3f}")
    log(f"wrote {args.out_dir}")
    return 0
