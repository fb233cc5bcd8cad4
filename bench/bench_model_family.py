"""The model family side by side: kind, tokenizer, KJV test perplexity, size and speed.

    python bench/bench_model_family.py [--models models] [--runs 3] [--markdown] [--quick]

Every model folder of the repository (default: the shipped `models/`) is loaded by the engine
as the server loads it (`ModelRepository.load`, the server's default runtime options), and per
model:
- test perplexity: the KJV test sentences (`export/.../corpora/kjv/test.txt`) through the
  model's own tokenizer and `Scorer.score_texts`, natural log, one `</s>` a line counted, per
  word (what the n-gram and word models count as tokens);
- scoring speed: scored tokens (with `</s>`) per second over the whole test set in requests of
  64 sentences, as the server would run them (no gRPC);
- step speed: single-stream generation steps per second, one `Stepper.step` per token (greedy,
  no sampling, no gRPC) for `--steps` steps after reading `<s>`;
- folder size: the bytes of the model's own files (an interpolation's components not counted).
Speeds are the median of `--runs` runs after one warm-up. Prints one JSON record per model
(`median` is the scoring speed), or with `--markdown` the table for `models/README.md`.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
from common import DEFAULT_MODELS, QUICK_ENV, REPO_ROOT, batches, emit, log, quick, read_lines

TEST_LINES = REPO_ROOT / "export" / "lmserve" / "export" / "corpora" / "kjv" / "test.txt"
REQUEST_TEXTS = 64


def folder_bytes(folder: Path) -> int:
    """Bytes of every regular file in the folder (the manifest included)."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def describe_tokenizer(manifest: Any) -> str:
    spec = manifest.tokenizer
    return f"{spec.kind.value}{', lowercased' if spec.lowercase else ''}"


def perplexity_and_speed(scorer: Any, lines: list[str], runs: int) -> tuple[float, list[float]]:
    """Per-word test perplexity (natural log, `</s>` counted) and scored tokens/s per run."""
    from lmserve.server.decoding.scoring import ScoreOptions

    options = ScoreOptions()
    requests = batches(lines, REQUEST_TEXTS)

    def score_all() -> tuple[float, int, int]:
        log_prob, tokens, words = 0.0, 0, 0
        for texts in requests:
            scored = scorer.score_texts(texts, options)
            log_prob += float(np.sum(scored.log_probs))
            tokens += int(scored.total_tokens)
            words += int(np.sum(scored.word_counts))
        return log_prob, tokens, words

    log_prob, tokens, words = score_all()  # the warm-up gives the perplexity
    speeds = []
    for _ in range(runs):
        start = time.perf_counter()
        score_all()
        speeds.append(tokens / (time.perf_counter() - start))
    return math.exp(-log_prob / words), speeds


def step_speed(backend: Any, steps: int, runs: int) -> list[float]:
    """Single-stream greedy steps per second (one `Stepper.step` call per token)."""
    from lmserve.server.families.catalog import make_stepper

    stepper = make_stepper(backend)
    eos = stepper.vocab.eos_id

    def generate() -> None:
        log_probs, state = stepper.prefill([[]])
        for _ in range(steps):
            row = np.array(log_probs[0], dtype=np.float64)
            row[eos] = -np.inf
            log_probs, state = stepper.step(np.array([int(np.argmax(row))]), state)

    generate()  # warm-up
    speeds = []
    for _ in range(runs):
        start = time.perf_counter()
        generate()
        speeds.append(steps / (time.perf_counter() - start))
    return speeds


def measure(entry: Any, lines: list[str], runs: int, steps: int) -> dict[str, Any]:
    manifest = entry.manifest
    ppl, score_speeds = perplexity_and_speed(entry.scorer, lines, runs)
    step_speeds = step_speed(entry.backend, steps, runs)
    size = folder_bytes(entry.folder)
    return {
        "name": f"model_family_{entry.name}",
        "unit": "tokens/s",
        "median": statistics.median(score_speeds),
        "runs": [float(f"{s:.6g}") for s in score_speeds],
        "model": entry.name,
        "kind": manifest.kind,
        "format": manifest.format,
        "tokenizer": describe_tokenizer(manifest),
        "test_perplexity": round(ppl, 3),
        "size_bytes": size,
        "size_mb": round(size / 1e6, 1),
        "score_tokens_per_s": round(statistics.median(score_speeds)),
        "step_per_s": round(statistics.median(step_speeds), 1),
        "step_runs": [float(f"{s:.6g}") for s in step_speeds],
        "test_sentences": len(lines),
        "cpu_count": os.cpu_count(),
    }


def markdown(records: list[dict[str, Any]]) -> str:
    head = (
        "| model | kind | format | tokenizer | KJV test ppl | size (MB) | scoring tokens/s "
        "| steps/s (1 stream) |\n|---|---|---|---|---:|---:|---:|---:|"
    )
    rows = [
        f"| {r['model']} | {r['kind']} | {r['format']} | {r['tokenizer']} "
        f"| {r['test_perplexity']:.1f} | {r['size_mb']:.1f} | {r['score_tokens_per_s']:,} "
        f"| {r['step_per_s']:,.0f} |"
        for r in records
    ]
    return "\n".join([head, *rows])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", type=Path, default=DEFAULT_MODELS, help="model repository")
    parser.add_argument("--runs", type=int, default=None, help="timed runs (default 3; 1 quick)")
    parser.add_argument("--steps", type=int, default=None, help="generation steps per run")
    parser.add_argument("--markdown", action="store_true", help="print the README table only")
    parser.add_argument("--quick", action="store_true", help="one run, fewer steps")
    args = parser.parse_args()
    if args.quick:
        os.environ[QUICK_ENV] = "1"
    runs = args.runs or (1 if quick() else 3)
    steps = args.steps or (50 if quick() else 200)

    from lmserve.server.registry.repository import ModelRepository, ModelState

    lines = read_lines(TEST_LINES)
    log(f"loading {args.models}")
    repository = ModelRepository.load(args.models)
    records = []
    for entry in repository.entries():
        if entry.state is not ModelState.READY:
            log(f"  {entry.name}: not loaded ({entry.load_error})")
            continue
        log(f"measuring {entry.name}")
        rec = measure(entry, lines, runs, steps)
        records.append(rec)
        if not args.markdown:
            emit(rec)
    if args.markdown:
        print(markdown(records))


if __name__ == "__main__":
    main()
