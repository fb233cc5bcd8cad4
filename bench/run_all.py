"""Runs every `bench/bench_*.py` and collects their JSON records into `bench/results/latest.json`.

    python bench/run_all.py [--quick] [--only SUBSTRING ...] [--timeout SECONDS]

Each script runs in its own process with this interpreter; a script that fails or times out is
reported with its exit code and the tail of its stderr, and the others still run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import BENCH_DIR, QUICK_ENV, REPO_ROOT, log

RESULTS = BENCH_DIR / "results"


def parse_records(stdout: str) -> list[dict[str, Any]]:
    """Records from a script's stdout: JSON lines, or one JSON array/object for the whole output."""
    text = stdout.strip()
    if not text:
        return []
    try:
        whole = json.loads(text)
    except json.JSONDecodeError:
        whole = None
    if isinstance(whole, list):
        return [r for r in whole if isinstance(r, dict)]
    if isinstance(whole, dict):
        return [whole]
    found = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                found.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return found


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.processor(),
        "cpu_count": os.cpu_count(),
    }
    try:
        import psutil

        info["memory_gib"] = round(psutil.virtual_memory().total / 2**30, 1)
        info["load_avg"] = [round(x, 2) for x in psutil.getloadavg()]
    except ImportError:
        pass
    try:
        info["git_commit"] = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    return info


def run_script(path: Path, timeout: float, env: dict[str, str]) -> dict[str, Any]:
    log(f"== {path.name}")
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, str(path)],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        rc, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc = -1
        stdout = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        stderr = f"timed out after {timeout:g}s"
    seconds = time.perf_counter() - start
    sys.stderr.write(stderr)
    result: dict[str, Any] = {
        "returncode": rc,
        "seconds": round(seconds, 2),
        "records": parse_records(stdout),
    }
    if rc != 0:
        result["stderr_tail"] = stderr[-2000:]
        log(f"!! {path.name} failed (exit {rc})")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer, shorter runs")
    parser.add_argument("--only", nargs="*", default=[], help="run scripts whose name contains")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per script")
    parser.add_argument("--out", type=Path, default=RESULTS / "latest.json")
    args = parser.parse_args(argv)

    scripts = sorted(BENCH_DIR.glob("bench_*.py"))
    if args.only:
        scripts = [s for s in scripts if any(o in s.name for o in args.only)]
    if not scripts:
        log("no benchmark scripts matched")
        return 1
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    if args.quick:
        env[QUICK_ENV] = "1"

    results = {s.stem: run_script(s, args.timeout, env) for s in scripts}
    report = {
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "quick": args.quick,
        "machine": machine(),
        "scripts": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    log(f"wrote {args.out}")
    return 0 if all(r["returncode"] == 0 for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
