"""The n-gram trainer at scale (issue #22, item 4): `lmserve train-ngram` on synthetic corpora of
10M and more words, its time and peak memory beside the size of the model it writes.

    python bench/bench_train_scale.py [--words 10M ...] [--order 5] [--max-rss-gb 20]
        [--memory 2G] [--arpa-only]

The corpora are `synthetic_arpa.corpus` (Zipfian words with repeated phrases, sentences of about
20 words), written as text, one sentence a line, and cached in bench/results/cache/scale/. Each
training runs as its own process (`run_guarded`: peak RSS from wait4, killed and recorded past
the limit). `--discount-fallback`: a large Zipfian corpus has no 1-gram seen only once or twice
(every word recurs), so modified Kneser-Ney cannot estimate those discounts, as with lmplz.
`--memory` is passed to train-ngram (counting in sorted runs on disk past it); `--arpa-only`
stops after the ARPA, so the figures are the trainer's alone (no engine build, no binary).

Records per corpus: seconds; peak RSS of the whole command and of the trainer up to its ARPA
(the command's own `peak_rss_mb` after writing it, before the serving engine is built from it);
each beside the n-grams, the ARPA's and the binary's sizes and as bytes per n-gram.
"""

from __future__ import annotations

import argparse
import multiprocessing
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
from bench_ngram_scale import run_guarded
from common import CACHE_DIR, emit, log, record
from synthetic_arpa import Spec, corpus, parse_count, word_bytes

SCALE_DIR = CACHE_DIR / "scale"


def corpus_file(words: int, order: int, vocab: int, seed: int) -> Path:
    """The cached text corpus of about `words` words, generated once in a child process: a
    process's peak RSS (ru_maxrss, wait4) starts from its parent's RSS at the fork, so the
    trainer must be forked by a process that never held a generated corpus."""
    path = SCALE_DIR / f"corpus-v{vocab}-s{seed}-{words}.txt"
    if not path.exists():
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            pool.apply(_write_corpus, (path, words, order, vocab, seed))
    return path


def _write_corpus(path: Path, words: int, order: int, vocab: int, seed: int) -> None:
    SCALE_DIR.mkdir(parents=True, exist_ok=True)
    tokens, starts = corpus(
        Spec(ngrams=max(words, 100), order=order, vocab=vocab, seed=seed), words
    )
    _, names = word_bytes(vocab)
    text = np.array(names, dtype=object)
    ends = np.append(starts[1:], len(tokens))
    tmp = path.with_suffix(".partial")
    with tmp.open("w", encoding="utf-8") as out:
        for lo, hi in zip(starts.tolist(), ends.tolist(), strict=True):
            out.write(" ".join(text[tokens[lo + 1 : hi - 1]]) + "\n")  # without <s> and </s>
    tmp.rename(path)


def sizes(summary: dict[str, Any], out: Path, peak_mb: float) -> dict[str, Any]:
    """The model's n-grams and files beside the peaks, as bytes per n-gram and over the binary."""
    ngrams = sum(summary["ngrams"])
    arpa = Path(summary["arpa"])
    trainer_mb = summary["peak_rss_mb"]["write_arpa"]  # the peak so far, once the ARPA is out
    found: dict[str, Any] = {
        "ngrams": ngrams,
        "ngrams_per_order": summary["ngrams"],
        "arpa": arpa.name,
        "arpa_mb": round(arpa.stat().st_size / 2**20, 1),
        "trainer_peak_rss_mb": trainer_mb,
        "peak_bytes_per_ngram": round(peak_mb * 2**20 / ngrams, 1),
        "trainer_peak_bytes_per_ngram": round(trainer_mb * 2**20 / ngrams, 1),
        "timings": summary["timings"],
        "peak_rss_mb_by_phase": summary["peak_rss_mb"],
    }
    binary = out / "model.lmbin"
    if binary.exists():
        binary_mb = binary.stat().st_size / 2**20
        found |= {
            "binary_mb": round(binary_mb, 1),
            "binary_bytes_per_ngram": round(binary.stat().st_size / ngrams, 1),
            "peak_over_binary": round(peak_mb / binary_mb, 2),
            "trainer_peak_over_binary": round(trainer_mb / binary_mb, 2),
        }
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--words", nargs="+", default=["10M"])
    parser.add_argument("--order", type=int, default=5)
    parser.add_argument("--vocab", type=int, default=60000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-rss-gb", type=float, default=20.0)
    parser.add_argument("--memory", help="train-ngram --memory (default: its own, 80%% of RAM)")
    parser.add_argument("--arpa-only", action="store_true", help="the trainer alone: no binary")
    args = parser.parse_args(argv)
    for size in args.words:
        words = parse_count(size)
        log(f"corpus of {words:,} words")
        text = corpus_file(words, args.order, args.vocab, args.seed)
        out = SCALE_DIR / f"trained-{size}"
        shutil.rmtree(out, ignore_errors=True)  # no binary left from an earlier, full run
        command = [sys.executable, "-m", "lmserve.server.cli", "train-ngram", "--order"]
        command += [str(args.order), "--smoothing", "modified-kneser-ney", "--discount-fallback"]
        command += ["--memory", args.memory] if args.memory else []
        command += ["--arpa-only"] if args.arpa_only else []
        command += [str(text), str(out)]
        result = run_guarded(command, args.max_rss_gb * 1024, f"train-ngram {size}")
        extra = {"words": words, "order": args.order, "memory": args.memory,
                 "arpa_only": args.arpa_only, "killed_for_rss": result.killed_for_rss}  # fmt: skip
        if result.returncode == 0 and result.output is not None:
            extra |= sizes(result.output, out, result.peak_rss_mb)
        else:
            extra |= {"returncode": result.returncode, "stderr": result.stderr_tail[-300:]}
        emit(record(f"train_scale_{size}_seconds", "s", [result.seconds], **extra))
        emit(record(f"train_scale_{size}_peak_rss_mb", "MB", [result.peak_rss_mb], **extra))
        if "trainer_peak_rss_mb" in extra:
            emit(record(f"train_scale_{size}_trainer_peak_rss_mb", "MB",
                        [extra["trainer_peak_rss_mb"]], **extra))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
