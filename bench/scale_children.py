"""The measured steps of `bench_ngram_scale.py` and `bench_train_scale.py`, each run as a fresh
child process so that its peak RSS is its own (JSON on stdout):

    python bench/scale_children.py lmserve MODEL_FOLDER SENTENCES   # load, score, distribution
    python bench/scale_children.py kenlm ARPA SENTENCES             # the same through KenLM

and `run_guarded`, which runs a command, polls its RSS, kills it past a limit and reports its
peak (`wait4`'s ru_maxrss).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import REPO_ROOT, log  # noqa: E402

BATCH = 200
RUN_SECONDS = 0.5  # a warm run scores the sentences this long at least


def _maxrss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


# -- children (fresh processes; each prints one JSON object on stdout) --------------------------


def child_lmserve(folder: Path, sentences: Path, check: int, runs: int) -> dict[str, Any]:
    """Load the folder as the registry does, then score cold, warm, and one distribution."""
    sys.path.insert(0, str(REPO_ROOT / "server"))
    import numpy as np

    from lmserve.server.backends.ngram.model import NgramModel
    from lmserve.server.families.loading import load_backend
    from lmserve.server.manifest import read_manifest, verify_files
    from lmserve.server.text.word import encode_token_lists

    lines = sentences.read_text(encoding="utf-8").splitlines()
    token_lists = [line.split() for line in lines]
    base_rss = _maxrss_mb()
    start = time.perf_counter()
    manifest = read_manifest(folder)
    model = load_backend(folder, manifest)
    load_s = time.perf_counter() - start
    assert isinstance(model, NgramModel)
    encoded = [
        encode_token_lists(token_lists[i : i + BATCH], model.vocab)
        for i in range(0, len(token_lists), BATCH)
    ]

    def score_all() -> None:
        for enc in encoded:
            model.score(enc)

    cold_s = _timed(score_all)
    passes, warm = _warm_runs(score_all, runs)
    check_batch = encode_token_lists(token_lists[:check], model.vocab)
    totals = model.score(check_batch).totals.tolist()

    # One full next-word distribution: after <s>, and after a few sentences' first words.
    contexts: list[list[int]] = [[]] + [
        encode_token_lists([t[:3]], model.vocab).ids.tolist() for t in token_lists[:3]
    ]
    start = time.perf_counter()
    model.next_token_log_probs(contexts[1])
    first_next_ms = (time.perf_counter() - start) * 1e3
    next_ms = []
    for _ in range(runs):
        start = time.perf_counter()
        for _ in range(5):
            for ctx in contexts:
                out = model.next_token_log_probs(ctx)
        next_ms.append((time.perf_counter() - start) * 1e3 / (5 * len(contexts)))
    assert np.isfinite(out).all()
    peak_before_verify = _maxrss_mb()
    verify_s = _timed(lambda: verify_files(folder, manifest))
    return {
        "load_s": load_s,
        "cold_s": cold_s,
        "warm_s": warm,
        "passes": passes,
        "next_ms": next_ms,
        "first_next_ms": first_next_ms,
        "vocab": len(model.vocab),
        "totals": totals,
        "verify_s": verify_s,
        "base_rss_mb": base_rss,
        "peak_rss_mb": peak_before_verify,
    }


def child_kenlm(arpa: Path, sentences: Path, check: int, runs: int) -> dict[str, Any]:
    import kenlm

    lines = sentences.read_text(encoding="utf-8").splitlines()
    base_rss = _maxrss_mb()
    start = time.perf_counter()
    model = kenlm.Model(str(arpa))
    load_s = time.perf_counter() - start
    load_rss = _maxrss_mb()

    def score_all() -> None:
        for line in lines:
            model.score(line, bos=True, eos=True)

    cold_s = _timed(score_all)
    passes, warm = _warm_runs(score_all, runs)
    # The reference: full_scores' per-word log10s summed in double (`score` sums in float32,
    # which alone moved totals by up to 1.2e-4 nats at 50M).
    ln10 = math.log(10)
    totals = [
        math.fsum(p for p, _, _ in model.full_scores(line, bos=True, eos=True)) * ln10
        for line in lines[:check]
    ]
    score_totals = [model.score(line, bos=True, eos=True) * ln10 for line in lines[:check]]
    # A full next-word distribution through the state API, over the ARPA's unigrams.
    words = []
    with arpa.open(encoding="utf-8") as f:
        for line in f:
            if line.startswith("\\1-grams:"):
                break
        for line in f:
            if not line.strip():
                break
            words.append(line.split("\t")[1].strip())
    state, out = kenlm.State(), kenlm.State()
    model.BeginSentenceWrite(state)
    next_ms = []
    for _ in range(max(1, runs // 2)):
        start = time.perf_counter()
        for w in words:
            model.BaseScore(state, w, out)
        next_ms.append((time.perf_counter() - start) * 1e3)
    return {
        "load_s": load_s,
        "cold_s": cold_s,
        "warm_s": warm,
        "passes": passes,
        "next_ms": next_ms,
        "vocab": len(words),
        "totals": totals,
        "score_totals": score_totals,
        "base_rss_mb": base_rss,
        "load_rss_mb": load_rss,
        "peak_rss_mb": _maxrss_mb(),
    }


def _timed(fn: Any) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _warm_runs(fn: Any, runs: int) -> tuple[int, list[float]]:
    """Seconds per pass of `runs` runs, each of enough passes to last RUN_SECONDS."""
    one = _timed(fn)  # warm-up, and the pass count
    passes = max(1, math.ceil(RUN_SECONDS / max(one, 1e-6)))
    seconds = []
    for _ in range(runs):
        start = time.perf_counter()
        for _ in range(passes):
            fn()
        seconds.append((time.perf_counter() - start) / passes)
    return passes, seconds


# -- the parent ---------------------------------------------------------------------------------


@dataclass
class ChildResult:
    returncode: int
    seconds: float
    peak_rss_mb: float
    killed_for_rss: bool
    output: dict[str, Any] | None
    stderr_tail: str


def run_guarded(cmd: list[str], limit_mb: float, what: str) -> ChildResult:
    """Runs `cmd`, polling its RSS (with its children's); kills it past `limit_mb`. Peak RSS is
    the child's `ru_maxrss` (wait4)."""
    import psutil

    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, cwd=REPO_ROOT)
        killed = False
        polled = 0.0
        ps = psutil.Process(proc.pid)
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            try:
                rss = ps.memory_info().rss + sum(
                    c.memory_info().rss for c in ps.children(recursive=True)
                )
            except psutil.Error:
                rss = 0
            polled = max(polled, rss / 2**20)
            if polled > limit_mb and not killed:
                log(f"  {what}: RSS {polled:,.0f} MB passed the {limit_mb:,.0f} MB limit: killed")
                for c in ps.children(recursive=True):
                    c.kill()
                proc.kill()
                killed = True
            time.sleep(0.02)
        seconds = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout = out.read().decode("utf-8", "replace")
        stderr = err.read().decode("utf-8", "replace")
    output = None
    if proc.returncode == 0 and stdout.strip().startswith("{"):
        try:  # one JSON object, on its own or as the last line
            output = json.loads(stdout)
        except json.JSONDecodeError:
            output = json.loads(stdout.strip().splitlines()[-1])
    elif proc.returncode != 0 and not killed:
        log(f"  {what} failed ({proc.returncode}): {stderr[-2000:]}")
    return ChildResult(
        proc.returncode,
        seconds,
        max(usage.ru_maxrss / 1024.0, polled),
        killed,
        output,
        stderr[-2000:],
    )


def main() -> None:
    which, path, sentences = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    check = int(os.environ.get("SCALE_CHECK_SENTENCES", "200"))
    runs = int(os.environ.get("SCALE_RUNS", "5"))
    fn = {"lmserve": child_lmserve, "kenlm": child_kenlm}[which]
    print(json.dumps(fn(path, sentences, check, runs)))


if __name__ == "__main__":
    main()
