"""The transformer kind's figures (issue #32, item 4; issue #38, item 7), each beside its raw
baseline in one run.

    python bench/bench_transformer.py [--quick] [--layout shared|optimum]
        [--parts parity,cache,score,generate,probe]

The model: a GPT-2 of 4 layers, 256 wide, 4 heads, 256 positions, over a byte-level BPE of
8,000 tokens trained on the KJV training text (random seeded weights: speed does not depend on
them), imported with `lmserve import-hf` in one of two layouts (`--layout`), each built once
into its own folder (`bench/results/cache/bench-gpt2-<layout>`, the model's name too):
- shared (the default, what import-hf writes for GPT-2): the shared-buffer graph
  (GroupQueryAttention appending to a pooled cache in place, `FusedTransformerBackend`,
  stepped by `SharedKvStepper`);
- optimum: optimum's layout (`import-hf --optimum-layout`: a cache per batch that ONNX
  Runtime copies at every step, `TransformerBackend`, stepped by `KvStepper`).
Every part runs on either layout; the raw baselines are ONNX Runtime alone on that layout's own
graph with the inputs ready (shared: an I/O binding made once over the pool's buffers, as
`FusedTransformerBackend.run` makes one per call; optimum: `session.run` on a feed made once).
Parts:
- score: the backend's `score` (per-token log-probs, as Score computes them) against
  ONNX Runtime alone running the same graph on the same right-padded batches of 64 KJV test
  lines (logits only: no log-softmax, no gather), tokens/s, alternated, median of runs;
- generate: a real server's CPU per generated token at 32 concurrent streams (128 tokens each,
  no prompt) against the raw cached step's CPU per row at batch 32 with the run's mean cache
  length (65 positions), both CPU time (`process_time` / psutil), the raw one timed before and
  after each run; beside it the backend's own call and the stepper's whole step;
- probe: a 4-line Score's latency (the transformer's and kjv-5gram's) every 20 ms, alone and
  beside 32 transformer streams (a client process of their own), p50/p99;
- cache: the bytes one stream's cache holds: per position from the config, and measured from
  the stepper's state after 32 streams read 1 + 128 positions (shared: the pool's allocated
  bytes a row too, its geometric growth included);
- parity: the import's parity figures from the folder's manifest.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Callable
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
LAYOUTS = ("shared", "optimum")
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


def build_model(shared_cache: bool = True) -> Path:
    """The benchmark's GPT-2 folder in one layout (`shared_cache`: the shared-buffer graph
    import-hf writes by default; False: optimum's layout), built once into the cache under
    the layout's name; the checkpoint both are imported from is built once too."""
    from lmserve.export.hf.importer import export_checkpoint

    layout = LAYOUTS[0] if shared_cache else LAYOUTS[1]
    folder = CACHE_DIR / f"{MODEL}-{layout}"
    if not (folder / "model.yaml").is_file():
        checkpoint = CACHE_DIR / f"{MODEL}-checkpoint"
        if not (checkpoint / "tokenizer.json").is_file():
            log("building the benchmark GPT-2 (tokenizer on KJV train, seeded weights)")
            gpt2_checkpoint(checkpoint, layers=4, width=256, heads=4, positions=256)
        log(f"importing the benchmark GPT-2 into {folder.name}")
        export_checkpoint(checkpoint, folder, overwrite=True, shared_cache=shared_cache)
    found = layout_of(folder)
    if found != layout:
        raise SystemExit(f"{folder}: import-hf wrote the {found} layout, not {layout}")
    return folder


def layout_of(folder: Path) -> str:
    """The folder's graph layout, from its manifest (`architecture.kv_cache`)."""
    from lmserve.server.backends.fused_transformer import SHARED_BUFFER
    from lmserve.server.manifest import read_manifest

    shared = read_manifest(folder).architecture.get("kv_cache") == SHARED_BUFFER
    return LAYOUTS[0] if shared else LAYOUTS[1]


def _load(folder: Path) -> Any:
    from lmserve.server.registry.repository import ModelState, load_entry

    entry = load_entry(folder)
    if entry.state is not ModelState.READY or entry.scorer is None:
        raise SystemExit(f"{folder}: {entry.load_error}")
    return entry.scorer


def _stepper(backend: Any) -> Any:
    """The stepper the transformer family gives this backend (its layout's)."""
    from lmserve.server.backends.fused_transformer import FusedTransformerBackend
    from lmserve.server.backends.kv_stepping import KvStepper
    from lmserve.server.backends.shared_kv_stepping import SharedKvStepper

    if isinstance(backend, FusedTransformerBackend):
        return SharedKvStepper(backend)
    return KvStepper(backend)


