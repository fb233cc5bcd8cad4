"""n-gram models at scale: lmserve's import, binary, load and scoring beside KenLM's Python
module, on synthetic ARPA models of 10M (and, by flag, 50M and 100M) n-grams (JSON Lines).

    python bench/bench_ngram_scale.py                       # 10M
    python bench/bench_ngram_scale.py --sizes 10M 50M 100M  # ARPAs cached in bench/results/cache/

For each size the ARPA comes from `synthetic_arpa.py` (5-gram, 60k words, seed 1; generated once
and cached with its 10,000 test sentences: half from the generator's corpus, half fresh Zipf draws,
~2% OOV words). Then every step runs in a fresh child process, so its peak RSS (the child's
`ru_maxrss`, from `wait4`) is that step's alone:

- `lmserve import-arpa` (the command itself): wall time and peak RSS; the binary's size;
- lmserve load: `read_manifest` + `load_backend` on the folder, as the server's registry loads
  it (a memory map; the manifest's sha256 check, which the registry also runs, is timed apart);
  then scoring with the batched scorer (`NgramModel.score` on pre-encoded batches of 200, as
  bench_ngram_engine.py): **cold** is the first pass over the sentences right after the load
  (the binary's pages are first touched then: page-cache hits, not disk reads, since the file
  was just written), **warm** the passes after it; one full next-word distribution
  (`next_token_log_probs`);
- KenLM: `kenlm.Model(arpa)` (probing, the default): load time and peak RSS; `Model.score` over
  the same sentences, cold (first pass) and warm; a full next-word distribution through its state
  API (`BaseScore` per word);
- scores: the first `--check-sentences` (200) sentences' totals, lmserve's (nats) against KenLM's
  log10 x ln 10 (max |difference|, equal within 1e-4 nats).

A child whose RSS (polled every 20 ms) passes `--max-rss-gb` (20, or what the machine has free
less 1 GB, whichever is less) is killed and recorded as such (`killed_for_rss`), and the steps
that need its output are skipped with the reason. Progress goes to stderr, one record per figure
to stdout, and a markdown table of everything to stderr at the end.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import synthetic_arpa  # noqa: E402
from common import CACHE_DIR, REPO_ROOT, count_words, emit, log, quick, record  # noqa: E402

SCALE_CACHE = CACHE_DIR / "scale"
TEST_SENTENCES = 10_000
BATCH = 200
TOLERANCE_NATS = 1e-4
RUN_SECONDS = 0.5  # a warm run scores the sentences this long at least


def label(n: int) -> str:
    return f"{n / 1e6:g}M" if n >= 10**6 else f"{n / 1e3:g}k"


def _maxrss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


# -- children (fresh processes; each prints one JSON object on stdout) --------------------------


def child_lmserve(folder: Path, sentences: Path, check: int, runs: int) -> dict[str, Any]:
    """Load the folder as the registry does, then score cold, warm, and one distribution."""
    sys.path.insert(0, str(REPO_ROOT / "server"))
    import numpy as np

    from lmserve.server.backends.ngram import NgramModel
    from lmserve.server.manifest import read_manifest, verify_files
    from lmserve.server.registry.loaders import load_backend
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


def arpa_path(n: int, order: int, vocab: int, seed: int) -> Path:
    return SCALE_CACHE / f"synthetic-o{order}-v{vocab}-s{seed}-{label(n)}.arpa"


def ensure_arpa(
    n: int, args: argparse.Namespace, limit_mb: float
) -> tuple[Path, dict[str, Any] | None, ChildResult | None]:
    arpa = arpa_path(n, args.order, args.vocab, args.seed)
    stats_path = arpa.with_name(arpa.name + ".json")
    sentences = arpa.with_name(arpa.name + ".sentences.txt")
    if arpa.exists() and stats_path.exists() and sentences.exists():
        stats = json.loads(stats_path.read_text())
        if stats.get("version") == synthetic_arpa.VERSION:
            log(f"[{label(n)}] cached {arpa}")
            return arpa, stats, None
    log(f"[{label(n)}] generating {arpa} ...")
    SCALE_CACHE.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        str(Path(__file__).resolve().parent / "synthetic_arpa.py"),
        "--ngrams",
        str(n),
        "--order",
        str(args.order),
        "--vocab",
        str(args.vocab),
        "--seed",
        str(args.seed),
        "--sentences",
        str(TEST_SENTENCES),
        "--stats-json",
        str(stats_path),
        str(arpa),
    ]
    res = run_guarded(cmd, limit_mb, "generator")
    if res.returncode != 0:
        return arpa, None, res
    stats = json.loads(stats_path.read_text())
    stats["generator_peak_rss_mb"] = round(res.peak_rss_mb, 1)
    stats_path.write_text(json.dumps(stats) + "\n")
    return arpa, stats, res


def lmserve_command() -> list[str]:
    beside = Path(sys.executable).with_name("lmserve")
    if beside.exists():
        return [str(beside)]
    found = shutil.which("lmserve")
    if found is None:
        raise SystemExit("the `lmserve` command is not installed")
    return [found]


def git_state() -> str:
    """The commit, and whether server/ differs from it: the import code that ran."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "server"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return "unknown"
    return commit + (" (server/ modified)" if dirty else "")


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def measure_size(
    n: int, args: argparse.Namespace, limit_mb: float, table: dict[str, dict[str, str]]
) -> None:
    lab = label(n)
    col_ours, col_ken = f"{lab} lmserve", f"{lab} KenLM"
    ours: dict[str, str] = {}
    ken: dict[str, str] = {}
    table[col_ours], table[col_ken] = ours, ken
    prefix = f"scale_{lab}"
    limit = {"rss_limit_mb": round(limit_mb)}

    arpa, stats, gen = ensure_arpa(n, args, limit_mb)
    if stats is None:
        assert gen is not None
        why = "killed for RSS" if gen.killed_for_rss else f"exit {gen.returncode}"
        emit(
            record(
                f"{prefix}_generate_seconds",
                "s",
                [gen.seconds],
                ok=False,
                killed_for_rss=gen.killed_for_rss,
                peak_rss_mb=round(gen.peak_rss_mb),
                **limit,
            )
        )
        ours["n-grams (ARPA)"] = ken["n-grams (ARPA)"] = f"generator failed ({why})"
        return
    ngrams = int(stats["ngrams"])
    emit(
        record(
            f"{prefix}_generate_seconds",
            "s",
            [stats["seconds"]],
            cached=gen is None,
            ngrams=ngrams,
            counts=stats["counts"],
            arpa_bytes=stats["arpa_bytes"],
            corpus_words=stats["corpus_words"],
            ngrams_per_s=round(ngrams / stats["seconds"]),
            peak_rss_mb=stats.get("generator_peak_rss_mb"),
        )
    )
    sentences = arpa.with_name(arpa.name + ".sentences.txt")
    lines = sentences.read_text(encoding="utf-8").splitlines()
    words = count_words(lines)
    check_lines = lines[: args.check_sentences]
    oov_words = sum(w.startswith("oov") for line in check_lines for w in line.split())
    ours["n-grams (ARPA)"] = ken["n-grams (ARPA)"] = (
        f"{ngrams / 1e6:.2f}M ({stats['arpa_bytes'] / 1e6:,.0f} MB)"
    )

    # lmserve import-arpa, fresh folder.
    folder = arpa.with_name(arpa.name.removesuffix(".arpa") + ".lmserve")
    if folder.exists():
        shutil.rmtree(folder)
    log(f"[{lab}] lmserve import-arpa ...")
    imp = run_guarded(
        [*lmserve_command(), "import-arpa", str(arpa), str(folder)], limit_mb, "import-arpa"
    )
    imported = imp.returncode == 0 and (folder / "model.yaml").exists()
    for staging in folder.parent.glob(f".{folder.name}.importing-*"):  # left by a killed import
        shutil.rmtree(staging, ignore_errors=True)
    emit(
        record(
            f"{prefix}_lmserve_import_seconds",
            "s",
            [imp.seconds],
            ok=imported,
            killed_for_rss=imp.killed_for_rss,
            returncode=imp.returncode,
            peak_rss_mb=round(imp.peak_rss_mb, 1),
            ngrams_per_s=round(ngrams / imp.seconds),
            git=git_state(),
            **limit,
        )
    )
    emit(
        record(
            f"{prefix}_lmserve_import_peak_rss_mb",
            "MB",
            [imp.peak_rss_mb],
            killed_for_rss=imp.killed_for_rss,
            **limit,
        )
    )
    if imp.killed_for_rss:
        ours["import / ARPA load, s"] = f"killed at {imp.seconds:.0f} s"
        ours["peak RSS, MB"] = f"> {limit_mb:,.0f} (killed)"
    else:
        ours["import / ARPA load, s"] = f"{imp.seconds:.1f}" + ("" if imported else " (failed)")
        ours["peak RSS, MB"] = f"{imp.peak_rss_mb:,.0f}"

    o: dict[str, Any] | None = None
    if imported:
        binary = folder / "model.lmbin"
        size = binary.stat().st_size
        emit(
            record(
                f"{prefix}_lmserve_binary_bytes",
                "bytes",
                [size],
                bytes_per_ngram=round(size / ngrams, 2),
                folder_bytes=folder_bytes(folder),
            )
        )
        emit(record(f"{prefix}_lmserve_binary_bytes_per_ngram", "bytes", [size / ngrams]))
        ours["binary / in memory, bytes per n-gram"] = f"{size / ngrams:.1f} ({size / 1e6:,.0f} MB)"
        if not imp.killed_for_rss:
            ours["peak RSS, MB"] += f" ({imp.peak_rss_mb * 2**20 / size:.2f}x binary)"
        log(f"[{lab}] lmserve load and score ...")
        res = run_guarded(
            [sys.executable, __file__, "lmserve", str(folder), str(sentences)],
            limit_mb,
            "lmserve scoring",
        )
        o = res.output
        if o is None:
            ours["load (memory map), ms"] = "failed" + (" (RSS)" if res.killed_for_rss else "")
    else:
        ours["binary / in memory, bytes per n-gram"] = "no binary"

    log(f"[{lab}] KenLM load and score ...")
    kres = run_guarded(
        [sys.executable, __file__, "kenlm", str(arpa), str(sentences)], limit_mb, "kenlm"
    )
    k = kres.output
    if k is not None:
        emit(
            record(
                f"{prefix}_kenlm_load_seconds",
                "s",
                [k["load_s"]],
                ngrams_per_s=round(ngrams / k["load_s"]),
                load_rss_mb=round(k["load_rss_mb"], 1),
                base_rss_mb=round(k["base_rss_mb"], 1),
            )
        )
        emit(
            record(
                f"{prefix}_kenlm_load_peak_rss_mb",
                "MB",
                [kres.peak_rss_mb],
                base_rss_mb=round(k["base_rss_mb"], 1),
                bytes_per_ngram=round((k["load_rss_mb"] - k["base_rss_mb"]) * 2**20 / ngrams, 1),
            )
        )
        ken["import / ARPA load, s"] = f"{k['load_s']:.1f}"
        ken["peak RSS, MB"] = f"{kres.peak_rss_mb:,.0f}"
        ken["binary / in memory, bytes per n-gram"] = (
            f"{(k['load_rss_mb'] - k['base_rss_mb']) * 2**20 / ngrams:.1f} (RSS added by the load)"
        )
    else:
        ken["import / ARPA load, s"] = "failed" + (" (RSS)" if kres.killed_for_rss else "")

    scoring = {"words": words, "sentences": len(lines), "batch": BATCH}
    ken_warm = [words / s for s in k["warm_s"]] if k is not None else None
    if o is not None:
        emit(
            record(
                f"{prefix}_lmserve_load_seconds",
                "s",
                [o["load_s"]],
                how="read_manifest + load_backend (memory map)",
                verify_sha256_seconds=round(o["verify_s"], 3),
                process_peak_rss_mb=round(o["peak_rss_mb"], 1),
                base_rss_mb=round(o["base_rss_mb"], 1),
            )
        )
        ours["load (memory map), ms"] = f"{o['load_s'] * 1e3:.1f}"
        ours["load (memory map), ms"] += f" (+{o['verify_s']:.1f} s sha256)"
        cold = words / o["cold_s"]
        warm = [words / s for s in o["warm_s"]]
        extra: dict[str, Any] = {}
        if k is not None:
            extra["kenlm_words_per_s"] = words / k["cold_s"]
            extra["ratio_to_kenlm"] = round(k["cold_s"] / o["cold_s"], 3)
        emit(
            record(
                f"{prefix}_lmserve_score_cold_words_per_s", "words/s", [cold], **scoring, **extra
            )
        )
        extra = {}
        if ken_warm is not None:
            extra["kenlm_words_per_s"] = statistics.median(ken_warm)
            extra["ratio_to_kenlm"] = round(
                statistics.median(warm) / statistics.median(ken_warm), 3
            )
        emit(
            record(
                f"{prefix}_lmserve_score_warm_words_per_s",
                "words/s",
                warm,
                passes_per_run=o["passes"],
                **scoring,
                **extra,
            )
        )
        emit(
            record(
                f"{prefix}_lmserve_next_token_ms",
                "ms",
                o["next_ms"],
                vocab=o["vocab"],
                first_call_ms=round(o["first_next_ms"], 3),
            )
        )
        ours["scoring warm, M words/s"] = f"{statistics.median(warm) / 1e6:.2f}"
        ours["scoring cold, M words/s"] = f"{cold / 1e6:.2f}"
        ours["next-word distribution, ms"] = f"{statistics.median(o['next_ms']):.2f}"
    if k is not None:
        kc = words / k["cold_s"]
        emit(record(f"{prefix}_kenlm_score_cold_words_per_s", "words/s", [kc], **scoring))
        assert ken_warm is not None
        emit(
            record(
                f"{prefix}_kenlm_score_warm_words_per_s",
                "words/s",
                ken_warm,
                passes_per_run=k["passes"],
                **scoring,
            )
        )
        emit(record(f"{prefix}_kenlm_next_token_ms", "ms", k["next_ms"], vocab=k["vocab"]))
        ken["scoring warm, M words/s"] = f"{statistics.median(ken_warm) / 1e6:.2f}"
        ken["scoring cold, M words/s"] = f"{kc / 1e6:.2f}"
        ken["next-word distribution, ms"] = f"{statistics.median(k['next_ms']):.2f} (BaseScore)"
    if o is not None and k is not None:
        diffs = [abs(a - b) for a, b in zip(o["totals"], k["totals"], strict=True)]
        worst = max(diffs)
        float32_sums = max(abs(a - b) for a, b in zip(o["totals"], k["score_totals"], strict=True))
        emit(
            record(
                f"{prefix}_max_abs_diff_nats",
                "nats",
                [worst],
                sentences=len(diffs),
                oov_words=oov_words,
                equal=worst <= TOLERANCE_NATS,
                tolerance=TOLERANCE_NATS,
                reference="kenlm full_scores summed in double",
                vs_kenlm_score_float32_sum=float32_sums,
            )
        )
        verdict = "equal" if worst <= TOLERANCE_NATS else "NOT equal"
        ours["max score diff, nats"] = f"{worst:.1e} ({verdict}, {len(diffs)} sentences)"
    if not args.keep_models and folder.exists():
        shutil.rmtree(folder)


