"""Sampling cost per step: `sample_next` over [B, V] log-probs for each filter, next to a full
argsort of the same rows (what a sort-based top-p pays) measured in the same run.

    python bench/bench_sampling.py [--quick] [--vocab 12352]

Rows are log-softmax of N(0, 2.5^2) logits in float32 (the model's precision): a flat
distribution whose top-p 0.9 nucleus holds ~1,500 of 12,352 tokens, a hard case for any cut to
candidates. The allocator keeps freed memory as `lmserve serve` has it (`allocator.py`).
Prints JSON records (ms per step, median of runs) on stdout.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
from common import QUICK_ENV, emit, quick, record

from lmserve.server.allocator import keep_freed_memory
from lmserve.server.decoding.params import SamplingParams
from lmserve.server.decoding.sampling import SequenceSampler, request_generators, sample_next

BATCHES = (1, 8, 32, 64)
FILTERS = {
    "plain": SamplingParams(),
    "greedy": SamplingParams(temperature=0.0),
    "temperature0.7": SamplingParams(temperature=0.7),
    "top_k50": SamplingParams(top_k=50),
    "top_p0.9": SamplingParams(top_p=0.9),
    "min_p0.05": SamplingParams(min_p=0.05),
    "typical_p0.9": SamplingParams(typical_p=0.9),
    "repetition1.2": SamplingParams(repetition_penalty=1.2),
}


def _rows(batch: int, vocab: int) -> np.ndarray:
    x = np.random.default_rng(batch).normal(size=(batch, vocab)) * 2.5
    return (x - np.log(np.exp(x).sum(axis=1, keepdims=True))).astype(np.float32)


def _ms_per_step(fn: object, steps: int, runs: int) -> list[float]:
    assert callable(fn)
    fn()  # warm up
    out = []
    for _ in range(runs):
        start = time.perf_counter()
        for _ in range(steps):
            fn()
        out.append(1000 * (time.perf_counter() - start) / steps)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--vocab", type=int, default=12_352)
    args = parser.parse_args()
    if args.quick:
        os.environ[QUICK_ENV] = "1"
    runs = 3 if quick() else 5
    keep_freed_memory()
    for batch in BATCHES:
        lp = _rows(batch, args.vocab)
        steps = max(5, 200 // batch)
        argsort = _ms_per_step(lambda lp=lp: np.argsort(-lp, axis=1), steps, runs)
        emit(record(f"sampling_full_argsort_batch{batch}_ms", "ms", argsort, vocab=args.vocab))
        for name, params in FILTERS.items():
            rows = [
                SequenceSampler(params, g, list(range(3, 23))) for g in request_generators(7, batch)
            ]

            def step(lp: np.ndarray = lp, rows: list[SequenceSampler] = rows) -> None:
                sample_next(lp, rows, eos_id=2, bos_id=1)

            emit(
                record(
                    f"sampling_{name}_batch{batch}_ms",
                    "ms",
                    _ms_per_step(step, steps, runs),
                    vocab=args.vocab,
                )
            )


if __name__ == "__main__":
    main()
