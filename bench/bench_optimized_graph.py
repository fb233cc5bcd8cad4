"""ONNX Runtime's transformer fusions at import (issue 38, item 2): the same checkpoint in
optimum's layout written twice, as exported (`import-hf --optimum-layout --no-optimize`) and
fused (`--optimum-layout`, the optimizer's graph), timed alternately in one run.

    python bench/bench_optimized_graph.py [--layers 6 --width 512 --heads 8] [--runs 5]

The model: the GPT-2 of bench_transformer.py's recipe (byte-level BPE of 8,000 tokens trained on
KJV train, seeded weights) at the given size, 512 positions. Figures, each a median over
`--runs` alternated runs (2 threads, the server's session options):
- score: `Scorer.score_texts` (what Score computes) over the first 512 KJV test lines in
  batches of 32, tokens/s;
- step: one cached step of 16 rows (`session.run` on the folder's graph) with 32 and with 480
  positions in the cache, ms.
Prints one JSON record per figure and graph; the fused graph's fusions go in its records.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
from bench_transformer import gpt2_checkpoint
from common import CACHE_DIR, KJV_TEST, emit, log

BATCH = 32
LINES = 512
STEP_ROWS = 16


def _folders(layers: int, width: int, heads: int) -> dict[str, Path]:
    from lmserve.export.hf.importer import export_checkpoint

    tag = f"{layers}x{width}"
    checkpoint = CACHE_DIR / f"bench-gpt2-{tag}-checkpoint"
    if not (checkpoint / "config.json").is_file():
        log(f"building the GPT-2 checkpoint {tag}")
        gpt2_checkpoint(checkpoint, layers=layers, width=width, heads=heads, positions=512)
    out = {
        "plain": CACHE_DIR / f"bench-gpt2-{tag}-plain",
        "fused": CACHE_DIR / f"bench-gpt2-{tag}-fused",
    }
    for kind, folder in out.items():
        if not (folder / "model.yaml").is_file():
            log(f"importing {folder.name}")
            export_checkpoint(
                checkpoint, folder, overwrite=True, shared_cache=False, optimize=kind == "fused"
            )
    return out


def _score(scorer: Any, lines: list[str]) -> float:
    from lmserve.server.decoding.scoring import ScoreOptions

    began, tokens = time.perf_counter(), 0
    for start in range(0, len(lines), BATCH):
        scored = scorer.score_texts(lines[start : start + BATCH], ScoreOptions(), details=True)
        tokens += sum(len(d.log_probs) for d in scored.details)
    return tokens / (time.perf_counter() - began)


def _step_ms(backend: Any, context: int, repeats: int = 20) -> float:
    from lmserve.server.backends.transformer import past_names

    cache = backend.cache
    rng = np.random.default_rng(0)
    past = [
        rng.standard_normal((STEP_ROWS, cache.kv_heads, context, cache.head_dim)).astype(np.float32)
        for _ in range(2 * cache.layers)
    ]
    feed: dict[str, Any] = {
        "input_ids": np.full((STEP_ROWS, 1), 5, np.int64),
        "attention_mask": np.ones((STEP_ROWS, context + 1), np.int64),
        "position_ids": np.full((STEP_ROWS, 1), context, np.int64),
    }
    feed |= dict(zip(past_names(cache.layers), past, strict=True))
    backend.session.run(None, feed)  # warm
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        backend.session.run(None, feed)
        times.append(time.perf_counter() - began)
    return 1000 * statistics.median(times)


def main() -> None:
    from lmserve.server.manifest import read_manifest
    from lmserve.server.registry.repository import ModelState, load_entry

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    folders = _folders(args.layers, args.width, args.heads)
    scorers = {}
    for kind, folder in folders.items():
        entry = load_entry(folder)
        if entry.state is not ModelState.READY or entry.scorer is None:
            raise SystemExit(f"{folder}: {entry.load_error}")
        scorers[kind] = entry.scorer
    with KJV_TEST.open(encoding="utf-8") as f:
        lines = [line.strip() for _, line in zip(range(LINES), f, strict=False) if line.strip()]
    figures: dict[tuple[str, str], list[float]] = {}
    for run in range(args.runs):
        order = ("plain", "fused") if run % 2 == 0 else ("fused", "plain")
        for kind in order:
            scorer = scorers[kind]
            figures.setdefault((kind, "score"), []).append(_score(scorer, lines))
            for context in (32, 480):
                ms = _step_ms(scorer.backend, context)
                figures.setdefault((kind, f"step_{context}"), []).append(ms)
    size = f"{args.layers}x{args.width}, {args.heads} heads"
    for (kind, what), values in figures.items():
        optimization = read_manifest(folders[kind]).optimization
        emit(
            {
                "name": f"optimized_graph.{kind}.{what}",
                "median": statistics.median(values),
                "values": values,
                "unit": "tokens/s" if what == "score" else "ms",
                "model": f"GPT-2 {size}, optimum layout",
                "fused_ops": optimization.fused_ops if optimization else {},
            }
        )


if __name__ == "__main__":
    main()
