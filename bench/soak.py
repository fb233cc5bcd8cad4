"""Soak: a real `lmserve serve` under mixed load for minutes; failures, memory and tail latency.

    python bench/soak.py [--minutes 10] [--streams 64] [--json bench/results/soak.json]

On the default models (kjv-5gram, kjv-lstm, kjv-lstm-5gram, kjv-lstm-int8; `make models`) and
a small GPT-2 (`soak-gpt2`: 2 layers, 128 wide, a byte-level BPE of 8,000 tokens trained on the
KJV training text, seeded random weights, imported with `import-hf`; built once into
bench/results/cache), loopback only:
- `--streams` Generate streams kept running (n-gram, LSTM, the mix, the transformer and the int8
  LSTM in turn, 32..256 new tokens each, restarted as they finish), from a child process so
  their client work does not share a GIL with the latency probes;
- loops of small requests, one thread each, measured per request: Score of 4 KJV test lines on
  kjv-5gram and on kjv-lstm, Rerank of 4 n-best lists (tests/data/nbest/kjv-test.jsonl) on
  kjv-5gram, and Complete sessions typing a test sentence letter by letter on kjv-lstm (one
  sample per keystroke).
Records failed requests by RPC and status (target 0), the server's RSS every 5 s, summed over
the front and its engine worker processes (warm-up RSS after one minute, final RSS; target:
within +-10% of the warm-up one; the last sample per process is in the JSON), and p50/p99 per kind
(targets: n-gram Score p99 < 20 ms, neural Score p99 < 50 ms). JSON Lines records on stdout
(`common.emit`), everything in one JSON file, a summary on stderr.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import (
    BENCH_DIR,
    CACHE_DIR,
    DEFAULT_MODELS,
    KJV_TEST,
    REPO_ROOT,
    emit,
    linked_repository,
    log,
    percentile,
    record,
)
from server_process import ServerProcess

NGRAM, LSTM, MIX = "kjv-5gram", "kjv-lstm", "kjv-lstm-5gram"
INT8, TRANSFORMER = "kjv-lstm-int8", "soak-gpt2"
STREAM_MODELS = (NGRAM, LSTM, MIX, TRANSFORMER, INT8)
NBEST = REPO_ROOT / "tests" / "data" / "nbest" / "kjv-test.jsonl"
RSS_PERIOD_S = 5.0
WARMUP_S = 60.0
TIMEOUT_S = 30.0
# A Generate stream's deadline (`--stream-deadline`): with 64 streams over five models on two
# cores, a neural stream gets ~2.5 tokens/s (its worker runs below the n-gram worker's
# priority), so a 256-token stream needs ~100 s; a hang still shows.
STREAM_DEADLINE_S = 120.0


def _status(exc: BaseException) -> str:
    code = getattr(exc, "code", None)
    code = code() if callable(code) else code
    return getattr(code, "name", None) or type(exc).__name__


def _generate_worker(
    target: str,
    streams: int,
    stop_at: float,
    results: Any,
    seed: int,
    models: tuple[str, ...] | None = None,
    deadline: float = STREAM_DEADLINE_S,
) -> None:
    """Child process: `streams` threads, each running Generate streams back to back (over
    `models` in turn; default every family: `STREAM_MODELS`)."""
    from lmserve.client import GeneratedToken, LmServeClient

    failures: Counter[str] = Counter()
    counts = {"streams": 0, "tokens": 0}
    by_model: dict[str, Counter[str]] = {}
    lock = threading.Lock()
    prompts = KJV_TEST.read_text(encoding="utf-8").splitlines()[:200]

    def run(index: int, client: LmServeClient) -> None:
        rng = random.Random(seed * 1000 + index)
        choices = models or STREAM_MODELS
        model = choices[index % len(choices)]
        while time.monotonic() < stop_at:
            prompt = " ".join(rng.choice(prompts).split()[:6])
            tokens = 0
            try:
                for event in client.generate(
                    model,
                    prompt,
                    max_new_tokens=rng.randint(32, 256),
                    timeout=deadline,
                    seed=rng.randrange(2**31),
                ):
                    tokens += isinstance(event, GeneratedToken)
                key = ""
            except Exception as exc:  # counted, reported: the target is none
                key = f"Generate {_status(exc)}"
            with lock:
                counts["streams"] += 1
                counts["tokens"] += tokens
                mine = by_model.setdefault(model, Counter())
                mine.update(streams=1, tokens=tokens, failed=bool(key))
                if key:
                    failures[key] += 1

    with LmServeClient(target, timeout=TIMEOUT_S) as client:
        threads = [threading.Thread(target=run, args=(i, client)) for i in range(streams)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    per_model = {model: dict(counted) for model, counted in by_model.items()}
    results.put({"failures": dict(failures), **counts, "by_model": per_model})


class Probes:
    """The small-request loops: one thread per kind, latencies and failures recorded."""

    def __init__(self, target: str, stop_at: float) -> None:
        from lmserve.client import LmServeClient
        from lmserve.client.nbest import read_jsonl

        self.client = LmServeClient(target, timeout=TIMEOUT_S)
        self.stop_at = stop_at
        self.latencies: dict[str, list[float]] = {}
        self.failures: Counter[str] = Counter()
        self.lines = KJV_TEST.read_text(encoding="utf-8").splitlines()[:400]
        with NBEST.open(encoding="utf-8") as stream:
            self.nbest = list(read_jsonl(stream, str(NBEST)))
        self._lock = threading.Lock()

    def _loop(self, kind: str, rpc: str, call: Callable[[random.Random], None]) -> None:
        rng = random.Random(kind)
        times = self.latencies.setdefault(kind, [])
        while time.monotonic() < self.stop_at:
            started = time.perf_counter()
            try:
                call(rng)
                times.append(time.perf_counter() - started)
            except Exception as exc:
                with self._lock:
                    self.failures[f"{rpc} {_status(exc)}"] += 1
            time.sleep(0.01)

    def score(self, model: str) -> Callable[[random.Random], None]:
        def call(rng: random.Random) -> None:
            self.client.score(model, rng.sample(self.lines, 4), timeout=10)

        return call

    def rerank(self, rng: random.Random) -> None:
        self.client.rerank(NGRAM, rng.sample(self.nbest, 4), timeout=10)

    def complete(self, rng: random.Random) -> None:
        """One session typing a sentence; each keystroke's round trip is one sample."""
        times = self.latencies.setdefault("complete_keystroke", [])
        words = rng.choice(self.lines).split()[:6]
        with self.client.complete(LSTM, k=3) as session:
            for word in words:
                for letter in word + " ":
                    started = time.perf_counter()
                    session.type(letter)
                    times.append(time.perf_counter() - started)

    def threads(self) -> list[threading.Thread]:
        loops: list[tuple[str, str, Callable[[random.Random], None]]] = [
            ("score_ngram", "Score", self.score(NGRAM)),
            ("score_neural", "Score", self.score(LSTM)),
            ("rerank_ngram", "Rerank", self.rerank),
            ("complete_session", "Complete", self.complete),
        ]
        return [threading.Thread(target=self._loop, args=loop) for loop in loops]