def _ort_call(backend: Any, ids: Any, positions: Any, **cache: Any) -> Callable[[], None]:
    """ONNX Runtime alone on the backend's graph, its inputs made once: `ids` [B, T] at
    `positions` after a cache given as the layout needs it. Shared layout (`seqlens`,
    `caches`: each row's length after the call minus one, and per layer the key and value
    buffers [B, kv_heads, C, head_dim], written in place): an I/O binding bound once, as
    `FusedTransformerBackend.run` binds one per call (same names, same clamp of positions,
    logits into a preallocated array). Optimum's layout (`mask`, `past`): `session.run`
    on a feed made once, every output fetched, as `TransformerBackend.forward` runs it."""
    from lmserve.server.backends.fused_transformer import SEQLENS, TOTAL, FusedTransformerBackend
    from lmserve.server.backends.transformer import past_names, present_names

    session = backend.session
    layers = backend.cache.layers
    reads_positions = "position_ids" in {i.name for i in session.get_inputs()}
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    positions = np.minimum(positions, backend.cache.max_positions - 1).astype(np.int64)
    if not isinstance(backend, FusedTransformerBackend):
        feed = {"input_ids": ids, "attention_mask": cache["mask"]}
        if reads_positions:
            feed["position_ids"] = positions
        feed.update(zip(past_names(layers), cache["past"], strict=True))
        outputs = ["logits", *present_names(layers)]
        return lambda: session.run(outputs, feed)
    seqlens = np.ascontiguousarray(cache["seqlens"], dtype=np.int32)
    total = np.array(max(int(seqlens.max()) + 1, ids.shape[1]), dtype=np.int32)
    caches = cache["caches"]
    logits = np.empty((*ids.shape, backend.logits_width), dtype=np.float32)
    binding = session.io_binding()
    binding.bind_cpu_input("input_ids", ids)
    if reads_positions:
        binding.bind_cpu_input("position_ids", positions)
    binding.bind_cpu_input(SEQLENS, seqlens)
    binding.bind_cpu_input(TOTAL, total)
    for past, present, array in zip(past_names(layers), present_names(layers), caches, strict=True):
        shape, pointer = list(array.shape), array.ctypes.data
        binding.bind_input(past, "cpu", 0, np.float32, shape, pointer)
        binding.bind_output(present, "cpu", 0, np.float32, shape, pointer)
    binding.bind_output("logits", "cpu", 0, np.float32, list(logits.shape), logits.ctypes.data)
    kept = (ids, positions, seqlens, total, caches, logits)  # the binding points into these

    def call() -> None:
        session.run_with_iobinding(binding)
        assert kept

    return call


def _lines() -> list[str]:
    lines = [line for line in KJV_TEST.read_text(encoding="utf-8").splitlines() if line]
    return lines[: (4 if quick() else 16) * BATCH_LINES]


def score_part(folder: Path, runs: int, extra: dict[str, Any]) -> None:
    from lmserve.server.backends.fused_transformer import FusedTransformerBackend

    scorer = _load(folder)
    backend, codec = scorer.backend, scorer.codec
    shared = isinstance(backend, FusedTransformerBackend)
    batches = [
        codec.encode_texts(_lines()[i : i + BATCH_LINES])
        for i in range(0, len(_lines()), BATCH_LINES)
    ]
    calls = []
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
        if shared:  # from nothing: a buffer as wide as the batch, rows right-padded
            shape = (len(lengths), backend.cache.kv_heads, ids.shape[1], backend.cache.head_dim)
            caches = [np.empty(shape, dtype=np.float32) for _ in range(2 * backend.cache.layers)]
            calls.append(_ort_call(backend, ids, positions, seqlens=lengths - 1, caches=caches))
        else:
            past = backend.cache.empty(len(lengths))
            calls.append(_ort_call(backend, ids, positions, mask=mask, past=past))
    tokens = sum(len(b.ids) + b.batch_size for b in batches)  # scored positions (</s> too)

    def served() -> None:
        for batch in batches:
            backend.score(batch, per_token=True)

    def raw() -> None:
        for call in calls:
            call()

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
    info = {"batch_lines": BATCH_LINES, "batches": len(batches), "tokens": tokens, **extra}
    emit(record("transformer_score_tokens_per_s", "tokens/s", served_rates, **info))
    emit(record("transformer_raw_ort_tokens_per_s", "tokens/s", raw_rates, **info))
    emit(
        record(
            "transformer_score_vs_raw_ort",
            "ratio",
            ratios,
            note="served tokens/s over ONNX Runtime alone on the same batches (target >= 0.8)",
            **info,
        )
    )


