"""Memory of the server's processes: engine workers against the one-process server, same models.

    python bench/bench_memory.py [--rounds 3]

For each layout (engine workers, the default; then `LMSERVE_ENGINE_WORKERS=false`) a real
`lmserve serve` on the default models (`models/`) is started, every model is warmed (a 64-line
Score, a Rerank-sized batch and a 32-token Generate, `--rounds` times), and each process's
memory is read with psutil: RSS (resident pages, shared ones counted in every process that maps
them), PSS (each shared page divided among the processes that share it: what the machine spends
in all) and USS (pages only that process has). Records per layout: the sums, and the front's
own; then the workers' sums over the one-process server's (issue 38's target: <= 1.5x). PSS is
the figure that adds up across processes (RSS counts a shared page once per process mapping
it); the workers' layout includes the workers' fork server (`worker.forkserver`), whose
imported pages the workers share.
Shared pages are the point of the comparison: the n-gram binaries and the ONNX models' weights
are memory-mapped files, so a mixture's worker maps its components' weights again without a
second copy in memory, and the Python runtime's shared libraries are mapped by every process.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from common import DEFAULT_MODELS, KJV_TEST, emit, log, record
from server_process import ServerProcess

MODELS = ("kjv-5gram", "kjv-lstm", "kjv-lstm-5gram", "kjv-gru", "kjv-ffnn")


def _warm(target: str, rounds: int) -> None:
    from lmserve.client import LmServeClient

    lines = KJV_TEST.read_text(encoding="utf-8").splitlines()[:64]
    with LmServeClient(target, timeout=120) as client:
        for _ in range(rounds):
            for model in MODELS:
                client.score(model, lines)
                list(client.generate(model, "and god said", max_new_tokens=32, seed=1))


def _memory(server: ServerProcess) -> dict[str, dict[str, float]]:
    import psutil

    out: dict[str, dict[str, float]] = {}
    for index, process in enumerate(server.processes()):
        try:
            title = " ".join(process.cmdline()).strip()
            info = process.memory_full_info()
        except psutil.NoSuchProcess:
            continue
        # The front first, then its descendants: the workers' fork server and the workers.
        name = "front" if index == 0 else title.removeprefix("lmserve: engine ").strip()
        out[name] = {
            "rss_mb": info.rss / 2**20,
            "pss_mb": info.pss / 2**20,
            "uss_mb": info.uss / 2**20,
        }
    return out


def _layout(workers: bool, rounds: int) -> dict[str, Any]:
    os.environ["LMSERVE_ENGINE_WORKERS"] = "true" if workers else "false"
    with ServerProcess(DEFAULT_MODELS) as server:
        _warm(server.target, rounds)
        per_process = _memory(server)
    sums = {k: sum(p[k] for p in per_process.values()) for k in ("rss_mb", "pss_mb", "uss_mb")}
    return {"processes": per_process, **sums, "front": per_process.get("front", {})}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    layouts = {"workers": _layout(True, args.rounds), "one_process": _layout(False, args.rounds)}
    os.environ.pop("LMSERVE_ENGINE_WORKERS", None)
    for name, layout in layouts.items():
        log(
            f"{name}: "
            + ", ".join(f"{k} {v:.0f} MB" for k, v in layout.items() if k.endswith("_mb"))
        )
        for kind in ("rss_mb", "pss_mb", "uss_mb"):
            emit(
                record(
                    f"memory_{name}_{kind}",
                    "MB",
                    [layout[kind]],
                    front=round(layout["front"].get(kind, 0.0), 1),
                    processes={k: round(v[kind], 1) for k, v in layout["processes"].items()},
                )
            )
    for kind in ("rss_mb", "pss_mb"):
        ratio = layouts["workers"][kind] / layouts["one_process"][kind]
        emit(record(f"memory_workers_vs_one_process_{kind.removesuffix('_mb')}", "x", [ratio]))


if __name__ == "__main__":
    main()
