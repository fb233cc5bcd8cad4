"""The transformer kind's figures (issue #32, item 4), each beside its raw baseline in one run.

    python bench/bench_transformer.py [--quick] [--parts score,generate,probe,cache]

The model: a GPT-2 of 4 layers, 256 wide, 4 heads, 256 positions, over a byte-level BPE of
8,000 tokens trained on the KJV training text (random seeded weights: speed does not depend on
them), imported with `lmserve import-hf` (its parity figures are recorded too). Parts:
- score: `TransformerBackend.score` (per-token log-probs, as Score computes them) against
  ONNX Runtime alone running the same graph on the same right-padded batches of 64 KJV test
  lines (logits only: no log-softmax, no gather), tokens/s, alternated, median of runs;
- generate: a real server's CPU per generated token at 32 concurrent streams (128 tokens each,
  no prompt) against the raw cached step's CPU per row at batch 32 with the run's mean cache
  length (65 positions), both CPU time (`process_time` / psutil), the raw one timed before and
  after each run;
- probe: a 4-line Score's latency (the transformer's and kjv-5gram's) every 20 ms, alone and
  beside 32 transformer streams (a client process of their own), p50/p99;
- cache: the bytes one stream's cache holds: per position from the config, and measured from
  the stepper's state after 32 streams read 1 + 128 positions.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
from bench_generate_cpu import _generate
from common import (
    CACHE_DIR,
    DEFAULT_NGRAM,
    KJV,
    KJV_TEST,
    QUICK_ENV,
    emit,
    linked_repository,
    log,
    percentile,
    quick,
    record,
)
from server_process import ServerProcess

MODEL = "bench-gpt2"
STREAMS = 32
TOKENS = 128
BATCH_LINES = 64


def gpt2_checkpoint(
    checkpoint: Path,
    *,
    layers: int,
    width: int,
    heads: int,
    positions: int,
    corpus: Path = KJV / "train.txt",
    vocab: int = 8000,
    seed: int = 0,
) -> Path:
    """A transformers GPT-2 checkpoint folder (config.json, weights, tokenizer.json): a
    byte-level BPE of `vocab` tokens trained on `corpus`, weights random from `seed`."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>"],
        show_progress=False,
    )
    tokenizer.train([str(corpus)], trainer)
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=tokenizer.get_vocab_size(),
        n_positions=positions,
        n_embd=width,
        n_layer=layers,
        n_head=heads,
        bos_token_id=0,
        eos_token_id=0,
    )
    GPT2LMHeadModel(config).save_pretrained(checkpoint)
    tokenizer.save(str(checkpoint / "tokenizer.json"))
    return checkpoint


def build_model() -> Path:
    """The benchmark's GPT-2 folder (built once, kept in bench/results/cache)."""
    folder = CACHE_DIR / MODEL
    if (folder / "model.yaml").is_file():
        return folder
    from lmserve.export.hf.importer import export_checkpoint

    log("building the benchmark GPT-2 (tokenizer on KJV train, seeded weights)")
    checkpoint = gpt2_checkpoint(
        CACHE_DIR / f"{MODEL}-checkpoint", layers=4, width=256, heads=4, positions=256
    )
    export_checkpoint(checkpoint, folder)
    return folder


def _load(folder: Path) -> Any:
    from lmserve.server.registry.repository import ModelState, load_entry

    entry = load_entry(folder)
    if entry.state is not ModelState.READY or entry.scorer is None:
        raise SystemExit(f"{folder}: {entry.load_error}")
    return entry.scorer


def _lines() -> list[str]:
    lines = [line for line in KJV_TEST.read_text(encoding="utf-8").splitlines() if line]
    return lines[: (4 if quick() else 16) * BATCH_LINES]


