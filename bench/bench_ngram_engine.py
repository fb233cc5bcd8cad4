"""The n-gram engine against KenLM's Python module, in process, single thread (JSON Lines).

Measures on the KJV 5-gram: ARPA load, binary load and the resident memory each adds; `score`
throughput over `test.txt` in batches of 200 sentences (`</s>` counted, like KenLM's words/s),
with and without word->id encoding, next to `kenlm.Model.score` on the same lines; and one full
next-word distribution, next to KenLM's state API (`BaseScore` per vocabulary word).
"""

from __future__ import annotations

import gc
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))

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

from lmserve.server.backends.ngram import NgramModel  # noqa: E402
from lmserve.server.text.word import encode_token_lists  # noqa: E402

BATCH = 200


def rss_mb() -> float:
    gc.collect()
    return float(psutil.Process().memory_info().rss) / 2**20


def main() -> None:
    runs = 3 if quick() else 7
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
        emit(
            record(
                "ngram_binary_load_seconds",
                "s",
                load_s,
                rss_delta_mb=round(rss_mb() - before, 1),
                file_mb=round(binary.stat().st_size / 2**20, 1),
            )
        )

        def score_all() -> None:
            for enc in encoded:
                model.score(enc)

        def encode_and_score_all() -> None:
            for chunk in batches(token_lists, BATCH):
                model.score(encode_token_lists(chunk, model.vocab))

        engine = rate_record(
            "ngram_engine_score_words_per_s",
            "words/s",
            n_words,
            repeat(score_all, runs),
            batch=BATCH,
            words=n_words,
        )
        with_encoding = rate_record(
            "ngram_engine_encode_and_score_words_per_s",
            "words/s",
            n_words,
            repeat(encode_and_score_all, runs),
            batch=BATCH,
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

        try:
            import kenlm
        except ImportError:
            kenlm = None
        if kenlm is None:
            for rec in (engine, with_encoding, ours_next):
                emit(rec)
            log("kenlm not installed: no comparison")
            return

        before = rss_mb()
        start = time.perf_counter()
        ken = kenlm.Model(str(KJV_5GRAM_ARPA))
        ken_load = time.perf_counter() - start
        ken_rss = rss_mb() - before

        def ken_score_all() -> None:
            for line in lines:
                ken.score(line, bos=True, eos=True)

        ken_rate = rate_record(
            "kenlm_score_words_per_s", "words/s", n_words, repeat(ken_score_all, runs)
        )
        engine["kenlm_words_per_s"] = ken_rate["median"]
        engine["ratio_to_kenlm"] = round(engine["median"] / ken_rate["median"], 3)
        with_encoding["ratio_to_kenlm"] = round(with_encoding["median"] / ken_rate["median"], 3)

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
        for rec in (engine, with_encoding, ken_rate, ours_next):
            emit(rec)


if __name__ == "__main__":
    main()
