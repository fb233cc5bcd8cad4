"""TorchScript export of a `RecurrentLM`: one `model.ts` with `step` and `score` methods.

    step(tokens, h, c) -> (log_probs [batch, time, vocab], h_out, c_out)
    score(tokens, targets, h, c) -> (token_log_probs [batch, time], h_out, c_out)

Log-probabilities are natural logs. The signature is the same for every cell: RNN and GRU take
`c` as an empty tensor and return it unchanged; the feed-forward model's `h` is its int64 window
of the last order - 1 ids [1, batch, order - 1]. The module is scripted (not traced), so batch
and time stay free.

torch 2.13 deprecates TorchScript (`torch.jit.script/save/load` warn on every call); it still
works, and `quiet_torchscript` silences exactly those notices around our own calls. Its
successors are `torch.export` (a portable graph) and AOTInductor (ahead-of-time compiled code).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmserve.export.rnn.ffnn import FeedForwardLM, window_views
from lmserve.export.rnn.model import RecurrentLM
from lmserve.export.rnn.nets import NeuralLM

MODEL_FILE = "model.ts"
# The start of the notice `torch.jit.script`, `.save` and `.load` give in torch 2.13.
DEPRECATION_MESSAGE = r"`torch\.jit\.\w+` is deprecated"


@contextmanager
def quiet_torchscript() -> Iterator[None]:
    """Ignores TorchScript's own deprecation notice inside the block; other warnings pass."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=DEPRECATION_MESSAGE, category=DeprecationWarning)
        yield


def load_torchscript(path: Path) -> torch.jit.ScriptModule:
    """Loads a `model.ts` on the CPU, in eval mode, without the deprecation notice."""
    with quiet_torchscript():
        module = torch.jit.load(str(path), map_location="cpu")
    module.eval()
    return module


class _Decoder(nn.Module):
    """Embedding lookup and the decoder as one 2-D matmul, shared by both scriptable classes."""

    def __init__(self, model: NeuralLM) -> None:
        super().__init__()
        self.embedding = model.embedding
        self.decoder = model.decoder

    def log_probs(self, out: Tensor, tokens: Tensor) -> Tensor:
        logits = F.linear(out.reshape(-1, out.shape[-1]), self.decoder.weight, self.decoder.bias)
        return torch.log_softmax(logits.reshape(tokens.shape[0], tokens.shape[1], -1), dim=-1)


class _Scripted(nn.Module):
    """What every cell shares: `score` and `forward` over the cell's own `step`."""

    def __init__(self, model: NeuralLM) -> None:
        super().__init__()
        self.head = _Decoder(model)

    def step(self, tokens: Tensor, h: Tensor, c: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        raise NotImplementedError

    @torch.jit.export
    def score(
        self, tokens: Tensor, targets: Tensor, h: Tensor, c: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        lp, h_out, c_out = self.step(tokens, h, c)
        return lp.gather(-1, targets.unsqueeze(-1)).squeeze(-1), h_out, c_out

    def forward(self, tokens: Tensor, h: Tensor, c: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return self.step(tokens, h, c)


class _ScriptedRecurrent(_Scripted):
    def __init__(self, model: RecurrentLM) -> None:
        super().__init__(model)
        self.rnn = model.rnn


class ScriptedLSTM(_ScriptedRecurrent):
    @torch.jit.export
    def step(self, tokens: Tensor, h: Tensor, c: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        out, (h_out, c_out) = self.rnn(self.head.embedding(tokens), (h, c))
        return self.head.log_probs(out, tokens), h_out, c_out


class ScriptedRNN(_ScriptedRecurrent):
    """Elman RNN or GRU: one state tensor; `c` is passed through untouched."""

    @torch.jit.export
    def step(self, tokens: Tensor, h: Tensor, c: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        out, h_out = self.rnn(self.head.embedding(tokens), h)
        return self.head.log_probs(out, tokens), h_out, c


class ScriptedFFNN(_Scripted):
    """The feed-forward model: `h` is its int64 window [1, batch, order - 1]; `c` passes through."""

    def __init__(self, model: FeedForwardLM) -> None:
        super().__init__(model)
        self.hidden = model.hidden
        self.context: int = model.context

    @torch.jit.export
    def step(self, tokens: Tensor, h: Tensor, c: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        full = torch.cat([h[0], tokens], dim=1)
        x = window_views(self.head.embedding(full), self.context)
        out = torch.tanh(self.hidden(x))
        return self.head.log_probs(out, tokens), full[:, -self.context :].unsqueeze(0), c


def export_torchscript(model: NeuralLM, folder: Path) -> dict[str, str]:
    """Writes `model.ts` into `folder`; returns {files key: name}."""
    was_training = model.training
    model.eval()
    wrapper: _Scripted
    if isinstance(model, FeedForwardLM):
        wrapper = ScriptedFFNN(model)
    elif model.config.cell == "lstm":
        wrapper = ScriptedLSTM(model)
    else:
        wrapper = ScriptedRNN(model)
    try:
        with quiet_torchscript():
            scripted = torch.jit.script(wrapper.eval())
            torch.jit.save(scripted, str(folder / MODEL_FILE))
    finally:
        model.train(was_training)
    return {"model": MODEL_FILE}
