"""What a neural model's two ONNX Runtime sessions (step.onnx, score.onnx) hold privately, and
what the ways of sharing their weights that onnxruntime's Python API offers would save.

    python bench/bench_session_memory.py [--model models/kjv-lstm] [--runs 5]

Each variant runs in a fresh child process (so one's allocations do not hide another's) that
opens the step session, then the score session, and reads its USS (psutil: pages only it has)
before and after each. Variants: `default` (as `backends.onnx.open_session` opens them: each
session prepacks its MatMul/Gemm and LSTM weights, reading the initializers from the memory-
mapped external weights file); `shared_initializers` (every initializer loaded once as an
OrtValue and given to both sessions with `SessionOptions.add_initializer`); `score_unpacked`
(the score session with `session.disable_prepacking`). onnxruntime's Python API has no
PrepackedWeightsContainer (the C API's CreateSessionWithPrepackedWeightsContainer), so two
sessions cannot share one prepacked copy from Python. Then the score session's CPU per call,
prepacked against not, interleaved in one process, at three batch shapes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import DEFAULT_LSTM, default_model, emit, log, record

VARIANTS = ("default", "shared_initializers", "score_unpacked")


def _options(prepack: bool = True) -> Any:
    import onnxruntime as ort  # type: ignore[import-untyped]

    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.inter_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if not prepack:
        so.add_session_config_entry("session.disable_prepacking", "1")
    return so


def _uss_mb() -> float:
    import psutil

    return float(psutil.Process().memory_full_info().uss / 2**20)


def child(folder: Path, variant: str) -> dict[str, float]:
    """In a fresh process: the USS each session added, MB."""
    import onnxruntime as ort

    keep: list[Any] = []
    step_options, score_options = _options(), _options(variant != "score_unpacked")
    start = _uss_mb()
    if variant == "shared_initializers":
        import onnx
        from onnx import numpy_helper

        model = onnx.load(str(folder / "step.onnx"), load_external_data=False)
        onnx.load_external_data_for_model(model, str(folder))
        for init in model.graph.initializer:
            value = ort.OrtValue.ortvalue_from_numpy(numpy_helper.to_array(init))
            keep.append(value)
            step_options.add_initializer(init.name, value)
            score_options.add_initializer(init.name, value)
        del model
    cpu = ["CPUExecutionProvider"]
    before = _uss_mb()
    step = ort.InferenceSession(str(folder / "step.onnx"), step_options, providers=cpu)
    after_step = _uss_mb()
    score = ort.InferenceSession(str(folder / "score.onnx"), score_options, providers=cpu)
    after_score = _uss_mb()
    keep += [step, score]
    return {
        "initializers_mb": before - start,
        "step_mb": after_step - before,
        "score_mb": after_score - after_step,
        "total_mb": after_score - start,
    }


def _feeds(session: Any, batch: int, length: int, rng: Any) -> dict[str, Any]:
    import numpy as np

    feeds = {
        "tokens": rng.integers(3, 12000, (batch, length)).astype(np.int64),
        "targets": rng.integers(3, 12000, (batch, length)).astype(np.int64),
    }
    for i in session.get_inputs():
        if i.name not in feeds:
            shape = [d if isinstance(d, int) else batch for d in i.shape]
            feeds[i.name] = np.zeros(shape, np.float32)
    return feeds


def score_cpu(folder: Path, runs: int) -> list[dict[str, Any]]:
    """CPU ms per score call, prepacked vs not, alternated."""
    import numpy as np
    import onnxruntime as ort

    cpu = ["CPUExecutionProvider"]
    packed = ort.InferenceSession(str(folder / "score.onnx"), _options(True), providers=cpu)
    unpacked = ort.InferenceSession(str(folder / "score.onnx"), _options(False), providers=cpu)
    out = []
    for batch, length, calls in ((64, 30, 3), (4, 12, 50), (1, 1, 200)):
        feeds = _feeds(packed, batch, length, np.random.default_rng(0))
        times: dict[str, list[float]] = {"prepacked": [], "unpacked": []}
        packed.run(None, feeds)
        unpacked.run(None, feeds)
        for _ in range(runs):
            for name, session in (("prepacked", packed), ("unpacked", unpacked)):
                started = time.process_time()
                for _ in range(calls):
                    session.run(None, feeds)
                times[name].append(1000 * (time.process_time() - started) / calls)
        out.append({"batch": batch, "length": length, **times})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    folder = args.model or default_model(DEFAULT_LSTM)
    if args.child:
        print(json.dumps(child(folder, args.child)))
        return
    for variant in VARIANTS:
        command = [sys.executable, __file__, "--model", str(folder), "--child", variant]
        measured = json.loads(subprocess.run(command, check=True, capture_output=True).stdout)
        log(f"{variant}: " + ", ".join(f"{k} {v:.1f}" for k, v in measured.items()))
        emit(
            record(
                f"session_memory_{variant}_uss_mb",
                "MB",
                [measured["total_mb"]],
                **{k: round(v, 1) for k, v in measured.items()},
            )
        )
    for shape in score_cpu(folder, args.runs):
        packed = statistics.median(shape["prepacked"])
        unpacked = statistics.median(shape["unpacked"])
        size = f"{shape['batch']}x{shape['length']}"
        log(f"score {size}: prepacked {packed:.2f} ms CPU, not prepacked {unpacked:.2f}")
        ratios = [u / p for p, u in zip(shape["prepacked"], shape["unpacked"], strict=True)]
        emit(
            record(
                f"session_memory_score_unpacked_vs_prepacked_cpu_{size}",
                "x",
                ratios,
                prepacked_ms=round(packed, 3),
                unpacked_ms=round(unpacked, 3),
            )
        )


if __name__ == "__main__":
    main()