def score_part(folder: Path, runs: int) -> None:
    scorer = _load(folder)
    backend, codec = scorer.backend, scorer.codec
    batches = [
        codec.encode_texts(_lines()[i : i + BATCH_LINES])
        for i in range(0, len(_lines()), BATCH_LINES)
    ]
    feeds = []
    for batch in batches:  # the raw baseline's inputs: <s> + tokens, right-padded, as given
        lengths = np.diff(batch.offsets) + 1
        ids = np.zeros((len(lengths), int(lengths.max())), dtype=np.int64)
        mask = np.zeros_like(ids)
        for r in range(len(lengths)):
            row = batch.ids[batch.offsets[r] : batch.offsets[r + 1]]
            ids[r, 0] = backend.vocab.bos_id
            ids[r, 1 : 1 + len(row)] = row
            mask[r, : lengths[r]] = 1
        positions = np.broadcast_to(np.arange(ids.shape[1]), ids.shape).copy()
        feeds.append((ids, mask, positions, backend.cache.empty(len(lengths))))
    tokens = sum(len(b.ids) + b.batch_size for b in batches)  # scored positions (</s> too)

    def served() -> None:
        for batch in batches:
            backend.score(batch, per_token=True)

    def raw() -> None:
        for ids, mask, positions, past in feeds:
            backend.forward(ids, mask, positions, past)

    served()  # warm-up
    raw()
    served_rates, raw_rates, ratios = [], [], []
    for run in range(runs):
        start = time.perf_counter()
        raw()
        raw_s = time.perf_counter() - start
        start = time.perf_counter()
        served()
        served_s = time.perf_counter() - start
        served_rates.append(tokens / served_s)
        raw_rates.append(tokens / raw_s)
        ratios.append(raw_s / served_s)
        log(f"score run {run}: served {tokens / served_s:.0f} tok/s, raw {tokens / raw_s:.0f}")
    batch_info = {"batch_lines": BATCH_LINES, "batches": len(batches), "tokens": tokens}
    emit(record("transformer_score_tokens_per_s", "tokens/s", served_rates, **batch_info))
    emit(record("transformer_raw_ort_tokens_per_s", "tokens/s", raw_rates, **batch_info))
    emit(
        record(
            "transformer_score_vs_raw_ort",
            "ratio",
            ratios,
            note="served tokens/s over ONNX Runtime alone on the same batches (target >= 0.8)",
        )
    )


def _raw_step_cpu(folder: Path, batch: int, length: int, steps: int) -> tuple[float, float, int]:
    """CPU seconds per row of one cached step at `batch` rows that have read `length`
    positions: the graph call alone (ONNX Runtime, inputs ready) and the stepper's whole step
    (mask, positions, log-softmax too), medians of 3; and the bytes of that state."""
    from lmserve.server.backends.kv_stepping import KvStepper

    stepper = KvStepper(_load(folder).backend)
    rng = np.random.default_rng(0)
    vocab = len(stepper.vocab)
    _, state = stepper.prefill([rng.integers(1, vocab, length - 1).tolist() for _ in range(batch)])
    tokens = rng.integers(1, vocab, batch)
    ids = tokens.reshape(-1, 1)
    mask = np.ones((batch, state.width + 1), dtype=np.int64)
    positions = state.lengths[:, None].copy()

    def graph() -> None:
        stepper.backend.forward(ids, mask, positions, state.past)

    def whole() -> None:
        stepper.step(tokens, state)

    medians = []
    for call in (graph, whole):
        call()
        out = []
        for _ in range(3):
            start = time.process_time()
            for _ in range(steps):
                call()
            out.append((time.process_time() - start) / (steps * batch))
        medians.append(statistics.median(out))
    return medians[0], medians[1], state.nbytes


def generate_part(folder: Path, runs: int, tokens: int) -> None:
    mean_length = 1 + (tokens + 1) // 2
    server_ms, raw_ms, step_ms, ratios = [], [], [], []
    with ServerProcess(linked_repository("transformer-repo", folder)) as server:
        for run in range(runs):
            raw, step, _ = _raw_step_cpu(folder, STREAMS, mean_length, 10)
            before = server.cpu_seconds()
            generated = asyncio.run(_generate(server.target, MODEL, STREAMS, tokens))
            used = server.cpu_seconds() - before
            raw_after, step_after, _ = _raw_step_cpu(folder, STREAMS, mean_length, 10)
            raw, step = (raw + raw_after) / 2, (step + step_after) / 2
            per_token = used / (generated + tokens)  # the warm-up stream ran there too
            log(
                f"generate run {run}: server {1000 * per_token:.3f} ms/token, raw graph "
                f"{1000 * raw:.3f}, stepper {1000 * step:.3f}"
            )
            server_ms.append(1000 * per_token)
            raw_ms.append(1000 * raw)
            step_ms.append(1000 * step)
            ratios.append(per_token / raw)
    extra = {"streams": STREAMS, "tokens_per_stream": tokens, "raw_cache_length": mean_length}
    emit(record("transformer_generate_server_cpu_ms_per_token", "ms", server_ms, **extra))
    emit(record("transformer_raw_cached_step_cpu_ms_per_row", "ms", raw_ms, **extra))
    emit(
        record(
            "transformer_stepper_step_cpu_ms_per_row",
            "ms",
            step_ms,
            note="KvStepper.step: the graph call plus mask, positions and log-softmax",
            **extra,
        )
    )
    emit(
        record(
            "transformer_generate_cpu_per_token_vs_raw_step",
            "ratio",
            ratios,
            note="server CPU per generated token / raw cached step CPU per row (target <= 1.5)",
            **extra,
        )
    )


