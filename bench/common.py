"""Helpers every benchmark script shares: timing, the median of several runs, JSON records.

A benchmark script prints one JSON record per line on stdout (JSON Lines), each

    {"name": "server_score_1client_words_per_s", "unit": "words/s", "median": 812345.6,
     "runs": [...], ...extra fields}

and anything meant for people on stderr. `bench/run_all.py` collects the records.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"
KJV = SHARED_DATA / "kjv"
KJV_TEST = KJV / "test.txt"
KJV_5GRAM_ARPA = KJV / "kenlm" / "kjv.5gram.arpa.gz"
# Built artefacts (model folders) live in an ignored folder next to the results.
CACHE_DIR = BENCH_DIR / "results" / "cache"
# The shipped default model repository (`make models` builds it).
DEFAULT_MODELS = REPO_ROOT / "models"
DEFAULT_LSTM = DEFAULT_MODELS / "kjv-lstm"
DEFAULT_NGRAM = DEFAULT_MODELS / "kjv-5gram"

# `run_all.py --quick` sets this; scripts then take fewer and shorter runs.
QUICK_ENV = "LMSERVE_BENCH_QUICK"


def quick() -> bool:
    return os.environ.get(QUICK_ENV, "") not in ("", "0")


def log(message: str) -> None:
    """Progress for people, on stderr so stdout stays machine-readable."""
    print(message, file=sys.stderr, flush=True)


def default_model(folder: Path) -> Path:
    """A folder of the shipped default models, or a clear exit when it was not built."""
    if not (folder / "model.yaml").exists():
        raise SystemExit(f"{folder} is missing: run `make models` first")
    return folder


def timed(fn: Callable[[], Any]) -> float:
    """Wall-clock seconds of one call."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def repeat(fn: Callable[[], Any], runs: int, warmup: int = 1) -> list[float]:
    """Seconds of `runs` calls after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    return [timed(fn) for _ in range(runs)]


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation between order statistics."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def record(name: str, unit: str, runs: Sequence[float], **extra: Any) -> dict[str, Any]:
    """A result record: the median of `runs` (already in `unit`) and the runs themselves."""
    return {
        "name": name,
        "unit": unit,
        "median": statistics.median(runs),
        "runs": [float(f"{r:.6g}") for r in runs],
        **extra,
    }


def rate_record(
    name: str, unit: str, amount: float, seconds: Sequence[float], **extra: Any
) -> dict[str, Any]:
    """A throughput record: `amount` per second for each run's duration."""
    return record(name, unit, [amount / s for s in seconds], **extra)


def emit(rec: dict[str, Any]) -> None:
    """Prints one record as a JSON line on stdout (and a readable summary on stderr)."""
    print(json.dumps(rec), flush=True)
    log(f"  {rec['name']}: {rec['median']:.6g} {rec['unit']}")


def read_lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def count_words(lines: Sequence[str], eos: bool = True) -> int:
    """Scored tokens as KenLM counts them: whitespace words plus one `</s>` per line."""
    return sum(len(line.split()) for line in lines) + (len(lines) if eos else 0)


T = TypeVar("T")


def batches(items: Sequence[T], size: int) -> list[list[T]]:
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


def linked_repository(name: str, *folders: Path) -> Path:
    """A model repository of just these folders (links, under the cache as `name`), so a
    benchmark's server loads nothing else; links left by an earlier run to others go."""
    repo = CACHE_DIR / name
    repo.mkdir(parents=True, exist_ok=True)
    wanted = {folder.resolve() for folder in folders}
    for stale in repo.iterdir():
        if stale.is_symlink() and stale.resolve() not in wanted:
            stale.unlink()
    for folder in folders:
        link = repo / folder.name
        if not link.exists():
            link.symlink_to(folder.resolve())
    return repo
