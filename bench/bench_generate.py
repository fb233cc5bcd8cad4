"""Generate through a real server (own process) at 1, 8, 32 and 64 concurrent streams, next to
the raw batched step of the same model at the same batch sizes, measured in the same run.

    python bench/bench_generate.py [--quick] [--tokens 64] [--runs 3]

Models: the default-size LSTM (random init, ONNX Runtime) and an n-gram model (the KJV 3-gram,
whose step is a full next-token distribution per row). Per concurrency level it reports the
aggregate generated tokens/s, per-token latency p50/p99 (gaps between a stream's tokens as the
client receives them) and time to first token p50; the raw figure is `batch / step seconds`
(`Stepper.step`, no sampling, no gRPC). Sampling is plain (temperature 1), `ignore_eos` so every
stream makes exactly `--tokens` tokens.
"""

from __future__ import annotations

import argparse
import os
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from common import CACHE_DIR, KJV, QUICK_ENV, emit, log, percentile, quick, record, repeat
from server_process import ServerProcess

CONCURRENCY = (1, 8, 32, 64)


def _ngram_folder() -> Path:
    from lmserve.server.backends.ngram import NgramModel, write_model_folder
    from lmserve.server.registry.manifest import Provenance, TokenizerSpec

    folder = CACHE_DIR / "generate-kjv3"
    if not (folder / "model.yaml").exists():
        log("importing the KJV 3-gram ARPA")
        shutil.rmtree(folder, ignore_errors=True)
        write_model_folder(
            NgramModel.from_arpa(KJV / "kenlm" / "kjv.3gram.arpa"),
            folder,
            name="bench-kjv3",
            tokenizer=TokenizerSpec.model_validate({"kind": "word"}),
            provenance=Provenance(trained_by="kenlm", training_corpus="kjv"),
            description="KJV 3-gram for bench_generate",
        )
    return folder


def _repository(onnx_dir: Path, ngram_dir: Path) -> Path:
    repo = CACHE_DIR / "generate-repo"
    repo.mkdir(parents=True, exist_ok=True)
    for folder in (onnx_dir, ngram_dir):
        link = repo / folder.name
        if not link.exists():
            link.symlink_to(folder)
    return repo


def _raw(stepper: Any, runs: int, model: str) -> None:
    """Seconds of one batched `Stepper.step` at each batch size -> tokens/s."""
    import numpy as np

    rng = np.random.default_rng(0)
    vocab = len(stepper.vocab)
    for batch in CONCURRENCY:
        _, state = stepper.prefill([[int(t)] for t in rng.integers(3, vocab, batch)])
        tokens = rng.integers(3, vocab, batch)

        def one(s: Any = state, t: Any = tokens) -> None:
            stepper.step(t, s)

        steps = 20 if batch <= 8 else 10

        def many(o: Any = one, k: int = steps) -> None:
            for _ in range(k):
                o()

        seconds = repeat(many, runs)
        per_step = [s / steps for s in seconds]
        emit(
            record(
                f"generate_{model}_raw_step_batch{batch}_tokens_per_s",
                "tokens/s",
                [batch / s for s in per_step],
                step_ms=1000 * min(per_step),
            )
        )


def _served(target: str, model: str, label: str, streams: int, tokens: int, runs: int) -> None:
    from lmserve.client import GeneratedToken, LmServeClient

    with LmServeClient(target, timeout=600) as client:
        list(client.generate(model, max_new_tokens=4, ignore_eos=True))  # warm up

        def stream(i: int, start: float) -> tuple[float, list[float]]:
            times = []
            for event in client.generate(model, max_new_tokens=tokens, ignore_eos=True, seed=i):
                if isinstance(event, GeneratedToken):
                    times.append(time.perf_counter())
            return times[0] - start, [b - a for a, b in zip(times, times[1:], strict=False)]

        rates: list[float] = []
        ttft: list[float] = []
        gaps: list[float] = []
        with ThreadPoolExecutor(streams) as pool:
            for _ in range(runs):
                barrier = threading.Barrier(streams)

                def go(i: int, b: threading.Barrier = barrier) -> tuple[float, list[float]]:
                    b.wait()
                    return stream(i, time.perf_counter())

                start = time.perf_counter()
                results = list(pool.map(go, range(streams)))
                rates.append(streams * tokens / (time.perf_counter() - start))
                ttft.extend(r[0] for r in results)
                gaps.extend(g for r in results for g in r[1])
    emit(
        record(
            f"generate_{label}_server_{streams}streams_tokens_per_s",
            "tokens/s",
            rates,
            streams=streams,
            tokens_per_stream=tokens,
            inter_token_p50_ms=1000 * percentile(gaps, 50),
            inter_token_p99_ms=1000 * percentile(gaps, 99),
            ttft_p50_ms=1000 * percentile(ttft, 50),
            ttft_p99_ms=1000 * percentile(ttft, 99),
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="few, short runs (< 2 minutes)")
    parser.add_argument("--tokens", type=int, default=None, help="tokens per stream")
    parser.add_argument("--runs", type=int, default=None)
    args = parser.parse_args()
    if args.quick:
        os.environ[QUICK_ENV] = "1"
    tokens = args.tokens or (16 if quick() else 64)
    runs = args.runs or (1 if quick() else 3)

    from neural_model import default_folders

    from lmserve.server.backends.ngram import load_model_folder_binary
    from lmserve.server.backends.onnx import OnnxBackend, OnnxOptions
    from lmserve.server.backends.stepping import make_stepper
    from lmserve.server.registry.manifest import read_manifest

    onnx_dir, _, _ = default_folders()
    ngram_dir = _ngram_folder()
    onnx_name = read_manifest(onnx_dir).name
    ngram_name = read_manifest(ngram_dir).name

    log("raw steps")
    _raw(make_stepper(OnnxBackend.load(onnx_dir, read_manifest(onnx_dir), OnnxOptions())),
         runs + 1, "lstm")  # fmt: skip
    _raw(
        make_stepper(load_model_folder_binary(ngram_dir, read_manifest(ngram_dir))),
        runs + 1,
        "ngram",
    )

    with ServerProcess(_repository(onnx_dir, ngram_dir)) as server:
        for model, label in ((onnx_name, "lstm"), (ngram_name, "ngram")):
            log(f"server: {model}")
            for streams in CONCURRENCY:
                _served(server.target, model, label, streams, tokens, runs)


if __name__ == "__main__":
    main()
