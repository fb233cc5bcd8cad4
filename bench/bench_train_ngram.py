"""Benchmark: train the default KJV 5-gram (modified Kneser-Ney) and print per-phase timings.

    .venv/bin/python bench/bench_train_ngram.py [--runs 3] [--order 5] [--smoothing ...]

Prints one JSON object: the median and every run's seconds per phase (read, count, smooth,
write_arpa, build = engine load of the ARPA, write_folder, evaluate), plus the perplexities.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from lmserve.export.corpora import KJV_TOKEN_PATTERN, kjv_split
from lmserve.export.ngram.train import TrainConfig, train


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--order", type=int, default=5)
    parser.add_argument("--smoothing", default="modified-kneser-ney")
    args = parser.parse_args(argv)
    runs: list[dict[str, float]] = []
    metrics: dict[str, float] = {}
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp:
            config = TrainConfig(
                corpus=kjv_split("train"),
                model_dir=Path(tmp) / "kjv",
                order=args.order,
                smoothing=args.smoothing,
                heldout=kjv_split("valid"),
                test=kjv_split("test"),
                lowercase=True,
                token_pattern=KJV_TOKEN_PATTERN,
            )
            result = train(config)
        timings = dict(result.timings)
        timings["total_seconds"] = sum(timings.values())
        runs.append(timings)
        metrics = result.metrics
    report = {
        "benchmark": "train_ngram",
        "corpus": "kjv train (710,867 words)",
        "order": args.order,
        "smoothing": args.smoothing,
        "runs": args.runs,
        "median_seconds": {k: round(statistics.median(r[k] for r in runs), 3) for k in runs[0]},
        "all_runs": [{k: round(v, 3) for k, v in r.items()} for r in runs],
        "metrics": metrics,
    }
    json.dump(report, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