def _probe(target: str, model: str, seconds: float) -> list[float]:
    import grpc

    from lmserve.v1 import lm_service_pb2 as pb
    from lmserve.v1 import lm_service_pb2_grpc

    lines = _lines()[:400]
    requests = [
        pb.ScoreRequest(model=model, texts=lines[i : i + 4]) for i in range(0, len(lines), 4)
    ]
    with grpc.insecure_channel(target) as channel:
        stub = lm_service_pb2_grpc.LanguageModelServiceStub(channel)
        stub.Score(requests[0], timeout=30)
        times: list[float] = []
        stop_at = time.monotonic() + seconds
        due = time.perf_counter()
        while time.monotonic() < stop_at:
            started = time.perf_counter()
            stub.Score(requests[len(times) % len(requests)], timeout=30)
            times.append(time.perf_counter() - started)
            due += 0.02
            time.sleep(max(0.0, due - time.perf_counter()))
    return times


def probe_part(folder: Path, runs: int, seconds: float) -> None:
    import multiprocessing as mp

    from soak import _generate_worker

    repository = linked_repository("transformer-probe-repo", folder, DEFAULT_NGRAM)
    figures: dict[str, list[float]] = {}
    with ServerProcess(repository) as server:
        for run in range(runs):
            for model in (MODEL, DEFAULT_NGRAM.name):
                idle = _probe(server.target, model, seconds / 2)
                figures.setdefault(f"{model}_idle_p99", []).append(1000 * percentile(idle, 99))
            results: Any = mp.get_context("spawn").Queue()
            stop_at = time.monotonic() + 5 + seconds
            streams = mp.get_context("spawn").Process(
                target=_generate_worker,
                args=(server.target, STREAMS, stop_at, results, run + 1, (MODEL,)),
            )
            streams.start()
            time.sleep(5)
            for model in (MODEL, DEFAULT_NGRAM.name):
                busy = _probe(server.target, model, seconds / 2)
                figures.setdefault(f"{model}_p50", []).append(1000 * percentile(busy, 50))
                figures.setdefault(f"{model}_p99", []).append(1000 * percentile(busy, 99))
            generated = results.get(timeout=300)
            streams.join()
            if generated["failures"]:
                raise SystemExit(f"Generate failures: {generated['failures']}")
            figures.setdefault("stream_tokens_per_s", []).append(
                generated["tokens"] / (5 + seconds)
            )
            log(f"probe run {run}: " + ", ".join(f"{k} {v[-1]:.1f}" for k, v in figures.items()))
    for name, values in figures.items():
        unit = "tokens/s" if name.endswith("_per_s") else "ms"
        emit(record(f"transformer_probe_{name.replace('-', '_')}", unit, values, streams=STREAMS))


def cache_part(folder: Path, tokens: int) -> None:
    backend = _load(folder).backend
    per_position = backend.cache.bytes_per_position()
    _, _, nbytes = _raw_step_cpu(folder, STREAMS, 1 + tokens, 1)
    per_stream = nbytes / STREAMS
    emit(record("transformer_cache_bytes_per_position", "bytes", [per_position]))
    emit(
        record(
            "transformer_cache_bytes_per_stream",
            "bytes",
            [per_stream],
            positions=1 + tokens,
            from_config=per_position * (1 + tokens),
        )
    )


def parity_part(folder: Path) -> None:
    from lmserve.server.manifest import read_manifest

    parity = read_manifest(folder).provenance.parity
    for name, value in parity.items():
        emit(record(f"transformer_parity_{name}", "nats", [value]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--parts", default="score,generate,probe,cache,parity")
    parser.add_argument("--runs", type=int, default=None)
    parser.add_argument("--seconds", type=float, default=None, help="probe seconds per run")
    args = parser.parse_args()
    if args.quick:
        os.environ[QUICK_ENV] = "1"
    runs = args.runs or (1 if quick() else 5)
    tokens = 32 if quick() else TOKENS
    folder = build_model()
    parts = set(args.parts.split(","))
    if "parity" in parts:
        parity_part(folder)
    if "cache" in parts:
        cache_part(folder, tokens)
    if "score" in parts:
        score_part(folder, runs)
    if "generate" in parts:
        generate_part(folder, min(runs, 3), tokens)
    if "probe" in parts:
        probe_part(folder, min(runs, 3), args.seconds or (6.0 if quick() else 30.0))


if __name__ == "__main__":
    main()
