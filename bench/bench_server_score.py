"""Score throughput and latency of the KJV 5-gram: KenLM in-process, our engine in-process, and
through a real server (its own process) with one client (unary Score calls, and one ScoreStream),
eight client processes, and single calls.

    python bench/bench_server_score.py [--runs 5] [--model-dir DIR] [--clients 8]
    python bench/bench_server_score.py --model-dir DIR --arpa ARPA --sentences FILE --clients 0

Words count `</s>`: whitespace words + 1 per line of `../shared/data/kjv/test.txt` (or of
`--sentences`). With `--arpa` the KenLM baseline loads that file, the ARPA the served folder was
imported from, and the served totals are checked against KenLM's (the scale table of issue #22
runs it on the 100M-n-gram synthetic model). `--clients 0` skips the concurrent clients. Prints
JSON records (see bench/README.md) on stdout, progress on stderr.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common import (
    CACHE_DIR,
    KJV_5GRAM_ARPA,
    KJV_TEST,
    batches,
    count_words,
    emit,
    linked_repository,
    log,
    percentile,
    quick,
    rate_record,
    read_lines,
    record,
    repeat,
    timed,
)
from server_process import ServerProcess

if TYPE_CHECKING:
    from lmserve.server.registry.repository import ModelRepository

MODEL_NAME = "kjv-5gram"
BATCH = 200
LATENCY_TEXT = "in the beginning god created the heaven and the earth"
LN10 = math.log(10)


def load_repository(explicit: Path | None) -> tuple[Path, ModelRepository]:
    """The model repository to serve and its loaded form: --model-dir's parent, else a folder
    built from KenLM's ARPA (cached, rebuilt when it no longer loads, e.g. after a binary format
    change), so that the server and the KenLM baseline score with the very same model."""
    from lmserve.server.registry.repository import ModelRepository

    if explicit is not None:
        folder = linked_repository("score-repo", explicit)  # the server loads this model only
        repo = ModelRepository.load(folder)
        repo.ready(explicit.name)  # fails loudly when the model does not load
        return folder, repo
    folder = CACHE_DIR / "repo" / MODEL_NAME
    if (folder / "model.yaml").is_file():
        repo = ModelRepository.load(folder.parent)
        if repo.get(MODEL_NAME).scorer is not None:
            return folder.parent, repo
        log(f"cached {folder} does not load; rebuilding it")
        shutil.rmtree(folder)
    from lmserve.server.backends.ngram.folder import write_model_folder
    from lmserve.server.backends.ngram.model import NgramModel
    from lmserve.server.manifest import Provenance, TokenizerSpec

    log(f"building {folder} from {KJV_5GRAM_ARPA}")
    write_model_folder(
        NgramModel.from_arpa(KJV_5GRAM_ARPA),
        folder,
        name=MODEL_NAME,
        tokenizer=TokenizerSpec(),  # whitespace split, as KenLM reads text
        provenance=Provenance(training_corpus=str(KJV_5GRAM_ARPA), trained_by="kenlm lmplz"),
    )
    return folder.parent, ModelRepository.load(folder.parent)


def bench_kenlm(
    arpa: Path, lines: list[str], words: int, runs: int
) -> tuple[dict[str, Any], list[float], Callable[[], None]]:
    """KenLM's words/s in-process, its scores, and one pass over `lines` to time again later."""
    import kenlm

    model = kenlm.Model(str(arpa))
    scores: list[float] = []

    def once() -> None:
        scores[:] = [model.score(line, bos=True, eos=True) for line in lines]

    seconds = repeat(once, runs)
    return rate_record("kenlm_inprocess_words_per_s", "words/s", words, seconds), scores, once


def bench_engine(
    repo: ModelRepository, model: str, lines: list[str], words: int, runs: int
) -> list[dict[str, Any]]:
    """Our engine without gRPC: the server's per-request work (tokenize, encode, score totals)
    over batches of BATCH lines, and the backend alone on pre-encoded batches."""
    from lmserve.server.decoding.scoring import ScoreOptions
    from lmserve.server.text.word import encode_token_lists

    scorer = repo.ready(model).scorer
    assert scorer is not None
    options = ScoreOptions()
    chunks = batches(lines, BATCH)
    encoded = [encode_token_lists(scorer.tokenize(c), scorer.backend.vocab) for c in chunks]

    def with_text() -> None:
        for chunk in chunks:
            scorer.score_texts(chunk, options)

    def backend_only() -> None:
        for batch in encoded:
            scorer.backend.score(batch, bos=True, eos=True, per_token=False)

    return [
        rate_record(
            "engine_inprocess_words_per_s",
            "words/s",
            words,
            repeat(with_text, runs),
            note=f"Scorer.score_texts on batches of {BATCH}: tokenize + encode + score",
        ),
        rate_record(
            "engine_backend_only_words_per_s",
            "words/s",
            words,
            repeat(backend_only, runs),
            note="backend.score on pre-encoded batches, totals only",
        ),
    ]


