"""N-best reranking: word error rates with each default model, and Rerank's speed against
scoring the same hypotheses one by one.

    python bench/bench_rerank.py [--runs 3] [--model-dir models] [--batch-lists 16]

(a) WER on `tests/data/nbest/kjv-test.jsonl` (150 lists from KJV test sentences, made by
`bench/nbest/make_nbest.py --seed 1`): acoustic score alone, the oracle, and reranked with
kjv-5gram, kjv-lstm and kjv-lstm-5gram, each with lm_weight x length_bonus tuned on a dev set the
same generator makes from KJV valid sentences (one Rerank of dev per model, the grid recombined
locally, as `lmserve rerank-tune` does). (b) Speed on kjv-lstm: every hypothesis of the test set
through RerankStream (lists in batches) vs the same hypotheses through ScoreStream one text per
request, from one client in the same run, median of `--runs`; the log-probabilities must agree
within 1e-4, and Rerank's computed_tokens / request_tokens is reported. JSON records on stdout.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common import DEFAULT_MODELS, REPO_ROOT, emit, linked_repository, log, quick, record
from nbest.make_nbest import generate
from server_process import ServerProcess

from lmserve.server.manifest import read_manifest

if TYPE_CHECKING:
    from lmserve.client import LmServeClient, NBestList, RerankedList

TEST_SET = REPO_ROOT / "tests" / "data" / "nbest" / "kjv-test.jsonl"
MODELS = ("kjv-5gram", "kjv-lstm", "kjv-lstm-5gram")
LM_WEIGHTS = [0.0, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0]
LENGTH_BONUSES = [-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 3.0]


def wer(references: Sequence[str], hypotheses: Sequence[str]) -> float:
    import jiwer

    return float(jiwer.wer(list(references), list(hypotheses)))


def load_sets() -> tuple[list[NBestList], list[NBestList]]:
    from lmserve.client import NBestList
    from lmserve.client.nbest import read_jsonl

    with TEST_SET.open(encoding="utf-8") as stream:
        test = list(read_jsonl(stream, str(TEST_SET)))
    dev = [NBestList.from_dict(r) for r in generate("valid", 150, 1)]
    return test, dev


def batched(lists: Sequence[NBestList], size: int) -> list[list[NBestList]]:
    return [list(lists[i : i + size]) for i in range(0, len(lists), size)]


def rerank_all(
    client: LmServeClient, model: str, lists: Sequence[NBestList], size: int, **weights: Any
) -> list[RerankedList]:
    return [
        r for answer in client.rerank_stream(model, batched(lists, size), **weights) for r in answer
    ]


def baselines(test: Sequence[NBestList]) -> None:
    from make_nbest_summary import acoustic_and_oracle

    acoustic, oracle = acoustic_and_oracle(test)
    refs = [nb.reference or "" for nb in test]
    emit(record("rerank_wer_acoustic_only", "WER", [wer(refs, acoustic)], lists=len(test)))
    emit(record("rerank_wer_oracle", "WER", [wer(refs, oracle)], lists=len(test)))


def wer_for_model(
    client: LmServeClient,
    model: str,
    test: Sequence[NBestList],
    dev: Sequence[NBestList],
    size: int,
) -> None:
    from lmserve.client.reranking import best_point, grid_search

    dev_base = rerank_all(client, model, dev, size)
    points = grid_search(dev, dev_base, LM_WEIGHTS, LENGTH_BONUSES, wer)
    best = best_point(points)
    reranked = rerank_all(
        client, model, test, size, lm_weight=best.lm_weight, length_bonus=best.length_bonus
    )
    refs = [nb.reference or "" for nb in test]
    hyps = [nb.hypotheses[r.best.index].display() for nb, r in zip(test, reranked, strict=True)]
    emit(
        record(
            f"rerank_wer_{model}",
            "WER",
            [wer(refs, hyps)],
            lm_weight=best.lm_weight,
            length_bonus=best.length_bonus,
            dev_wer=best.wer,
            lists=len(test),
        )
    )


def speed(client: LmServeClient, test: Sequence[NBestList], runs: int, size: int) -> None:
    model = "kjv-lstm"
    texts = [h.display() for nb in test for h in nb.hypotheses]
    rerank_s, score_s = [], []
    reranked: list[RerankedList] = []
    scores: list[Any] = []
    for run in range(runs + 1):  # the first of each is a warm-up
        start = time.perf_counter()
        answers = list(client.rerank_stream(model, batched(test, size)))
        seconds = time.perf_counter() - start
        reranked = [r for a in answers for r in a]
        start = time.perf_counter()
        scores = [s for batch in client.score_stream(model, ([t] for t in texts)) for s in batch]
        score_seconds = time.perf_counter() - start
        if run:
            rerank_s.append(seconds)
            score_s.append(score_seconds)
        log(f"  run {run}: rerank {seconds:.3f} s, one-by-one score {score_seconds:.3f} s")
    flat = [
        {h.index: h for h in r.hypotheses}[i].lm_log_prob
        for nb, r in zip(test, reranked, strict=True)
        for i in range(len(nb.hypotheses))
    ]
    diff = max(abs(a - s.log_prob) for a, s in zip(flat, scores, strict=True))
    request_tokens = sum(a.request_tokens for a in answers)
    computed_tokens = sum(a.computed_tokens for a in answers)
    common = {"model": model, "hypotheses": len(texts), "lists": len(test), "batch_lists": size}
    emit(record("rerank_lstm_seconds", "s", rerank_s, **common))
    emit(record("score_stream_one_by_one_lstm_seconds", "s", score_s, **common))
    emit(
        record(
            "rerank_speedup_vs_one_by_one",
            "x",
            [s / r for s, r in zip(score_s, rerank_s, strict=True)],
            median_ratio=statistics.median(score_s) / statistics.median(rerank_s),
            max_abs_log_prob_diff=diff,
            log_probs_equal=diff <= 1e-4,
            request_tokens=request_tokens,
            computed_tokens=computed_tokens,
            computed_over_request=computed_tokens / max(request_tokens, 1),
            **common,
        )
    )
    if diff > 1e-4:
        log(f"  log-probabilities differ by up to {diff:.3g} nats (> 1e-4)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODELS)
    parser.add_argument("--batch-lists", type=int, default=16)
    parser.add_argument(
        "--with-model",
        type=Path,
        action="append",
        default=[],
        help="another model folder to measure beside the defaults (e.g. a transformer)",
    )
    args = parser.parse_args()
    runs = max(3, args.runs)
    from lmserve.client import LmServeClient, LmServeClientError

    test, dev = load_sets()
    if quick():
        test, dev = test[:50], dev[:50]
    log(f"{len(test)} test lists, {len(dev)} dev lists")
    baselines(test)
    for name in MODELS:
        if not (args.model_dir / name / "model.yaml").exists():
            raise SystemExit(f"{args.model_dir / name} is missing: run `make models` first")
    models = (*MODELS, *(read_manifest(folder).name for folder in args.with_model))
    repository = args.model_dir
    if args.with_model:
        defaults = [args.model_dir / name for name in MODELS]
        repository = linked_repository("rerank-repo", *defaults, *args.with_model)
    with ServerProcess(repository) as server, LmServeClient(server.target, timeout=600) as c:
        try:
            for model in models:
                log(f"WER with {model}")
                wer_for_model(c, model, test, dev, args.batch_lists)
            log("speed on kjv-lstm")
            speed(c, test, runs, args.batch_lists)
        except LmServeClientError as exc:
            log(f"bench_rerank: the server refused Rerank: {exc}")
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
