"""n-gram models at scale: lmserve's import, binary, load and scoring beside KenLM's Python
module, on synthetic ARPA models of 10M (and, by flag, 50M and 100M) n-grams (JSON Lines).

    python bench/bench_ngram_scale.py                       # 10M
    python bench/bench_ngram_scale.py --sizes 10M 50M 100M  # ARPAs cached in bench/results/cache/
    python bench/bench_ngram_scale.py --quantize            # and the 8-bit form (a third column)

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
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import synthetic_arpa  # noqa: E402
from common import CACHE_DIR, REPO_ROOT, count_words, emit, log, quick, record  # noqa: E402
from scale_children import ChildResult, run_guarded  # noqa: E402

CHILDREN = str(Path(__file__).resolve().with_name("scale_children.py"))

SCALE_CACHE = CACHE_DIR / "scale"
TEST_SENTENCES = 10_000
BATCH = 200
TOLERANCE_NATS = 1e-4
RUN_SECONDS = 0.5  # a warm run scores the sentences this long at least


def label(n: int) -> str:
    return f"{n / 1e6:g}M" if n >= 10**6 else f"{n / 1e3:g}k"


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
            [sys.executable, CHILDREN, "lmserve", str(folder), str(sentences)],
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
        [sys.executable, CHILDREN, "kenlm", str(arpa), str(sentences)], limit_mb, "kenlm"
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
    if args.quantize:
        exact_totals = o["totals"] if o is not None else None
        measure_quantized(arpa, sentences, ngrams, words, exact_totals, k, args, limit_mb, table)


def measure_quantized(
    arpa: Path,
    sentences: Path,
    ngrams: int,
    words: int,
    exact_totals: list[float] | None,
    ken: dict[str, Any] | None,
    args: argparse.Namespace,
    limit_mb: float,
    table: dict[str, dict[str, str]],
) -> None:
    """`import-arpa --quantize` (8-bit values): import, size, scoring, and its scores beside the
    exact model's, against the error bound its manifest states."""
    import yaml

    lab = label(args.current_size)
    prefix = f"scale_{lab}_q8"
    col: dict[str, str] = {}
    table[f"{lab} lmserve q8"] = col
    folder = arpa.with_name(arpa.name.removesuffix(".arpa") + ".lmserve-q8")
    if folder.exists():
        shutil.rmtree(folder)
    log(f"[{lab}] lmserve import-arpa --quantize ...")
    command = [*lmserve_command(), "import-arpa", "--quantize", str(arpa), str(folder)]
    imp = run_guarded(command, limit_mb, "import-arpa --quantize")
    ok = imp.returncode == 0 and (folder / "model.yaml").exists()
    emit(
        record(
            f"{prefix}_import_seconds",
            "s",
            [imp.seconds],
            ok=ok,
            peak_rss_mb=round(imp.peak_rss_mb, 1),
            ngrams_per_s=round(ngrams / imp.seconds),
        )
    )
    col["import / ARPA load, s"] = f"{imp.seconds:.1f}" + ("" if ok else " (failed)")
    col["peak RSS, MB"] = f"{imp.peak_rss_mb:,.0f}"
    if not ok:
        return
    size = (folder / "model.lmbin").stat().st_size
    storage = yaml.safe_load((folder / "model.yaml").read_text())["ngram"]["storage"]
    emit(
        record(
            f"{prefix}_binary_bytes_per_ngram",
            "bytes",
            [size / ngrams],
            binary_bytes=size,
            max_prob_error=storage["max_prob_error"],
            max_backoff_error=storage["max_backoff_error"],
            max_token_error=storage["max_token_error"],
        )
    )
    col["binary / in memory, bytes per n-gram"] = f"{size / ngrams:.1f} ({size / 1e6:,.0f} MB)"
    col["peak RSS, MB"] += f" ({imp.peak_rss_mb * 2**20 / size:.2f}x binary)"
    res = run_guarded(
        [sys.executable, CHILDREN, "lmserve", str(folder), str(sentences)], limit_mb, "q8 scoring"
    )
    o = res.output
    if o is not None:
        cold = words / o["cold_s"]
        warm = statistics.median(words / s for s in o["warm_s"])
        ratios: dict[str, Any] = {}
        if ken is not None:
            ratios["ratio_to_kenlm_cold"] = round(ken["cold_s"] / o["cold_s"], 3)
            ratios["ratio_to_kenlm_warm"] = round(
                warm / statistics.median(words / s for s in ken["warm_s"]), 3
            )
        emit(record(f"{prefix}_score_cold_words_per_s", "words/s", [cold], **ratios))
        emit(record(f"{prefix}_score_warm_words_per_s", "words/s", [warm]))
        emit(record(f"{prefix}_next_token_ms", "ms", o["next_ms"]))
        col["load (memory map), ms"] = f"{o['load_s'] * 1e3:.1f}"
        col["scoring warm, M words/s"] = f"{warm / 1e6:.2f}"
        col["scoring cold, M words/s"] = f"{cold / 1e6:.2f}"
        col["next-word distribution, ms"] = f"{statistics.median(o['next_ms']):.2f}"
        if exact_totals is not None:
            worst = max(abs(a - b) for a, b in zip(o["totals"], exact_totals, strict=True))
            emit(
                record(
                    f"{prefix}_max_abs_diff_vs_exact_nats",
                    "nats",
                    [worst],
                    sentences=len(exact_totals),
                    stated_max_token_error=storage["max_token_error"],
                )
            )
            col["max score diff, nats"] = (
                f"{worst:.3f} a sentence vs exact (<= {storage['max_token_error']:.3f} a token)"
            )
    if not args.keep_models:
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
    parser.add_argument(
        "--quantize", action="store_true", help="also measure `import-arpa --quantize` (8-bit)"
    )
    args = parser.parse_args()
    os.environ["SCALE_CHECK_SENTENCES"] = str(args.check_sentences)
    os.environ["SCALE_RUNS"] = str(args.runs)
    table: dict[str, dict[str, str]] = {}
    for n in args.sizes:
        available_mb = psutil.virtual_memory().available / 2**20
        limit_mb = min(args.max_rss_gb * 1024, available_mb - 1024)
        log(f"[{label(n)}] RSS limit {limit_mb:,.0f} MB ({available_mb:,.0f} MB available)")
        args.current_size = n
        measure_size(n, args, limit_mb, table)
    log(f"\nlmserve at {git_state()}, this machine ({os.cpu_count()} cores):\n" + markdown(table))


if __name__ == "__main__":
    main()
