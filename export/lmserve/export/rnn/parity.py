"""Parity of an exported model folder with the PyTorch model it came from.

Both exported entry points (`step`: full log-probs; `score`: the target's log-prob per position)
are compared with `RecurrentLM.forward` in eval mode, for several batch sizes and lengths, over
two consecutive calls: the second continues from the state the *exported* model returned, so a
wrong state output shows up as a wrong second call. All values are natural logs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import torch

from lmserve.export.rnn.model import RecurrentLMConfig
from lmserve.export.rnn.nets import NeuralLM

Array = npt.NDArray[np.float32]
# float32 [layers, batch, hidden] (recurrent) or int64 [1, batch, order - 1] (a window).
States = tuple[npt.NDArray[Any], ...]

BATCH_SIZES = (1, 3, 8)
LENGTHS = (1, 7, 40)
ATOL = 1e-4


class ParityError(RuntimeError):
    """The exported model disagrees with PyTorch eager."""


class Runner(Protocol):
    """An exported model: int64 tokens/targets [batch, time], states [layers, batch, hidden]."""

    def step(self, tokens: npt.NDArray[np.int64], state: States) -> tuple[Array, States]: ...

    def score(
        self, tokens: npt.NDArray[np.int64], targets: npt.NDArray[np.int64], state: States
    ) -> tuple[Array, States]: ...


class OnnxRunner:
    """step.onnx and score.onnx of a folder in onnxruntime (CPU, one thread: a check)."""

    def __init__(self, folder: Path, cell: str) -> None:
        import onnxruntime as ort  # type: ignore[import-untyped,unused-ignore]

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        cpu = ["CPUExecutionProvider"]
        from lmserve.export.rnn.to_onnx import state_names

        self.states = tuple(state_names(cell))
        self._step = ort.InferenceSession(str(folder / "step.onnx"), options, providers=cpu)
        self._score = ort.InferenceSession(str(folder / "score.onnx"), options, providers=cpu)

    def step(self, tokens: npt.NDArray[np.int64], state: States) -> tuple[Array, States]:
        out = self._step.run(None, {"tokens": tokens, **dict(zip(self.states, state, strict=True))})
        return out[0], tuple(out[1:])

    def score(
        self, tokens: npt.NDArray[np.int64], targets: npt.NDArray[np.int64], state: States
    ) -> tuple[Array, States]:
        feeds = {"tokens": tokens, "targets": targets, **dict(zip(self.states, state, strict=True))}
        out = self._score.run(None, feeds)
        return out[0], tuple(out[1:])


class TorchScriptRunner:
    """model.ts of a folder; RNN/GRU/FFNN get an empty `c` and the runner keeps only `h`."""

    def __init__(self, folder: Path, cell: str) -> None:
        from lmserve.export.rnn.to_torchscript import load_torchscript

        self.lstm = cell == "lstm"
        self.module = load_torchscript(folder / "model.ts")

    def _args(self, state: States) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.from_numpy(state[0])
        return h, (torch.from_numpy(state[1]) if self.lstm else torch.empty(0))

    def _states(self, h: torch.Tensor, c: torch.Tensor) -> States:
        return (h.numpy(), c.numpy()) if self.lstm else (h.numpy(),)

    @torch.no_grad()
    def step(self, tokens: npt.NDArray[np.int64], state: States) -> tuple[Array, States]:
        lp, h, c = self.module.step(torch.from_numpy(tokens), *self._args(state))
        return lp.numpy(), self._states(h, c)

    @torch.no_grad()
    def score(
        self, tokens: npt.NDArray[np.int64], targets: npt.NDArray[np.int64], state: States
    ) -> tuple[Array, States]:
        args = self._args(state)
        lp, h, c = self.module.score(torch.from_numpy(tokens), torch.from_numpy(targets), *args)
        return lp.numpy(), self._states(h, c)


@dataclass(frozen=True)
class ParityReport:
    """Largest absolute difference seen (log-probs and states) over `cases` compared calls."""

    max_abs_diff: float
    cases: int


@torch.no_grad()
def _eager(model: NeuralLM, tokens: npt.NDArray[np.int64], state: States) -> tuple[Array, States]:
    logits, new = model(torch.from_numpy(tokens), tuple(torch.from_numpy(s) for s in state))
    return torch.log_softmax(logits, dim=-1).numpy(), tuple(s.numpy() for s in new)


def check_parity(
    model: NeuralLM,
    runner: Runner,
    *,
    batch_sizes: Sequence[int] = BATCH_SIZES,
    lengths: Sequence[int] = LENGTHS,
    atol: float = ATOL,
    seed: int = 0,
) -> ParityReport:
    """Raises ParityError naming the first case whose log-probs or states differ by > atol."""
    was_training = model.training
    model.eval()
    cfg = model.config
    rng = np.random.default_rng(seed)
    worst, cases = 0.0, 0
    try:
        for batch in batch_sizes:
            for length in lengths:
                start = random_state(cfg, batch, rng)
                ref_state, got_state = start, start
                got_score_state = start
                for call in (1, 2):
                    tokens = rng.integers(0, cfg.vocab_size, (batch, length), dtype=np.int64)
                    targets = rng.integers(0, cfg.vocab_size, (batch, length), dtype=np.int64)
                    ref_lp, ref_next = _eager(model, tokens, ref_state)
                    got_lp, got_state = runner.step(tokens, got_state)
                    got_tlp, got_score_state = runner.score(tokens, targets, got_score_state)
                    ref_tlp = np.take_along_axis(ref_lp, targets[..., None], axis=-1)[..., 0]
                    diffs = {
                        "log_probs": _diff(got_lp, ref_lp),
                        "token_log_probs": _diff(got_tlp, ref_tlp),
                        **{
                            f"step {n}": _diff(g, r)
                            for n, g, r in zip(cfg.state_names, got_state, ref_next, strict=True)
                        },
                        **{
                            f"score {n}": _diff(g, r)
                            for n, g, r in zip(
                                cfg.state_names, got_score_state, ref_next, strict=True
                            )
                        },
                    }
                    cases += 1
                    name, diff = max(diffs.items(), key=lambda kv: kv[1])
                    worst = max(worst, diff)
                    if not diff <= atol:  # also catches NaN
                        raise ParityError(
                            f"{name} differ from PyTorch eager by {diff:.3g} > {atol:g} "
                            f"(batch {batch}, length {length}, call {call} of 2)"
                        )
                    ref_state = ref_next
    finally:
        model.train(was_training)
    return ParityReport(max_abs_diff=worst, cases=cases)


def random_state(cfg: RecurrentLMConfig, batch: int, rng: np.random.Generator) -> States:
    """A random (not initial) start state, so that the state inputs are really exercised:
    normal floats for a recurrent model, random ids for a feed-forward model's window."""
    if cfg.cell == "ffnn":
        return (rng.integers(0, cfg.vocab_size, (1, batch, cfg.state_size), dtype=np.int64),)
    shape = (cfg.num_layers, batch, cfg.hidden_size)
    return tuple((0.5 * rng.standard_normal(shape)).astype(np.float32) for _ in cfg.state_names)


def _diff(got: np.ndarray, ref: np.ndarray) -> float:
    if got.shape != ref.shape:
        raise ParityError(f"shape {got.shape} where PyTorch gives {ref.shape}")
    return float(np.max(np.abs(got.astype(np.float64) - ref))) if got.size else 0.0
