"""Score throughput of a neural model through a real server (own process), 1 and 16 clients,
with micro-batching on and off, next to the raw ONNX Runtime figure for the same batch shapes.

    python bench/bench_server_neural.py [--runs 3] [--requests 64] [--texts 8]

Each request scores `--texts` lines of the KJV test set (word ids of the random-initialised
default LSTM: speed does not depend on the words). Tokens count `</s>`.
"""

from __future__ import annotations

import argparse
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from common import KJV_TEST, batches, count_words, emit, log, quick, rate_record, read_lines, repeat
from neural_model import default_folders
from server_process import ServerProcess


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=2 if quick() else 3)
    parser.add_argument("--requests", type=int, default=32 if quick() else 128)
    parser.add_argument("--texts", type=int, default=8)
    args = parser.parse_args()
    import grpc

    from lmserve.server.backends.onnx import OnnxBackend, OnnxOptions
    from lmserve.server.manifest import read_manifest
    from lmserve.server.text.word import TextEncoder, WordTokenizer
    from lmserve.v1 import lm_service_pb2 as pb
    from lmserve.v1 import lm_service_pb2_grpc

    onnx_dir, _, _ = default_folders()
    repo = onnx_dir.parent / "server-repo"
    repo.mkdir(exist_ok=True)
    if not (repo / onnx_dir.name).exists():
        (repo / onnx_dir.name).symlink_to(onnx_dir)
    lines = [line for line in read_lines(KJV_TEST) if line.strip()]
    requests = batches(lines[: args.requests * args.texts], args.texts)
    tokens = count_words([t for r in requests for t in r])

    raw = OnnxBackend.load(onnx_dir, read_manifest(onnx_dir), OnnxOptions())
    encoder = TextEncoder(WordTokenizer(), raw.vocab)
    encoded = [encoder.encode_texts(r) for r in requests]
    for clients in (1, 16):
        merged = [_merge(encoded[i : i + clients]) for i in range(0, len(encoded), clients)]

        def score_all(m: list[Any] = merged) -> None:
            for b in m:
                raw.score(b)

        seconds = repeat(score_all, args.runs)
        name = f"neural_raw_ort_score_batch{clients * args.texts}_tokens_per_s"
        emit(rate_record(name, "tokens/s", tokens, seconds, texts_per_pass=clients * args.texts))

    for batching in ("true", "false"):
        os.environ["LMSERVE_BATCHING_ENABLED"] = batching  # the child server reads it
        with ServerProcess(repo) as server, grpc.insecure_channel(server.target) as channel:
            stub = lm_service_pb2_grpc.LanguageModelServiceStub(channel)

            def call(texts: list[str], s: Any = stub) -> None:
                s.Score(pb.ScoreRequest(model="bench-lstm-onnx", texts=texts))

            for clients in (1, 16):

                def run(c: int = clients) -> None:
                    with ThreadPoolExecutor(c) as pool:
                        list(pool.map(call, requests))

                log(f"server batching={batching}, {clients} clients")
                seconds = repeat(run, args.runs)
                emit(rate_record(f"neural_server_score_{clients}clients_batching_{batching}"
                                 "_tokens_per_s", "tokens/s", tokens, seconds,
                                 clients=clients, texts_per_request=args.texts))  # fmt: skip


def _merge(parts: list[Any]) -> Any:
    from lmserve.server.engine.batcher import merge_batches

    return merge_batches(parts)


if __name__ == "__main__":
    main()
