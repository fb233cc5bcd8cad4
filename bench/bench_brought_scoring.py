"""A brought ONNX model: where the scoring gather runs, and what the wrapper costs.

    python bench/bench_brought_scoring.py [--quick] [--runs 5] [--batch 64] [--time 32]

A team's LSTM at the shipped kjv-lstm's size (vocabulary 12,352, 512 embedding and hidden units,
one layer; seeded random weights: speed does not depend on them), exported by the team's own
`torch.onnx.export` with states batch-first [B, layers, H] and names of its own, then brought in
by `lmserve.export.import_onnx`. On the same batches of random ids (batch x time), run by run in
turn, each with the server's ONNX Runtime session options:

- `team_graph_then_numpy`: the team's graph as it is, then log_softmax and the targets' gather
  in numpy: scoring "done by the server" on the graph it was given;
- `served_step_then_numpy`: the served step.onnx (log-probs [B, T, V] out), gather in numpy;
- `served_score_graph`: the served score.onnx: log_softmax and gather inside the graph, one float
  per position out (what the server runs for Score);
- `served_backend_score`: `OnnxBackend.score` on the same texts as the server's scoring path
  (<s> first, </s> scored, padding, chunks).

Records: tokens/s per way (median of runs) and each way's ratio to `team_graph_then_numpy`
timed in the same run; the import's parity figures.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from common import emit, log, quick, record

VOCAB = 12352
DIM = 512


def _team_model() -> Any:
    import torch
    from torch import nn

    class TeamLSTM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(VOCAB, DIM)
            self.lstm = nn.LSTM(DIM, DIM, 1, batch_first=True)
            self.out = nn.Linear(DIM, VOCAB)

        def forward(self, ids: Any, h: Any, c: Any) -> Any:
            state = (h.transpose(0, 1).contiguous(), c.transpose(0, 1).contiguous())
            x, (h, c) = self.lstm(self.embed(ids), state)
            return self.out(x), h.transpose(0, 1), c.transpose(0, 1)

    torch.manual_seed(0)
    return TeamLSTM().eval()


def _export(model: Any, path: Path) -> None:
    import torch

    zeros = torch.zeros(1, 1, DIM)
    axes = {"ids": {0: "b", 1: "t"}, "logits": {0: "b", 1: "t"}}
    axes |= {n: {0: "b"} for n in ("h0", "c0", "hn", "cn")}
    with torch.no_grad():
        torch.onnx.export(
            model,
            (torch.zeros(1, 3, dtype=torch.long), zeros, zeros),
            str(path),
            dynamo=False,
            input_names=["ids", "h0", "c0"],
            output_names=["logits", "hn", "cn"],
            dynamic_axes=axes,
            opset_version=17,
        )


def _session(path: Path) -> Any:
    import onnxruntime as ort  # type: ignore[import-untyped]

    from lmserve.server.backends.onnx import OnnxOptions

    options = OnnxOptions()
    so = ort.SessionOptions()
    so.intra_op_num_threads = options.intra_op_threads
    so.inter_op_num_threads = options.inter_op_threads
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), sess_options=so, providers=["CPUExecutionProvider"])


def _gather_log_probs(scores: np.ndarray, targets: np.ndarray) -> np.ndarray:
    top = scores.max(axis=-1, keepdims=True)
    log_z = top[..., 0] + np.log(np.exp(scores - top).sum(axis=-1))
    picked = np.take_along_axis(scores, targets[..., None], axis=-1)[..., 0]
    return picked - log_z


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3 if quick() else 5)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--time", type=int, default=32)
    parser.add_argument("--batches", type=int, default=2 if quick() else 4)
    args = parser.parse_args()

    from lmserve.export.custom import ModelContract, StateSpec, import_onnx
    from lmserve.server.backends.onnx import OnnxBackend, OnnxOptions
    from lmserve.server.manifest import read_manifest
    from lmserve.server.text.vocab import EncodedBatch

    tmp = Path(tempfile.mkdtemp(prefix="bench-brought-"))
    team_file = tmp / "team.onnx"
    _export(_team_model(), team_file)
    words = ["<unk>", "<s>", "</s>", *[f"w{i}" for i in range(VOCAB - 3)]]
    contract = ModelContract(
        states=(
            StateSpec(name="h", shape=("batch", 1, DIM), input="h0", output="hn"),
            StateSpec(name="c", shape=("batch", 1, DIM), input="c0", output="cn"),
        )
    )
    began = time.perf_counter()
    result = import_onnx(team_file, tmp / "model", vocab=words, contract=contract, kind="lstm")
    import_seconds = time.perf_counter() - began
    log(f"imported in {import_seconds:.1f} s, parity {result.parity}")
    folder = tmp / "model"
    team, step, score = (
        _session(team_file),
        _session(folder / "step.onnx"),
        _session(folder / "score.onnx"),
    )
    backend = OnnxBackend.load(folder, read_manifest(folder), OnnxOptions())

    rng = np.random.default_rng(0)
    b, t = args.batch, args.time
    inputs = [rng.integers(3, VOCAB, (b, t), dtype=np.int64) for _ in range(args.batches)]
    targets = [rng.integers(3, VOCAB, (b, t), dtype=np.int64) for _ in range(args.batches)]
    zeros_team = np.zeros((b, 1, DIM), dtype=np.float32)
    zeros_served = np.zeros((1, b, DIM), dtype=np.float32)
    tokens = b * t * args.batches
    # The backend path scores texts: <s> + (t - 1) ids, then </s>: t positions a text.
    texts = [
        EncodedBatch(
            ids=x[:, : t - 1].reshape(-1).astype(np.int32),
            offsets=np.arange(0, b * (t - 1) + 1, t - 1, dtype=np.int64),
            oov=np.zeros(b * (t - 1), dtype=bool),
        )
        for x in inputs
    ]

    def team_graph_then_numpy() -> list[np.ndarray]:
        out = []
        for x, y in zip(inputs, targets, strict=True):
            logits = team.run(["logits"], {"ids": x, "h0": zeros_team, "c0": zeros_team})[0]
            out.append(_gather_log_probs(logits, y))
        return out

    def served_step_then_numpy() -> list[np.ndarray]:
        out = []
        for x, y in zip(inputs, targets, strict=True):
            lp = step.run(["log_probs"], {"tokens": x, "h": zeros_served, "c": zeros_served})[0]
            out.append(np.take_along_axis(lp, y[..., None], axis=-1)[..., 0])
        return out

    def served_score_graph() -> list[np.ndarray]:
        return [
            score.run(
                ["token_log_probs"],
                {"tokens": x, "targets": y, "h": zeros_served, "c": zeros_served},
            )[0]
            for x, y in zip(inputs, targets, strict=True)
        ]

    def served_backend_score() -> list[np.ndarray]:
        return [backend.score(batch).totals for batch in texts]

    ways = {
        "team_graph_then_numpy": team_graph_then_numpy,
        "served_step_then_numpy": served_step_then_numpy,
        "served_score_graph": served_score_graph,
        "served_backend_score": served_backend_score,
    }
    reference = team_graph_then_numpy()
    for name in ("served_step_then_numpy", "served_score_graph"):
        got = ways[name]()
        worst = max(float(np.max(np.abs(g - r))) for g, r in zip(got, reference, strict=True))
        log(f"{name}: max |diff| to the team graph {worst:.2e} nats")
    for fn in ways.values():
        fn()  # warm-up
    rates: dict[str, list[float]] = {name: [] for name in ways}
    ratios: dict[str, list[float]] = {name: [] for name in ways}
    for run in range(args.runs):
        seconds: dict[str, float] = {}
        for name, fn in ways.items():
            start = time.perf_counter()
            fn()
            seconds[name] = time.perf_counter() - start
            rates[name].append(tokens / seconds[name])
        for name in ways:
            ratios[name].append(seconds["team_graph_then_numpy"] / seconds[name])
        log(f"run {run + 1}: " + ", ".join(f"{n} {tokens / s:,.0f}" for n, s in seconds.items()))
    setup = {"batch": b, "time": t, "vocab": VOCAB, "hidden": DIM, "tokens_per_run": tokens}
    for name in ways:
        emit(record(f"brought_{name}_tokens_per_s", "tokens/s", rates[name], **setup))
        emit(
            record(
                f"brought_{name}_vs_team_graph",
                "ratio",
                ratios[name],
                note="tokens/s over team_graph_then_numpy's in the same run",
            )
        )
    emit(
        record(
            "brought_import_parity_max_abs_diff_nats",
            "nats",
            [result.parity.max_abs_diff],
            positions=result.parity.positions,
            chunk_carry_max_abs_diff_nats=result.parity.chunk_carry_max_abs_diff,
            import_seconds=round(import_seconds, 2),
        )
    )
    log(f"median ratios: { ({n: round(statistics.median(r), 3) for n, r in ratios.items()}) }")


if __name__ == "__main__":
    main()
