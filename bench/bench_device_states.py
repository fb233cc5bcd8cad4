"""ONNX generation steps with the states left on the session's device (I/O binding,
`onnx_device_states`) against the plain step, on whatever provider the session gets here.

    python bench/bench_device_states.py [--runs 3] [--steps 100]

On the CPU provider the bound step only adds work (the states never leave host memory), which
is why `auto` binds on CUDA only; on a GPU it saves each step's host round trip of the states.
Prints one JSON record per mode and batch: milliseconds a step (median of the runs), with the
ratio bound / plain.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
from common import DEFAULT_LSTM, default_model, emit, record

from lmserve.server.backends.onnx import OnnxBackend, OnnxOptions
from lmserve.server.backends.stepping import RecurrentStepper
from lmserve.server.manifest import read_manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args(argv)
    folder = default_model(DEFAULT_LSTM)
    steppers = {
        mode: RecurrentStepper(
            OnnxBackend.load(folder, read_manifest(folder), OnnxOptions(device_states=mode))
        )
        for mode in ("off", "on")
    }
    provider = steppers["on"].backend.providers[0]  # type: ignore[attr-defined]
    ms: dict[tuple[str, int], list[float]] = {}
    for _ in range(args.runs):  # the modes alternate run by run: drift hits both alike
        for mode, stepper in steppers.items():
            for batch in (1, 32):
                _, state = stepper.prefill([[5, 6, 7]] * batch)
                tokens = np.full(batch, 9)
                for _ in range(5):
                    _, state = stepper.step(tokens, state)
                start = time.perf_counter()
                for _ in range(args.steps):
                    _, state = stepper.step(tokens, state)
                ms.setdefault((mode, batch), []).append(
                    (time.perf_counter() - start) / args.steps * 1e3
                )
    for batch in (1, 32):
        plain = statistics.median(ms[("off", batch)])
        for mode in ("off", "on"):
            emit(
                record(
                    f"device_states_{mode}_batch{batch}_step_ms",
                    "ms",
                    ms[(mode, batch)],
                    provider=provider,
                    ratio_to_plain=round(statistics.median(ms[(mode, batch)]) / plain, 3),
                )
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
