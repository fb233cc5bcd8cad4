"""Neural Score throughput through the server against raw ONNX Runtime, same model, same run.

    python bench/bench_neural_score.py [--quick] [--runs 3] [--lines N] [--clients 16]

Model: the shipped kjv-lstm (models/). Texts: the KJV test sentences.
- Raw baseline: the kjv-lstm backend loaded in this process (`OnnxBackend`, the server's
  default session options), the sentences encoded beforehand by the model's tokenizer and
  sorted by length, scored in batches of 64 (`backend.score`, totals only): the best case for
  padding, with no gRPC and no tokenizing.
- Server: `lmserve serve` on models/ (own process); 16 client threads on one channel send
  Score requests of 64 consecutive sentences (unsorted), all sentences once per run.
Each run times the raw pass, then the server pass, then the raw pass again; the run's ratio is
the server's tokens/s over the mean of the two raw figures (target >= 0.8). Tokens count `</s>`.
The server's totals must equal the raw ones within 1e-3 nats per sentence. Also the server's
process CPU seconds per 1k tokens (psutil) next to its throughput.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from common import (
    DEFAULT_LSTM,
    DEFAULT_MODELS,
    QUICK_ENV,
    REPO_ROOT,
    batches,
    default_model,
    emit,
    log,
    quick,
    read_lines,
    record,
)
from grpc_calls import Stubs, score_request
from server_process import ServerProcess

TEST_LINES = REPO_ROOT / "export" / "lmserve" / "export" / "corpora" / "kjv" / "test.txt"
MODEL = "kjv-lstm"
BATCH = 64
TOLERANCE_NATS = 1e-3


class RawBaseline:
    """kjv-lstm in process: sentences encoded once, sorted by length, batches of 64."""

    def __init__(self, lines: list[str]) -> None:
        from lmserve.server.backends.onnx import OnnxBackend, OnnxOptions
        from lmserve.server.manifest import read_manifest
        from lmserve.server.text.word import TextEncoder, WordTokenizer

        folder = default_model(DEFAULT_LSTM)
        manifest = read_manifest(folder)
        self.backend = OnnxBackend.load(folder, manifest, OnnxOptions())
        spec = manifest.tokenizer
        encoder = TextEncoder(WordTokenizer(lowercase=spec.lowercase, pattern=spec.pattern),
                              self.backend.vocab)  # fmt: skip
        lengths = [len(encoder.encode_texts([line]).ids) for line in lines]
        self.order = sorted(range(len(lines)), key=lambda i: lengths[i])
        self.batches = [encoder.encode_texts([lines[i] for i in part])
                        for part in batches(self.order, BATCH)]  # fmt: skip
        self.tokens = sum(lengths) + len(lines)  # + one </s> per sentence

    def score(self) -> tuple[float, np.ndarray]:
        """Seconds for all batches, and each sentence's total in the original order."""
        totals = np.zeros(len(self.order))
        start = time.perf_counter()
        parts = [self.backend.score(b).totals for b in self.batches]
        seconds = time.perf_counter() - start
        totals[self.order] = np.concatenate(parts)
        return seconds, totals


