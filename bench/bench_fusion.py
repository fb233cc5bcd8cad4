"""Shallow fusion through `Fuse` beside the same beam search with the model in-process.

    python bench/bench_fusion.py [--decoders 8] [--beam 8] [--candidates 4] [--frames 40]
        [--runs 3] [--models kjv-5gram,kjv-lstm]

`--decoders` beam searches run at once, each over seeded synthetic frames: every frame offers
`--candidates` tokens with random scores, each step extends every beam hypothesis by every
candidate (beam x candidates children), keeps the best `--beam` by frame score + LM score and
drops the rest. Measured per model, in the same run:
- `fuse`: the decoders as asyncio tasks on one client, each step one Fuse message (extend the
  children, drop the last step's) and its answer; the server batches every decoder's step.
- `in_process`: each decoder in a thread of this process, stepping its own beam through the
  model's stepper (merge the beam's states, fan out, one step, split): what a decoder that
  loads the model itself does, with no wire and no batching across decoders.
Figures: per-step latency p50/p99 (ms, over every decoder's steps), and tokens of LM work per
second (extensions stepped / wall time), medians of `--runs` runs. One JSON record per line.
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from common import DEFAULT_MODELS, emit, linked_repository, log, percentile, quick, record
from server_process import ServerProcess

from lmserve.client import AsyncLmServeClient
from lmserve.server.families.catalog import make_stepper
from lmserve.server.registry.repository import LoadOptions, load_entry

Frame = list[tuple[int, float]]


def frames_for(seed: int, vocab: int, count: int, candidates: int) -> list[Frame]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        ids = rng.choice(np.arange(3, vocab), size=candidates, replace=False)
        scores = np.log(rng.dirichlet(np.ones(candidates)))
        out.append([(int(i), float(s)) for i, s in zip(ids, scores, strict=True)])
    return out


def prune(children: list[tuple[float, int]], beam: int) -> list[tuple[float, int]]:
    return sorted(children, key=lambda c: (-c[0], c[1]))[:beam]


async def fused_decoder(client: Any, model: str, frames: list[Frame], beam: int,
                        weight: float) -> list[float]:  # fmt: skip
    """One decoder through Fuse: the latency of each step (seconds)."""
    latencies = []
    async with client.fuse(model) as lm:
        await lm.step(query=[0])
        hyps = [(0.0, 0)]  # (score, id)
        previous = [0]
        next_id = 1
        for frame in frames:
            extend, children = [], []
            for score, hid in hyps:
                for token, am in frame:
                    extend.append((next_id, hid, token))
                    children.append((score + am, next_id))
                    next_id += 1
            start = time.perf_counter()
            answers = await lm.step(extend, drop=previous)
            latencies.append(time.perf_counter() - start)
            scored = [
                (s + weight * a.token_log_prob, hid)
                for (s, hid), a in zip(children, answers, strict=True)
            ]
            hyps = prune(scored, beam)
            previous = [hid for _, hid in children]
    return latencies


def run_fused(target: str, model: str, frames: list[list[Frame]], beam: int,
              weight: float) -> tuple[list[float], float]:  # fmt: skip
    async def main() -> tuple[list[float], float]:
        async with AsyncLmServeClient(target) as client:
            start = time.perf_counter()
            got = await asyncio.gather(
                *(fused_decoder(client, model, f, beam, weight) for f in frames)
            )
            return [x for lat in got for x in lat], time.perf_counter() - start

    return asyncio.run(main())


def in_process_decoder(stepper: Any, frames: list[Frame], beam: int, weight: float,
                       out: list[float]) -> None:  # fmt: skip
    """One decoder stepping the model itself: per step the beam's states merged once, fanned
    out to its children, one step, split (the service's own use of the stepper)."""
    log_probs, state = stepper.prefill([[]])
    hyps = [(0.0, state, np.array(log_probs[0]))]
    for frame in frames:
        start = time.perf_counter()
        merged = stepper.merge([h[1] for h in hyps])
        rows = np.repeat(np.arange(len(hyps)), len(frame))
        tokens = np.array([t for _ in hyps for t, _ in frame], dtype=np.int64)
        lps, new = stepper.step(tokens, stepper.select(merged, rows))
        states = stepper.split(new)
        children = []
        for k, (row, token) in enumerate(zip(rows.tolist(), tokens.tolist(), strict=True)):
            score, _, dist = hyps[row]
            am = frame[k % len(frame)][1]
            children.append((score + am + weight * float(dist[token]), k))
        kept = prune(children, beam)
        hyps = [(s, states[k], np.array(lps[k])) for s, k in kept]
        out.append(time.perf_counter() - start)


def run_in_process(stepper: Any, frames: list[list[Frame]], beam: int,
                   weight: float) -> tuple[list[float], float]:  # fmt: skip
    outs: list[list[float]] = [[] for _ in frames]
    threads = [
        threading.Thread(target=in_process_decoder, args=(stepper, f, beam, weight, o))
        for f, o in zip(frames, outs, strict=True)
    ]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [x for o in outs for x in o], time.perf_counter() - start


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--decoders", type=int, default=8)
    parser.add_argument("--beam", type=int, default=8)
    parser.add_argument("--candidates", type=int, default=4)
    parser.add_argument("--frames", type=int, default=20 if quick() else 40)
    parser.add_argument("--runs", type=int, default=1 if quick() else 3)
    parser.add_argument("--weight", type=float, default=0.5)
    parser.add_argument("--models", default="kjv-5gram,kjv-lstm")
    args = parser.parse_args(argv)
    names = args.models.split(",")
    folders = [Path(DEFAULT_MODELS / n) for n in names]
    repo = linked_repository("fusion", *folders)
    with ServerProcess(repo) as server:
        for name, folder in zip(names, folders, strict=True):
            entry = load_entry(folder, LoadOptions(), {})
            assert entry.scorer is not None, entry.load_error
            stepper = make_stepper(entry.scorer.backend)
            vocab = len(stepper.vocab)
            frames = [
                frames_for(seed, vocab, args.frames, args.candidates)
                for seed in range(args.decoders)
            ]
            tokens = args.decoders * (args.frames * args.beam * args.candidates)
            # Warm both paths (the worker's threads, ONNX Runtime's first runs).
            run_fused(server.target, name, [f[:3] for f in frames], args.beam, args.weight)
            run_in_process(stepper, [f[:3] for f in frames], args.beam, args.weight)
            for way in ("fuse", "in_process"):
                p50s, p99s, rates = [], [], []
                for _ in range(args.runs):
                    if way == "fuse":
                        lat, wall = run_fused(server.target, name, frames, args.beam, args.weight)
                    else:
                        lat, wall = run_in_process(stepper, frames, args.beam, args.weight)
                    p50s.append(percentile(lat, 50) * 1e3)
                    p99s.append(percentile(lat, 99) * 1e3)
                    rates.append(tokens / wall)
                    log(f"{name} {way}: p50 {p50s[-1]:.2f} ms p99 {p99s[-1]:.2f} ms "
                        f"{rates[-1]:,.0f} tokens/s")  # fmt: skip
                setup = {
                    "model": name,
                    "way": way,
                    "decoders": args.decoders,
                    "beam": args.beam,
                    "candidates": args.candidates,
                    "frames": args.frames,
                    "vocab": vocab,
                }
                emit(record(f"fusion_step_p50_{name}_{way}", "ms", p50s, **setup))
                emit(record(f"fusion_step_p99_{name}_{way}", "ms", p99s, **setup))
                emit(record(f"fusion_tokens_per_s_{name}_{way}", "tokens/s", rates, **setup))


if __name__ == "__main__":
    main()