def transformer_model() -> Path:
    """The soak's GPT-2 folder (built once: a checkpoint, then `import-hf`)."""
    folder = CACHE_DIR / TRANSFORMER
    if (folder / "model.yaml").is_file():
        return folder
    from bench_transformer import gpt2_checkpoint

    from lmserve.export.hf.importer import export_checkpoint

    log(f"building {TRANSFORMER} (tokenizer on KJV train, seeded weights)")
    checkpoint = gpt2_checkpoint(
        CACHE_DIR / f"{TRANSFORMER}-checkpoint", layers=2, width=128, heads=4, positions=512
    )
    export_checkpoint(checkpoint, folder)
    return folder


def _rss_mb(server: ServerProcess) -> float:
    """Resident memory of the whole server: the front and every engine worker."""
    return sum(server.rss_bytes().values()) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--models", type=Path, default=DEFAULT_MODELS)
    parser.add_argument("--json", type=Path, default=BENCH_DIR / "results" / "soak.json")
    parser.add_argument(
        "--session-idle-seconds",
        type=float,
        default=30.0,
        help="the server's complete_session_idle_seconds (its default: 600)",
    )
    parser.add_argument(
        "--stream-deadline",
        type=float,
        default=STREAM_DEADLINE_S,
        help="each Generate stream's deadline, seconds (probes: 10 s)",
    )
    args = parser.parse_args()
    # Autocomplete sessions are cached until idle this long: with the default 600 s the cache
    # fills for 10 minutes, which reads as RSS growth; 30 s reaches steady state in warm-up.
    os.environ["LMSERVE_COMPLETE_SESSION_IDLE_SECONDS"] = str(args.session_idle_seconds)
    for name in (NGRAM, LSTM, MIX, INT8):
        if not (args.models / name / "model.yaml").exists():
            raise SystemExit(f"{args.models / name} is missing: run `make models` first")
    served = sorted(p for p in args.models.iterdir() if (p / "model.yaml").is_file())
    repository = linked_repository("soak-repo", *served, transformer_model())

    seconds = args.minutes * 60
    with ServerProcess(repository) as server:
        start = time.monotonic()
        stop_at = start + seconds
        results: Any = mp.get_context("spawn").Queue()
        generator = mp.get_context("spawn").Process(
            target=_generate_worker,
            args=(server.target, args.streams, stop_at, results, 1, None, args.stream_deadline),
        )
        generator.start()
        probes = Probes(server.target, stop_at)
        threads = probes.threads()
        for thread in threads:
            thread.start()
        rss: list[tuple[float, float]] = []
        while time.monotonic() < stop_at:
            rss.append((round(time.monotonic() - start, 1), round(_rss_mb(server), 1)))
            log(f"  t={rss[-1][0]:6.0f} s  RSS {rss[-1][1]:.0f} MB")
            time.sleep(RSS_PERIOD_S)
        for thread in threads:
            thread.join()
        generated = results.get(timeout=2 * args.stream_deadline)
        generator.join()
        rss.append((round(time.monotonic() - start, 1), round(_rss_mb(server), 1)))
        per_process = {name: round(b / 2**20, 1) for name, b in server.rss_bytes().items()}
        server_alive = server.alive()
    probes.client.close()

    failures = Counter(probes.failures) + Counter(generated.pop("failures"))
    warm = [mb for t, mb in rss if t >= min(WARMUP_S, seconds / 2)]
    warm_rss, final_rss = warm[0], rss[-1][1]
    summary: dict[str, Any] = {
        "minutes": args.minutes,
        "streams": args.streams,
        "session_idle_seconds": args.session_idle_seconds,
        "server_alive": server_alive,
        "failures": dict(failures),
        "failed_requests": sum(failures.values()),
        "generate": generated,
        "rss_mb": rss,
        "warmup_rss_mb": warm_rss,
        "final_rss_mb": final_rss,
        "final_rss_mb_per_process": per_process,
        "rss_change_pct": round(100 * (final_rss - warm_rss) / warm_rss, 2),
        "latency_ms": {
            kind: {
                "count": len(values),
                "p50": round(1000 * percentile(values, 50), 2),
                "p99": round(1000 * percentile(values, 99), 2),
            }
            for kind, values in probes.latencies.items()
            if values
        },
    }
    emit(record("soak_failed_requests", "requests", [summary["failed_requests"]]))
    emit(record("soak_rss_change", "%", [summary["rss_change_pct"]], warmup=warm_rss))
    for kind, values in summary["latency_ms"].items():
        emit(record(f"soak_{kind}_p99", "ms", [values["p99"]], **values))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    log(json.dumps({k: v for k, v in summary.items() if k != "rss_mb"}, indent=2))


if __name__ == "__main__":
    main()