def _raw_step_cpu(folder: Path, batch: int, length: int, steps: int) -> dict[str, float]:
    """CPU seconds per row of one cached step at `batch` rows that have read `length`
    positions, medians of 3: `graph`, ONNX Runtime alone on the layout's cached step with
    its inputs ready (`_ort_call`); `call`, the backend's own call (shared:
    `FusedTransformerBackend.run`, its binding made per call; optimum: `forward`); `step`,
    the stepper's whole step (placement, positions, the call, log-softmax). Also `bytes`,
    the state's cache bytes, and `pool_bytes`, the bytes allocated for it (shared: the
    pool's buffers after a step, grown as the stepper grows them; optimum: the state's)."""
    stepper = _stepper(_load(folder).backend)
    backend = stepper.backend
    rng = np.random.default_rng(0)
    vocab = len(stepper.vocab)
    _, state = stepper.prefill([rng.integers(1, vocab, length - 1).tolist() for _ in range(batch)])
    tokens = rng.integers(1, vocab, batch)
    ids = tokens.reshape(-1, 1)
    positions = state.lengths[:, None].copy()
    if hasattr(state, "pool"):
        stepper.step(tokens, state)  # the pool grown as a step grows it; then in place
        rows = state.slots
        lo = int(rows.min())
        assert (rows == np.arange(lo, lo + batch)).all(), "a fresh prefill's rows are a block"
        caches = [a[lo : lo + batch] for a in state.pool.arrays]
        seqlens = state.lengths.astype(np.int32)
        graph = _ort_call(backend, ids, positions, seqlens=seqlens, caches=caches)
        pool_bytes = sum(int(a.nbytes) for a in state.pool.arrays) * batch / state.pool.rows

        def call() -> None:
            backend.run(ids, positions, seqlens, caches)

    else:
        mask = np.ones((batch, state.width + 1), dtype=np.int64)
        graph = _ort_call(backend, ids, positions, mask=mask, past=state.past)
        pool_bytes = state.nbytes

        def call() -> None:
            backend.forward(ids, mask, positions, state.past)

    def whole() -> None:
        stepper.step(tokens, state)  # the new state dies at once: the next step is in place

    medians = {}
    for name, fn in (("graph", graph), ("call", call), ("step", whole)):
        fn()
        out = []
        for _ in range(3):
            start = time.process_time()
            for _ in range(steps):
                fn()
            out.append((time.process_time() - start) / (steps * batch))
        medians[name] = statistics.median(out)
    return {**medians, "bytes": state.nbytes, "pool_bytes": pool_bytes}


