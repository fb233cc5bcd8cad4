"""The n-gram engine against KenLM's Python module, in process, single thread (JSON Lines).

Measures on the KJV 5-gram: ARPA load, binary load and the resident memory each adds (next to
KenLM's); `score` throughput over `test.txt` in batches of 200 sentences (`</s>` counted, like
KenLM's words/s) for the C kernel, the numpy kernel, the C kernel with the text encoding
(`TextEncoder`, C `WordIndex`) and the encoding alone, next to `kenlm.Model.score` on the same
lines; and one full next-word distribution, next to KenLM's state API (`BaseScore` per word).
Batched next-word distributions (`next_token_log_probs_batch`, float32, one C call) at batch 1,
8, 32 and 64 over contexts from the test set, interleaved with the per-row Python path that
generation used before (`next_token_log_probs` per distinct context into a float64 [B, V]).

The throughputs are measured interleaved (each run times every contender once, in turn), so a
busy machine slows them alike; each record's `ratio_to_kenlm` is the median of the per-run ratios.
"""

from __future__ import annotations

import gc
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))

import numpy as np  # noqa: E402
import psutil  # noqa: E402
from common import (  # noqa: E402
    KJV_5GRAM_ARPA,
    KJV_TEST,
    batches,
    count_words,
    emit,
    log,
    quick,
    rate_record,
    read_lines,
    record,
    repeat,
)

from lmserve.server.backends.ngram.model import NgramModel  # noqa: E402
from lmserve.server.text.word import (  # noqa: E402
    TextEncoder,
    WordTokenizer,
    encode_token_lists,
)

BATCH = 200
DISTRIBUTION_BATCHES = (1, 8, 32, 64)


def rss_mb() -> float:
    gc.collect()
    return float(psutil.Process().memory_info().rss) / 2**20


def interleaved(contenders: dict[str, Callable[[], Any]], runs: int) -> dict[str, list[float]]:
    """Seconds per run of each contender, timed in turn within every run (after one warm-up)."""
    for fn in contenders.values():
        fn()
    seconds: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(runs):
        for name, fn in contenders.items():
            start = time.perf_counter()
            fn()
            seconds[name].append(time.perf_counter() - start)
    return seconds


def time_distributions(
    model: NgramModel, contexts: list[tuple[int, ...]], reps: int, runs: int
) -> tuple[list[float], list[float]]:
    """ms per batch, per run: the batched C call, and the per-row Python path (interleaved)."""
    vocab_size = len(model.vocab)
    out = np.empty((len(contexts), vocab_size), dtype=np.float32)

    def batched() -> None:
        for _ in range(reps):
            model.next_token_log_probs_batch(contexts, bos=False, out=out)

    def per_row() -> None:  # what ContextStepper did before the batched call
        for _ in range(reps):
            rows = np.empty((len(contexts), vocab_size), dtype=np.float64)
            cache: dict[tuple[int, ...], Any] = {}
            for i, context in enumerate(contexts):
                row = cache.get(context)
                if row is None:
                    row = cache[context] = model.next_token_log_probs(context, bos=False)
                rows[i] = row

    seconds = interleaved({"c": batched, "python": per_row}, runs)
    return [s / reps * 1e3 for s in seconds["c"]], [s / reps * 1e3 for s in seconds["python"]]


