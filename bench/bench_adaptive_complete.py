"""Adaptive autocomplete through a real server: keystroke savings typing whole documents in
order, with and without the session cache, and keystroke latency at 32 sessions with it.

    python bench/bench_adaptive_complete.py [--split test] [--documents 8] [--verses 40]
        [--weights 0,0.1,0.2,0.3] [--models kjv-5gram,kjv-lstm] [--heldout-blocks]
        [--sessions 32] [--keys 40] [--runs 3] [--skip-latency]

Documents: the KJV split's verses in canonical order (the split takes every 20th verse of the
Bible, so consecutive lines are the held-out verses of one book, in order), cut into documents
of `--verses` verses. No whole chapter is held out from the shipped models' training text (the
split is interleaved), so this is the held-out text that reads most like a document. Each
document is one session: its verses typed letter by letter with k=3 (a word taken with one tap
as soon as it is offered, `lmserve.client.savings`), a `reset` after each verse, so the cache
holds the document so far. `--weights` are the sessions' cache weights (0: the base model
alone); savings and the gain over weight 0 are printed per model and weight. Tune on
`--split valid`, report on `test`.

Latency: `--sessions` users at once, each first typing `--history` verses of its document
(not timed), then `--keys` keystrokes of the next verse timed, a key every 100 ms; p50 and p99
per run, medians of `--runs` runs, with the cache (the first non-zero weight) and without (0)
on the same sessions' text.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_complete import SessionSuggest
from common import DEFAULT_MODELS, REPO_ROOT, emit, log, percentile, read_lines, record
from server_process import ServerProcess

CORPUS = REPO_ROOT / "export" / "lmserve" / "export" / "corpora" / "kjv"


def bible() -> list[str]:
    """Every verse in canonical order, put back together from the three splits (verse i is
    in valid when i % 20 == 18, in test when i % 20 == 19, else in train)."""
    parts = {name: iter(read_lines(CORPUS / f"{name}.txt")) for name in ("train", "valid", "test")}
    verses = []
    for i in range(sum(1 for _ in read_lines(CORPUS / "train.txt")) * 2):
        name = {18: "valid", 19: "test"}.get(i % 20, "train")
        verse = next(parts[name], None)
        if verse is None:
            break
        verses.append(verse)
    return verses


def heldout_blocks(count: int, verses: int) -> tuple[list[list[str]], list[list[str]], list[str]]:
    """`count` dev and `count` test blocks of `verses` consecutive verses, alternating and
    spread over the Bible (chapter-sized documents), and every other verse: the text a model
    that never saw the blocks trains on. Tune on dev, report on test."""
    text = bible()
    step = len(text) // (2 * count)
    starts = [i * step + step // 2 for i in range(2 * count)]
    blocks = [text[start : start + verses] for start in starts]
    held = {i for start in starts for i in range(start, start + verses)}
    rest = [verse for i, verse in enumerate(text) if i not in held]
    return blocks[0::2], blocks[1::2], rest


def train_heldout_model(lines: list[str], repository: Path) -> str:
    """A 5-gram like the shipped kjv-5gram (same command) on `lines`; its name."""
    name = "kjv-5gram-heldout"
    corpus = repository / "train.txt"
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    command = [sys.executable, "-m", "lmserve.server.cli", "train-ngram", "--order", "5"]
    command += ["--smoothing", "modified-kneser-ney", "--name", name, "--lowercase"]
    command += ["--token-pattern", "[a-z]+(?:'[a-z]+)*", str(corpus), str(repository / name)]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    corpus.unlink()
    return name


def documents(split: str, count: int, verses: int) -> list[list[str]]:
    lines = [line for line in read_lines(CORPUS / f"{split}.txt") if line.strip()]
    step = max(1, len(lines) // count // verses) * verses  # spread over the whole Bible
    return [lines[i : i + verses] for i in range(0, len(lines), step)][:count]


def savings(target: str, model: str, docs: list[list[str]], weight: float, k: int) -> None:
    from lmserve.client import LmServeClient
    from lmserve.client.savings import keystroke_savings

    started = time.perf_counter()
    with LmServeClient(target) as client:
        per_doc = []
        for doc in docs:  # one session a document (SessionSuggest resets between verses)
            with client.complete(model, k=k, cache_weight=weight) as session:
                per_doc.append(keystroke_savings(doc, SessionSuggest(session), k))
    seconds = time.perf_counter() - started
    keys = sum(s.keys for s in per_doc)
    characters = sum(s.characters for s in per_doc)
    words = sum(s.words for s in per_doc)
    accepted = sum(s.accepted for s in per_doc)
    emit(
        record(
            f"adaptive_savings_{model}_w{weight:g}",
            "fraction",
            [1.0 - keys / characters],
            model=model,
            cache_weight=weight,
            documents=len(docs),
            verses=sum(map(len, docs)),
            characters=characters,
            keys=keys,
            words=words,
            accepted_words=accepted,
            seconds=round(seconds, 1),
        )
    )


async def _typist(
    client: Any,
    model: str,
    doc: list[str],
    weight: float,
    keys: int,
    out: list[float],
    ready: asyncio.Barrier,
) -> None:
    async with client.complete(model, k=3, cache_weight=weight) as session:
        for verse in doc[:-1]:  # the document so far (not timed)
            await session.type(verse + " ")
            await session.reset()
        await ready.wait()  # every user has its document before any key is timed
        await asyncio.sleep(random.uniform(0, 0.1))  # users do not type in step
        due = time.perf_counter()
        for ch in doc[-1][:keys]:
            begun = time.perf_counter()
            await session.type(ch)
            out.append(time.perf_counter() - begun)
            due += 0.1
            await asyncio.sleep(max(0.0, due - time.perf_counter()))


async def _latency_run(
    target: str, model: str, docs: list[list[str]], weight: float, keys: int
) -> list[float]:
    from lmserve.client import AsyncLmServeClient

    out: list[float] = []
    ready = asyncio.Barrier(len(docs))
    async with AsyncLmServeClient(target) as client:
        await asyncio.gather(*(_typist(client, model, d, weight, keys, out, ready) for d in docs))
    return out


def latency(
    target: str, model: str, docs: list[list[str]], weights: list[float], keys: int, runs: int
) -> None:
    for weight in weights:
        p50s, p99s = [], []
        for run in range(runs + 1):  # the first is a warm-up
            rtts = asyncio.run(_latency_run(target, model, docs, weight, keys))
            if run:
                p50s.append(percentile(rtts, 50) * 1e3)
                p99s.append(percentile(rtts, 99) * 1e3)
        extra = {"model": model, "sessions": len(docs), "cache_weight": weight, "keys": keys}
        name = f"adaptive_{len(docs)}sessions_{model}_w{weight:g}"
        emit(record(f"{name}_p50_ms", "ms", p50s, **extra))
        emit(record(f"{name}_p99_ms", "ms", p99s, **extra))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--split", choices=("test", "valid"), default="test")
    parser.add_argument(
        "--heldout-blocks",
        action="store_true",
        help="documents: --documents blocks of --verses consecutive verses (dev blocks with "
        "--split valid), typed on a 5-gram trained (as kjv-5gram) on every verse outside the "
        "dev and test blocks (savings only)",
    )
    parser.add_argument("--documents", type=int, default=8)
    parser.add_argument("--verses", type=int, default=40)
    parser.add_argument("--weights", default="0,0.05,0.1,0.2")
    parser.add_argument("--models", default="kjv-5gram,kjv-lstm")
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--sessions", type=int, default=32)
    parser.add_argument("--history", type=int, default=20, help="verses typed before timing")
    parser.add_argument("--keys", type=int, default=40)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--skip-savings", action="store_true")
    parser.add_argument("--skip-latency", action="store_true")
    args = parser.parse_args()
    weights = [float(w) for w in args.weights.split(",")]
    models = args.models.split(",")
    if args.heldout_blocks:
        dev, test, rest = heldout_blocks(args.documents, args.verses)
        blocks = dev if args.split == "valid" else test
        with tempfile.TemporaryDirectory() as tmp:
            log(f"training a 5-gram without {len(blocks)} blocks of {args.verses} verses")
            name = train_heldout_model(rest, Path(tmp))
            with ServerProcess(Path(tmp)) as server:
                for weight in weights:
                    log(f"savings: {name}, cache weight {weight}, {len(blocks)} held-out blocks")
                    savings(server.target, name, blocks, weight, args.k)
        return 0
    docs = documents(args.split, args.documents, args.verses)
    with ServerProcess(DEFAULT_MODELS) as server:
        if not args.skip_savings:
            for model in models:
                for weight in weights:
                    log(f"savings: {model}, cache weight {weight}, {len(docs)} documents")
                    savings(server.target, model, docs, weight, args.k)
        if not args.skip_latency:
            timed_docs = [
                doc[: args.history + 1]
                for doc in documents(args.split, args.sessions, args.history + 1)
            ]
            with_cache = [w for w in weights if w > 0][:1]
            for model in models:
                log(f"latency: {model}, {len(timed_docs)} sessions x {args.keys} keys")
                latency(server.target, model, timed_docs, [0.0, *with_cache], args.keys, args.runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