def generate_part(folder: Path, runs: int, tokens: int, extra: dict[str, Any]) -> None:
    mean_length = 1 + (tokens + 1) // 2
    figures: dict[str, list[float]] = {"server": [], "graph": [], "call": [], "step": []}
    ratios = []
    repository = linked_repository(f"transformer-repo-{extra['layout']}", folder)
    with ServerProcess(repository) as server:
        for run in range(runs):
            before_raw = _raw_step_cpu(folder, STREAMS, mean_length, 10)
            before = server.cpu_seconds()
            generated = asyncio.run(_generate(server.target, folder.name, STREAMS, tokens))
            used = server.cpu_seconds() - before
            after_raw = _raw_step_cpu(folder, STREAMS, mean_length, 10)
            raw = {k: (before_raw[k] + after_raw[k]) / 2 for k in ("graph", "call", "step")}
            per_token = used / (generated + tokens)  # the warm-up stream ran there too
            log(
                f"generate run {run}: server {1000 * per_token:.3f} ms/token, raw graph "
                f"{1000 * raw['graph']:.3f}, backend call {1000 * raw['call']:.3f}, "
                f"stepper {1000 * raw['step']:.3f} ({per_token / raw['graph']:.2f}x)"
            )
            figures["server"].append(1000 * per_token)
            for name, value in raw.items():
                figures[name].append(1000 * value)
            ratios.append(per_token / raw["graph"])
    info = {
        "streams": STREAMS,
        "tokens_per_stream": tokens,
        "raw_cache_length": mean_length,
        **extra,
    }
    shared = extra["layout"] == LAYOUTS[0]
    backend_call = "FusedTransformerBackend.run" if shared else "TransformerBackend.forward"
    stepper = "SharedKvStepper.step" if shared else "KvStepper.step"
    emit(record("transformer_generate_server_cpu_ms_per_token", "ms", figures["server"], **info))
    emit(
        record(
            "transformer_raw_cached_step_cpu_ms_per_row",
            "ms",
            figures["graph"],
            note="ONNX Runtime alone on the graph's cached step, inputs ready",
            **info,
        )
    )
    emit(
        record(
            "transformer_backend_call_cpu_ms_per_row",
            "ms",
            figures["call"],
            note=f"{backend_call}: the graph call as the stepper makes it",
            **info,
        )
    )
    emit(
        record(
            "transformer_stepper_step_cpu_ms_per_row",
            "ms",
            figures["step"],
            note=f"{stepper}: the backend's call plus the stepper's own work and log-softmax",
            **info,
        )
    )
    emit(
        record(
            "transformer_generate_cpu_per_token_vs_raw_step",
            "ratio",
            ratios,
            note="server CPU per generated token / raw cached step CPU per row (target <= 1.5)",
            **info,
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


def probe_part(folder: Path, runs: int, seconds: float, extra: dict[str, Any]) -> None:
    import multiprocessing as mp

    from soak import _generate_worker

    repository = linked_repository(
        f"transformer-probe-repo-{extra['layout']}", folder, DEFAULT_NGRAM
    )
    model = folder.name
    figures: dict[str, list[float]] = {}
    with ServerProcess(repository) as server:
        for run in range(runs):
            for name in (model, DEFAULT_NGRAM.name):
                idle = _probe(server.target, name, seconds / 2)
                figures.setdefault(f"{_probe_key(name, model)}_idle_p99", []).append(
                    1000 * percentile(idle, 99)
                )
            results: Any = mp.get_context("spawn").Queue()
            stop_at = time.monotonic() + 5 + seconds
            streams = mp.get_context("spawn").Process(
                target=_generate_worker,
                args=(server.target, STREAMS, stop_at, results, run + 1, (model,)),
            )
            streams.start()
            time.sleep(5)
            for name in (model, DEFAULT_NGRAM.name):
                busy = _probe(server.target, name, seconds / 2)
                key = _probe_key(name, model)
                figures.setdefault(f"{key}_p50", []).append(1000 * percentile(busy, 50))
                figures.setdefault(f"{key}_p99", []).append(1000 * percentile(busy, 99))
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
        key = f"transformer_probe_{name.replace('-', '_')}"
        emit(record(key, unit, values, streams=STREAMS, **extra))


def _probe_key(name: str, model: str) -> str:
    """A probed model's name in its records: the transformer as MODEL in either layout (the
    records carry the layout), so the names stay those earlier runs recorded."""
    return MODEL if name == model else name


def cache_part(folder: Path, tokens: int, extra: dict[str, Any]) -> None:
    backend = _load(folder).backend
    per_position = backend.cache.bytes_per_position()
    measured = _raw_step_cpu(folder, STREAMS, 1 + tokens, 1)
    emit(record("transformer_cache_bytes_per_position", "bytes", [per_position], **extra))
    emit(
        record(
            "transformer_cache_bytes_per_stream",
            "bytes",
            [measured["bytes"] / STREAMS],
            positions=1 + tokens,
            from_config=per_position * (1 + tokens),
            **extra,
        )
    )
    emit(
        record(
            "transformer_cache_allocated_bytes_per_stream",
            "bytes",
            [measured["pool_bytes"] / STREAMS],
            positions=1 + tokens,
            note="the buffers held for a stream after one step (shared: the pool's, grown "
            "geometrically; optimum: the state's own)",
            **extra,
        )
    )


def parity_part(folder: Path, extra: dict[str, Any]) -> None:
    from lmserve.server.manifest import read_manifest

    parity = read_manifest(folder).provenance.parity
    for name, value in parity.items():
        emit(record(f"transformer_parity_{name}", "nats", [value], **extra))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--layout", choices=LAYOUTS, default=LAYOUTS[0])
    parser.add_argument("--parts", default="score,generate,probe,cache,parity")
    parser.add_argument("--runs", type=int, default=None)
    parser.add_argument("--seconds", type=float, default=None, help="probe seconds per run")
    args = parser.parse_args()
    if args.quick:
        os.environ[QUICK_ENV] = "1"
    runs = args.runs or (1 if quick() else 5)
    tokens = 32 if quick() else TOKENS
    folder = build_model(shared_cache=args.layout == LAYOUTS[0])
    extra = {"layout": args.layout, "model": folder.name}
    parts = set(args.parts.split(","))
    if "parity" in parts:
        parity_part(folder, extra)
    if "cache" in parts:
        cache_part(folder, tokens, extra)
    if "score" in parts:
        score_part(folder, runs, extra)
    if "generate" in parts:
        generate_part(folder, min(runs, 3), tokens, extra)
    if "probe" in parts:
        probe_part(folder, min(runs, 3), args.seconds or (6.0 if quick() else 30.0), extra)


if __name__ == "__main__":
    main()
