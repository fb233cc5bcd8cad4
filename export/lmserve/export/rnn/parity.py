"""Parity of an exported model folder with the PyTorch model it came from.

Both exported entry points (`step`: full log-probs; `score`: the target's log-prob per position)
are run here (ONNX Runtime or TorchScript) and compared with `RecurrentLM.forward` in eval mode
by the one comparison loop (`lmserve.export.parity`). All values are natural logs.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import torch

from lmserve.export.parity import (
    PARITY_NATS,
    Cases,
    ParityError,
    ParityMismatch,
    ParityReport,
    ShapeMismatch,
    compare_step_and_score,
)
from lmserve.export.rnn.model import RecurrentLMConfig
from lmserve.export.rnn.nets import NeuralLM

Array = npt.NDArray[np.float32]
# float32 [layers, batch, hidden] (recurrent) or int64 [1, batch, order - 1] (a window).
States = Sequence[npt.NDArray[Any]]

BATCH_SIZES = (1, 3, 8)
LENGTHS = (1, 7, 40)


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
    atol: float = PARITY_NATS,
    seed: int = 0,
) -> ParityReport:
    """Raises ParityError naming the first case whose log-probs or states differ by > atol."""
    was_training = model.training
    model.eval()
    cfg = model.config
    rng = np.random.default_rng(seed)
    cases = Cases(batch_sizes, lengths, cfg.vocab_size, cfg.state_names)
    try:
        return compare_step_and_score(
            lambda tokens, state: _eager(model, tokens, tuple(state)),
            runner,
            cases,
            lambda batch: random_state(cfg, batch, rng),
            rng,
            atol=atol,
        )
    except ShapeMismatch as exc:
        raise ParityError(f"shape {exc.got} where PyTorch gives {exc.want}") from None
    except ParityMismatch as exc:
        raise ParityError(
            f"{exc.label} differ from PyTorch eager by {exc.diff:.3g} > {exc.atol:g} ({exc.case})"
        ) from None
    finally:
        model.train(was_training)


def random_state(cfg: RecurrentLMConfig, batch: int, rng: np.random.Generator) -> States:
    """A random (not initial) start state, so that the state inputs are really exercised:
    normal floats for a recurrent model, random ids for a feed-forward model's window."""
    if cfg.cell == "ffnn":
        return (rng.integers(0, cfg.vocab_size, (1, batch, cfg.state_size), dtype=np.int64),)
    shape = (cfg.num_layers, batch, cfg.hidden_size)
    return tuple((0.5 * rng.standard_normal(shape)).astype(np.float32) for _ in cfg.state_names)
