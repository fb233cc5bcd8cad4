"""Raw speed of one recurrent model in ONNX Runtime, TorchScript and PyTorch eager, same run.

    python bench/bench_neural_backends.py [--runs 5] [--threads 2]

Default model: LSTM, embedding 512, hidden 512, 1 layer, tied, vocabulary 12,352, randomly
initialised (speed does not depend on the weights). Records: tokens/s of a full-sequence scoring
pass (gathered log-probs, batch 32 x 40 tokens) and µs per generation step (time 1, full
distribution) at batch 1, 8 and 64.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import numpy as np
from common import emit, log, quick, rate_record, record, repeat
from neural_model import VOCAB_SIZE, default_folders


def _runners(threads: int) -> dict[str, tuple[Callable[..., Any], Callable[..., Any], Any]]:
    """name -> (score(tokens, targets), step(tokens, state), initial_state(batch))."""
    import torch

    from lmserve.server.backends.onnx import OnnxBackend, OnnxOptions
    from lmserve.server.backends.torchscript import TorchScriptBackend
    from lmserve.server.manifest import read_manifest

    torch.set_num_threads(threads)
    onnx_dir, ts_dir, model = default_folders()
    ort = OnnxBackend.load(onnx_dir, read_manifest(onnx_dir), OnnxOptions(intra_op_threads=threads))
    ts = TorchScriptBackend.load(ts_dir, read_manifest(ts_dir), max_chunk_tokens=256)

    def eager_score(tokens: np.ndarray, targets: np.ndarray, state: Any) -> Any:
        with torch.inference_mode():
            logits, new = model(torch.from_numpy(tokens), state)
            lp = torch.log_softmax(logits, -1).gather(-1, torch.from_numpy(targets)[..., None])
        return lp.numpy(), new

    def eager_step(tokens: np.ndarray, state: Any) -> Any:
        with torch.inference_mode():
            logits, new = model(torch.from_numpy(tokens), state)
            return torch.log_softmax(logits, -1), new

    def eager_state(batch: int) -> Any:
        return model.initial_state(batch)

    return {
        "onnxruntime": (ort._run_score, ort._run_step, ort.initial_state),
        "torchscript": (ts._run_score, ts._run_step, ts.initial_state),
        "eager": (eager_score, eager_step, eager_state),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=2 if quick() else 5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20 if quick() else 100)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    runners = _runners(args.threads)
    rows, width = 32, 40
    tokens = rng.integers(3, VOCAB_SIZE, size=(rows, width), dtype=np.int64)
    targets = np.roll(tokens, -1, axis=1)
    for name, (score, step, initial) in runners.items():
        log(f"{name}: scoring {rows}x{width}")

        def run_score(s: Any = score, i: Any = initial) -> None:
            s(tokens, targets, i(rows))

        seconds = repeat(run_score, args.runs)
        emit(
            rate_record(
                f"neural_score_{name}_tokens_per_s", "tokens/s", rows * width, seconds,
                backend=name, batch=rows, time=width, threads=args.threads,
            )
        )  # fmt: skip
        for batch in (1, 8, 64):
            step_tokens = rng.integers(3, VOCAB_SIZE, size=(batch, 1), dtype=np.int64)

            def generate(
                st: Any = step, ini: Any = initial, b: int = batch, tk: Any = step_tokens
            ) -> None:
                state = ini(b)
                for _ in range(args.steps):
                    _, state = st(tk, state)

            seconds = repeat(generate, args.runs)
            emit(
                record(
                    f"neural_step_{name}_batch{batch}_us", "us/step",
                    [s / args.steps * 1e6 for s in seconds],
                    backend=name, batch=batch, threads=args.threads,
                    tokens_per_s=batch * args.steps / min(seconds),
                )
            )  # fmt: skip


if __name__ == "__main__":
    main()