def _client_worker(
    target: str, model: str, chunks: list[list[str]], passes: int, barrier: Any, out: Any
) -> None:
    """One benchmark client process: waits for the others, then sends every batch `passes` times."""
    from lmserve.client import LmServeClient

    with LmServeClient(target, timeout=60) as client:
        client.score(model, chunks[0])  # connect and warm up
        barrier.wait()
        start = time.monotonic()
        for _ in range(passes):
            for chunk in chunks:
                client.score(model, chunk)
        out.put((start, time.monotonic()))


def bench_concurrent(
    target: str,
    model: str,
    chunks: list[list[str]],
    words: int,
    clients: int,
    passes: int,
    runs: int,
) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    rates: list[float] = []
    for _ in range(runs):
        barrier = ctx.Barrier(clients)
        out = ctx.Queue()
        procs = [
            ctx.Process(target=_client_worker, args=(target, model, chunks, passes, barrier, out))
            for _ in range(clients)
        ]
        for p in procs:
            p.start()
        spans = [out.get(timeout=600) for _ in procs]
        for p in procs:
            p.join()
        wall = max(e for _, e in spans) - min(s for s, _ in spans)
        rates.append(words * passes * clients / wall)
    return record(
        f"server_score_{clients}clients_words_per_s",
        "words/s",
        rates,
        clients=clients,
        client_kind="processes (one channel each, sync unary Score)",
        batch_size=BATCH,
    )