def serve_pass(
    stubs: Stubs, requests: list[list[str]], clients: int
) -> tuple[float, np.ndarray, int, list[str]]:
    """Seconds for all requests over `clients` threads; each sentence's total (NaN where its
    request failed), the tokens scored, and the failed requests' status codes."""
    import grpc

    def call(texts: list[str]) -> Any:
        try:
            return stubs.lm.Score(score_request(MODEL, texts), timeout=600)
        except grpc.RpcError as exc:
            return str(exc.code())

    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        responses = list(pool.map(call, requests))
    seconds = time.perf_counter() - start
    totals: list[float] = []
    tokens = 0
    for texts, response in zip(requests, responses, strict=True):
        if isinstance(response, str):
            totals.extend([np.nan] * len(texts))
            continue
        totals.extend(r.log_prob for r in response.results)
        tokens += sum(r.token_count for r in response.results)
    errors = [r for r in responses if isinstance(r, str)]
    return seconds, np.array(totals), tokens, errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short runs (or LMSERVE_BENCH_QUICK)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--lines",
        type=int,
        default=None,
        help="sentences per pass (all; --quick: one request per client)",
    )
    parser.add_argument("--clients", type=int, default=16)
    args = parser.parse_args()
    if args.quick:
        os.environ[QUICK_ENV] = "1"
    lines = [line for line in read_lines(TEST_LINES) if line.strip()]
    lines = lines[: args.lines or (args.clients * BATCH if quick() else len(lines))]
    raw = RawBaseline(lines)
    requests = batches(lines, BATCH)
    log(f"{len(lines)} sentences, {raw.tokens} tokens; {len(requests)} requests of {BATCH}")
    raw.score()  # warm-up
    raw_rates, server_rates, ratios, cpu_per_1k, diffs = [], [], [], [], []
    failed: list[int] = []
    counts_agree: list[bool] = []  # the server counted the tokens the raw pass scored
    with ServerProcess(DEFAULT_MODELS) as server:
        stubs = Stubs.open(server.target)
        try:
            serve_pass(stubs, requests[:2], 2)  # warm-up
            for run in range(args.runs):
                before, want = raw.score()
                cpu = server.cpu_seconds()
                seconds, got, tokens, errors = serve_pass(stubs, requests, args.clients)
                cpu = server.cpu_seconds() - cpu
                after, _ = raw.score()
                raw_rate = raw.tokens / statistics.mean([before, after])
                rate = tokens / seconds  # what was scored; failed requests count nothing
                done = ~np.isnan(got)
                diff = float(np.max(np.abs(got[done] - want[done]))) if done.any() else np.nan
                result = {
                    "name": "neural_score_run",
                    "run": run,
                    "raw_tokens_per_s": round(raw_rate, 1),
                    "server_tokens_per_s": round(rate, 1),
                    "server_vs_raw": round(rate / raw_rate, 4),
                    "server_cpu_s_per_1k_tokens": round(cpu / max(tokens, 1) * 1e3, 5),
                    "max_abs_diff_nats": diff if done.any() else None,
                    "tokens": tokens,
                    "raw_tokens": raw.tokens,
                    "failed_requests": len(errors),
                    "errors": sorted(set(errors)),
                }
                print(json.dumps(result), flush=True)
                raw_rates.append(raw_rate)
                server_rates.append(rate)
                ratios.append(rate / raw_rate)
                cpu_per_1k.append(cpu / max(tokens, 1) * 1e3)
                diffs.append(diff)
                failed.append(len(errors))
                counts_agree.append(tokens == raw.tokens)
        finally:
            stubs.close()
    setup = {"sentences": len(lines), "tokens": raw.tokens, "texts_per_request": BATCH}
    emit(record("neural_score_raw_ort_sorted_batch64_tokens_per_s", "tokens/s", raw_rates, **setup))
    emit(record(f"neural_score_server_{args.clients}clients_tokens_per_s", "tokens/s",
                server_rates, clients=args.clients, failed_requests=failed,
                cpu_s_per_1k_tokens=statistics.median(cpu_per_1k), **setup))  # fmt: skip
    emit(record("neural_score_server_cpu_s_per_1k_tokens", "s", cpu_per_1k, clients=args.clients))
    rec = record("neural_score_server_vs_raw", "ratio", ratios, target=0.8)
    emit({**rec, "meets_target": rec["median"] >= 0.8 and not any(failed)})
    rec = record("neural_score_max_abs_diff_nats", "nats", diffs, tolerance=TOLERANCE_NATS)
    equal = max(diffs) <= TOLERANCE_NATS and all(counts_agree)  # NaN (none scored): False
    emit({**rec, "totals_equal": equal, "failed_requests": failed})


if __name__ == "__main__":
    main()