def batched_distributions(
    model: NgramModel, token_lists: list[list[str]], runs: int
) -> list[dict[str, Any]]:
    """ms per batch of next-word distributions: one C call against the per-row Python path."""
    rng = random.Random(0)
    vocab_size = len(model.vocab)
    sentences = [t for t in token_lists if t]
    records = []
    for size in DISTRIBUTION_BATCHES:
        # A generation step's contexts: <s> and a test sentence's first words, cut to order-1.
        contexts = []
        for _ in range(size):
            words = rng.choice(sentences)
            prefix = words[: rng.randrange(0, len(words))]
            ids = encode_token_lists([prefix], model.vocab).ids.tolist()
            contexts.append(tuple([model.vocab.bos_id, *ids][-(model.order - 1) :]))
        reps = max(4, (200 if quick() else 1000) // size)
        c_ms, py_ms = time_distributions(model, contexts, reps, runs)
        rec = record(
            f"ngram_next_token_batch{size}_ms",
            "ms",
            c_ms,
            batch=size,
            distinct_contexts=len(set(contexts)),
            vocab=vocab_size,
            per_row_us=round(statistics.median(c_ms) / size * 1e3, 2),
            python_per_row_path_ms=round(statistics.median(py_ms), 4),
            python_per_row_us=round(statistics.median(py_ms) / size * 1e3, 2),
            speedup=round(statistics.median(p / c for p, c in zip(py_ms, c_ms, strict=True)), 2),
        )
        records.append(rec)
    return records


def main() -> None:
    runs = 5 if quick() else 9
    lines = read_lines(KJV_TEST)
    n_words = count_words(lines)
    token_lists = [line.split() for line in lines]

    with tempfile.TemporaryDirectory() as tmp:
        binary = Path(tmp) / "kjv5.lmbin"
        log("building the binary from the ARPA ...")
        NgramModel.from_arpa(KJV_5GRAM_ARPA).save(binary)
        gc.collect()

        # Binary load: time, and memory after scoring the whole test set (mapped pages count
        # in RSS only once touched).
        before = rss_mb()
        load_s = repeat(lambda: NgramModel.load(binary), runs)
        model = NgramModel.load(binary)
        encoded = [encode_token_lists(b, model.vocab) for b in batches(token_lists, BATCH)]
        for enc in encoded:
            model.score(enc)
        binary_rec = record(
            "ngram_binary_load_seconds",
            "s",
            load_s,
            rss_delta_mb=round(rss_mb() - before, 1),
            file_mb=round(binary.stat().st_size / 2**20, 1),
        )

        numpy_model = NgramModel.load(binary, kernel="numpy")
        text_batches = batches(lines, BATCH)
        encoder = TextEncoder(WordTokenizer(), model.vocab)
        if not encoder.native:
            log("the C WordIndex is not built: encoding runs in Python")

        def score_all() -> None:
            for enc in encoded:
                model.score(enc)

        def score_all_numpy() -> None:
            for enc in encoded:
                numpy_model.score(enc)

        def encode_all() -> None:
            for chunk in text_batches:
                encoder.encode_texts(chunk)

        def encode_and_score_all() -> None:
            for chunk in text_batches:
                model.score(encoder.encode_texts(chunk))

        contenders: dict[str, Callable[[], None]] = {
            "ngram_engine_score_words_per_s": score_all,
            "ngram_engine_numpy_score_words_per_s": score_all_numpy,
            "ngram_engine_encode_and_score_words_per_s": encode_and_score_all,
            "ngram_encode_words_per_s": encode_all,
        }
        try:
            import kenlm
        except ImportError:
            kenlm = None
            log("kenlm not installed: no comparison")
        ken: Any = None
        ken_load = ken_rss = 0.0
        if kenlm is not None:
            before = rss_mb()
            start = time.perf_counter()
            ken = kenlm.Model(str(KJV_5GRAM_ARPA))
            ken_load = time.perf_counter() - start

            def ken_score_all() -> None:
                for line in lines:
                    ken.score(line, bos=True, eos=True)

            ken_score_all()  # touch what scoring touches, as for ours
            ken_rss = rss_mb() - before
            contenders["kenlm_score_words_per_s"] = ken_score_all
        seconds = interleaved(contenders, runs)
        rates = {
            name: rate_record(name, "words/s", n_words, secs, batch=BATCH, words=n_words)
            for name, secs in seconds.items()
        }
        if "kenlm_score_words_per_s" in seconds:
            ken_secs = seconds["kenlm_score_words_per_s"]
            for name, rec in rates.items():
                if name != "kenlm_score_words_per_s":
                    per_run = [k / s for k, s in zip(ken_secs, seconds[name], strict=True)]
                    rec["ratio_to_kenlm"] = round(statistics.median(per_run), 3)
                    rec["kenlm_words_per_s"] = rates["kenlm_score_words_per_s"]["median"]
        rates["ngram_engine_score_words_per_s"]["ratio_to_numpy"] = round(
            statistics.median(
                n / c
                for c, n in zip(
                    seconds["ngram_engine_score_words_per_s"],
                    seconds["ngram_engine_numpy_score_words_per_s"],
                    strict=True,
                )
            ),
            3,
        )

        contexts = [[], ["in", "the"], ["and", "the", "lord", "said", "unto"], ["qwertz", "of"]]
        ctx_ids = [encode_token_lists([c], model.vocab).ids.tolist() for c in contexts]
        reps = 200 if quick() else 1000

        def distributions() -> None:
            for _ in range(reps):
                for ids in ctx_ids:
                    model.next_token_log_probs(ids)

        per_call = [s / (reps * len(ctx_ids)) * 1e3 for s in repeat(distributions, runs)]
        ours_next = record("ngram_next_token_log_probs_ms", "ms", per_call, vocab=len(model.vocab))
        for rec in batched_distributions(model, token_lists, runs):
            emit(rec)

        if ken is None:
            for rec in (binary_rec, *rates.values(), ours_next):
                emit(rec)
            return

        def ken_distribution(words: list[str]) -> None:
            state, scratch = kenlm.State(), kenlm.State()
            ken.BeginSentenceWrite(state)
            for w in words:
                ken.BaseScore(state, w, scratch)
                state, scratch = scratch, state
            for w in model.vocab.words:
                ken.BaseScore(state, w, scratch)

        def ken_distributions() -> None:
            for c in contexts:
                ken_distribution(c)

        ken_next = [s / len(contexts) * 1e3 for s in repeat(ken_distributions, max(1, runs // 2))]
        ours_next["kenlm_state_api_ms"] = round(sorted(ken_next)[len(ken_next) // 2], 3)

        gc.collect()
        before = rss_mb()
        arpa_s = []
        for _ in range(1 if quick() else 3):
            start = time.perf_counter()
            arpa_model = NgramModel.from_arpa(KJV_5GRAM_ARPA)
            arpa_s.append(time.perf_counter() - start)
        arpa_rss = rss_mb() - before
        del arpa_model
        emit(
            record(
                "ngram_arpa_load_seconds",
                "s",
                arpa_s,
                rss_delta_mb=round(arpa_rss, 1),
                kenlm_arpa_load_s=round(ken_load, 3),
                kenlm_rss_delta_mb=round(ken_rss, 1),
            )
        )
        binary_rec["kenlm_rss_delta_mb"] = round(ken_rss, 1)  # KenLM's model, from its ARPA
        for rec in (binary_rec, *rates.values(), ours_next):
            emit(rec)


if __name__ == "__main__":
    main()
