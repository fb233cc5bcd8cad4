"""The n-gram trainer at scale (issue #22, item 4): `lmserve train-ngram` on synthetic corpora of
10M and more words, its time and peak memory beside the size of the model it writes.

    python bench/bench_train_scale.py [--words 10M ...] [--order 5] [--max-rss-gb 20]

The corpora are `synthetic_arpa.corpus` (Zipfian words with repeated phrases, sentences of about
20 words), written as text, one sentence a line, and cached in bench/results/cache/scale/. Each
training runs as its own process (`run_guarded`: peak RSS from wait4, killed and recorded past
the limit). `--discount-fallback`: a large Zipfian corpus has no 1-gram seen only once or twice
(every word recurs), so modified Kneser-Ney cannot estimate those discounts, as with lmplz.
Records: seconds, peak RSS, the binary's size, peak over binary.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from bench_ngram_scale import run_guarded
from common import CACHE_DIR, emit, log, record
from synthetic_arpa import Spec, corpus, parse_count, word_bytes

SCALE_DIR = CACHE_DIR / "scale"


def corpus_file(words: int, order: int, vocab: int, seed: int) -> Path:
    """The cached text corpus of about `words` words (generated once)."""
    path = SCALE_DIR / f"corpus-v{vocab}-s{seed}-{words}.txt"
    if path.exists():
        return path
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
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--words", nargs="+", default=["10M"])
    parser.add_argument("--order", type=int, default=5)
    parser.add_argument("--vocab", type=int, default=60000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-rss-gb", type=float, default=20.0)
    args = parser.parse_args(argv)
    for size in args.words:
        words = parse_count(size)
        log(f"corpus of {words:,} words")
        text = corpus_file(words, args.order, args.vocab, args.seed)
        out = SCALE_DIR / f"trained-{size}"
        command = [sys.executable, "-m", "lmserve.server.cli", "train-ngram", "--order"]
        command += [str(args.order), "--smoothing", "modified-kneser-ney", "--discount-fallback"]
        command += [str(text), str(out)]
        result = run_guarded(command, args.max_rss_gb * 1024, f"train-ngram {size}")
        extra = {"words": words, "order": args.order, "killed_for_rss": result.killed_for_rss}
        binary = out / "model.lmbin"
        if result.returncode == 0 and binary.exists():
            size_mb = binary.stat().st_size / 2**20
            extra |= {
                "binary_mb": round(size_mb, 1),
                "peak_over_binary": result.peak_rss_mb / size_mb,
            }
        else:
            extra |= {"returncode": result.returncode, "stderr": result.stderr_tail[-300:]}
        emit(record(f"train_scale_{size}_seconds", "s", [result.seconds], **extra))
        emit(record(f"train_scale_{size}_peak_rss_mb", "MB", [result.peak_rss_mb], **extra))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