def bench_server(
    repository: Path,
    model: str,
    lines: list[str],
    words: int,
    kenlm_once: Callable[[], None],
    runs: int,
    clients: int,
) -> list[dict[str, Any]]:
    """Through a real server. The ratios to KenLM are taken run by run: each run times KenLM
    in-process over the same passes right before and right after the server loops, so that the
    machine's drifting speed (up to 2x within minutes on a shared VM) hits both sides alike."""
    import grpc

    from lmserve.client import LmServeClient, _wire
    from lmserve.client import _requests as req
    from lmserve.client.client import _scores
    from lmserve.v1 import lm_service_pb2 as pb

    chunks = batches(lines, BATCH)
    passes = 2 if quick() else 10
    results: list[dict[str, Any]] = []
    with ServerProcess(repository) as server, LmServeClient(server.target) as client:
        client.wait_for_ready(60)
        client.score(model, chunks[0])

        def one_client() -> None:
            for _ in range(passes):
                for chunk in chunks:
                    client.score(model, chunk)

        # What the client library costs: the same loop on the raw stub with prebuilt requests.
        # The two loops alternate run by run so that drifting load on the machine hits both.
        requests = [req.score_request(model, c, True, True, False) for c in chunks]
        stub = client.stub

        def raw_stub() -> None:
            for _ in range(passes):
                for request in requests:
                    stub.Score(request, timeout=60)

        # The pipelined way: every batch of every pass on one ScoreStream call.
        def one_client_stream() -> None:
            stream = (chunk for _ in range(passes) for chunk in chunks)
            for _ in client.score_stream(model, stream, timeout=600):
                pass

        def kenlm_passes() -> None:
            for _ in range(passes):
                kenlm_once()

        one_client()
        raw_stub()
        one_client_stream()
        kenlm_seconds: list[float] = []
        seconds: list[float] = []
        raw_seconds: list[float] = []
        stream_seconds: list[float] = []
        server_cpu: list[float] = []
        stream_cpu: list[float] = []
        for _ in range(runs):
            before = timed(kenlm_passes)
            cpu0 = server.cpu_seconds()
            seconds.append(timed(one_client))
            server_cpu.append(server.cpu_seconds() - cpu0)
            raw_seconds.append(timed(raw_stub))
            cpu0 = server.cpu_seconds()
            stream_seconds.append(timed(one_client_stream))
            stream_cpu.append(server.cpu_seconds() - cpu0)
            kenlm_seconds.append((before + timed(kenlm_passes)) / 2)
        total = words * passes
        results.append(
            rate_record(
                "server_score_1client_words_per_s",
                "words/s",
                total,
                seconds,
                batch_size=BATCH,
                words_per_run=total,
                server_cpu_seconds_per_run=round(statistics.median(server_cpu), 3),
                client_wall_seconds_per_run=round(statistics.median(seconds), 3),
            )
        )
        sentences = len(lines) * passes
        results.append(
            rate_record("server_score_1client_sentences_per_s", "sentences/s", sentences, seconds)
        )
        results.append(
            record(
                "server_score_1client_vs_kenlm",
                "ratio",
                [k / s for s, k in zip(seconds, kenlm_seconds, strict=True)],
                note="server words/s (1 client) / KenLM in-process words/s, timed in the same run",
            )
        )
        results.append(
            rate_record(
                "server_score_1client_raw_stub_words_per_s",
                "words/s",
                total,
                raw_seconds,
                note="prebuilt ScoreRequests on the generated stub: no client-library work",
            )
        )
        results.append(
            rate_record(
                "server_score_1client_stream_words_per_s",
                "words/s",
                total,
                stream_seconds,
                batch_size=BATCH,
                words_per_run=total,
                server_cpu_seconds_per_run=round(statistics.median(stream_cpu), 3),
                note="one LmServeClient.score_stream call per run over the same batches",
            )
        )
        results.append(
            record(
                "server_score_1client_stream_vs_kenlm",
                "ratio",
                [k / s for s, k in zip(stream_seconds, kenlm_seconds, strict=True)],
                note="server words/s (1 client, ScoreStream) / KenLM in-process words/s, timed in "
                "the same run",
            )
        )
        # The client's own request building + result conversion, without any network: the
        # server's answer as it arrives (wire bytes), read as LmServeClient reads it.
        with grpc.insecure_channel(server.target) as channel:
            score_bytes = channel.unary_unary(
                _wire.SCORE_METHOD,
                request_serializer=pb.ScoreRequest.SerializeToString,
                response_deserializer=None,
            )
            answer = score_bytes(requests[0], timeout=60)
        reps = 200

        def client_work() -> None:
            for _ in range(reps):
                _scores(_wire.read_score_response(answer), False)
                req.score_request(model, chunks[0], True, True, False)

        overhead = [s / reps * 1e6 for s in repeat(client_work, runs)]
        results.append(
            record(
                "client_overhead_us_per_batch",
                "us",
                overhead,
                note=f"build a {BATCH}-text ScoreRequest + convert its response, no network",
            )
        )

        if clients > 0:
            results.append(
                bench_concurrent(
                    server.target, model, chunks, words, clients, max(1, passes // 2), runs
                )
            )

        # Latency of a single short sentence.
        calls = 500 if quick() else 2000
        one = [LATENCY_TEXT]
        p50: list[float] = []
        p99: list[float] = []
        for _ in range(min(runs, 3)):
            samples = []
            for _ in range(calls):
                start = time.perf_counter()
                client.score(model, one)
                samples.append((time.perf_counter() - start) * 1e3)
            p50.append(percentile(samples, 50))
            p99.append(percentile(samples, 99))
        results.append(record("server_score_latency_p50_ms", "ms", p50, calls_per_run=calls))
        results.append(record("server_score_latency_p99_ms", "ms", p99, calls_per_run=calls))

        # Same numbers as KenLM? (totals in nats vs KenLM's log10 totals).
        served = [r.log_prob for c in chunks for r in client.score(model, c)]
        results.append({"name": "_served_totals", "values": served})
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3 if quick() else 5)
    parser.add_argument(
        "--model-dir",
        type=Path,
        default=None,
        help="serve this model folder (and its siblings) instead of KenLM's 5-gram",
    )
    parser.add_argument(
        "--arpa", type=Path, default=None, help="KenLM's model: the ARPA --model-dir came from"
    )
    parser.add_argument("--sentences", type=Path, default=KJV_TEST, help="one text per line")
    parser.add_argument(
        "--clients", type=int, default=8, help="concurrent client processes (0: skip)"
    )
    args = parser.parse_args(argv)

    lines = read_lines(args.sentences)
    words = count_words(lines)
    log(f"{len(lines)} sentences, {words} words (</s> counted), {args.runs} runs each")
    repository, repo = load_repository(args.model_dir)
    model = args.model_dir.name if args.model_dir else MODEL_NAME

    same_model = args.model_dir is None or args.arpa is not None
    kenlm_rec, kenlm_scores, kenlm_once = bench_kenlm(
        args.arpa or KJV_5GRAM_ARPA, lines, words, args.runs
    )
    emit(kenlm_rec)
    for rec in bench_engine(repo, model, lines, words, args.runs):
        emit(rec)
    server_recs = bench_server(repository, model, lines, words, kenlm_once, args.runs, args.clients)
    for rec in server_recs:
        if rec["name"] == "_served_totals":
            if not same_model:
                continue  # another model than KenLM's ARPA: nothing to compare
            diffs = [abs(s - k * LN10) for s, k in zip(rec["values"], kenlm_scores, strict=True)]
            emit(record("server_vs_kenlm_max_abs_diff_nats", "nats", [max(diffs)]))
        else:
            emit(rec)
    return 0


if __name__ == "__main__":
    sys.exit(main())