def markdown(table: dict[str, dict[str, str]]) -> str:
    rows: list[str] = []
    for col in table.values():
        rows += [r for r in col if r not in rows]
    cols = list(table)
    out = ["| | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for r in rows:
        out.append(f"| {r} | " + " | ".join(table[c].get(r, "") for c in cols) + " |")
    return "\n".join(out)


def main() -> None:
    parse_count = synthetic_arpa.parse_count
    if len(sys.argv) > 1 and sys.argv[1] in ("lmserve", "kenlm"):
        which, path, sentences = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
        check = int(os.environ.get("SCALE_CHECK_SENTENCES", "200"))
        runs = int(os.environ.get("SCALE_RUNS", "5"))
        fn = child_lmserve if which == "lmserve" else child_kenlm
        print(json.dumps(fn(path, sentences, check, runs)))
        return
    import psutil

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes", nargs="+", type=parse_count, default=[10**6 if quick() else 10**7]
    )
    parser.add_argument("--order", type=int, default=5)
    parser.add_argument("--vocab", type=int, default=60000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-rss-gb", type=float, default=20.0)
    parser.add_argument("--runs", type=int, default=3 if quick() else 5)
    parser.add_argument("--check-sentences", type=int, default=200)
    parser.add_argument(
        "--keep-models", action="store_true", help="keep the imported folders in the cache"
    )
    args = parser.parse_args()
    os.environ["SCALE_CHECK_SENTENCES"] = str(args.check_sentences)
    os.environ["SCALE_RUNS"] = str(args.runs)
    table: dict[str, dict[str, str]] = {}
    for n in args.sizes:
        available_mb = psutil.virtual_memory().available / 2**20
        limit_mb = min(args.max_rss_gb * 1024, available_mb - 1024)
        log(f"[{label(n)}] RSS limit {limit_mb:,.0f} MB ({available_mb:,.0f} MB available)")
        measure_size(n, args, limit_mb, table)
    log(f"\nlmserve at {git_state()}, this machine ({os.cpu_count()} cores):\n" + markdown(table))


if __name__ == "__main__":
    main()
