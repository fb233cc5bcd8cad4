"""ONNX export of a `RecurrentLM`: a step graph, a score graph, and one shared weights file.

- `step.onnx`: tokens [batch, time], h (, c) [layers, batch, hidden] -> log_probs
  [batch, time, vocab] (natural log), h_out (, c_out). Generation calls it with time = 1.
- `score.onnx`: tokens, targets [batch, time], h (, c) -> token_log_probs [batch, time]
  = log p(targets[b, t] | tokens[b, <=t], state), h_out (, c_out): scoring gets one float per
  position instead of [batch, time, vocab].

A feed-forward model (`--cell ffnn`) has the same graphs with one int64 state, `window`
[1, batch, order - 1] (the last ids read), in place of h (and c).

The TorchScript-based exporter (`dynamo=False`) is used on purpose: with torch 2.13 the dynamo
exporter bakes the example's time length into nn.LSTM/GRU/RNN, while this one keeps batch and time
dynamic and emits the fused ONNX LSTM/GRU/RNN ops. Both graphs are exported from the same
parameters, so their large initializers are byte-identical; `write_shared_weights` stores each
distinct one once in `weights.bin` (ONNX external data: location, offset, length) and both graphs
point into it.
"""

from __future__ import annotations

import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import onnx
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmserve.export.onnx_weights import ALIGNMENT as ALIGNMENT
from lmserve.export.onnx_weights import EXTERNAL_MIN_BYTES as EXTERNAL_MIN_BYTES
from lmserve.export.onnx_weights import WEIGHTS_FILE as WEIGHTS_FILE
from lmserve.export.onnx_weights import write_shared_weights as write_shared_weights
from lmserve.export.rnn.ffnn import FeedForwardLM
from lmserve.export.rnn.model import RecurrentLMConfig
from lmserve.export.rnn.nets import NeuralLM

OPSET = 17
STATE_NAMES = frozenset({"h", "c", "h_out", "c_out", "window", "window_out"})


def state_names(cell: str) -> list[str]:
    """The graphs' state inputs: h (and c for an LSTM), or the feed-forward model's window."""
    if cell == "ffnn":
        return ["window"]
    return ["h", "c"] if cell == "lstm" else ["h"]


def io_names(cell: str) -> dict[str, list[str]]:
    """Input and output names of both graphs, as the manifest's `architecture` records them."""
    states = state_names(cell)
    outs = [f"{s}_out" for s in states]
    return {
        "step_inputs": ["tokens", *states],
        "step_outputs": ["log_probs", *outs],
        "score_inputs": ["tokens", "targets", *states],
        "score_outputs": ["token_log_probs", *outs],
    }


def log_probs(model: NeuralLM, tokens: Tensor, state: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
    """log_softmax of the logits and the new state, with the decoder applied as one 2-D matmul.

    RecurrentLM.forward applies the decoder to a 3-D tensor, which the exporter turns into a
    MatMul against a constant-folded transposed copy of the weight (a second copy of a tied
    embedding). A 2-D `F.linear` becomes Gemm(transB=1) on the weight itself, shared with Gather.
    """
    new_state: tuple[Tensor, ...]
    if isinstance(model, FeedForwardLM):
        out, new_state = model.features(tokens, state)  # eval mode: no dropout in the graph
    elif model.config.cell == "lstm":
        x = model.embedding(tokens)
        out, (h, c) = model.rnn(x, (state[0], state[1]))
        new_state = (h, c)
    else:
        out, h = model.rnn(model.embedding(tokens), state[0])
        new_state = (h,)
    flat = out.reshape(-1, out.shape[-1])
    logits = F.linear(flat, model.decoder.weight, model.decoder.bias)
    # The vocabulary size as a constant keeps the output's last axis static in the graph.
    logits = logits.reshape(tokens.shape[0], tokens.shape[1], model.config.vocab_size)
    return (torch.log_softmax(logits, dim=-1), *new_state)


class StepGraph(nn.Module):
    def __init__(self, model: NeuralLM) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens: Tensor, *state: Tensor) -> tuple[Tensor, ...]:
        return log_probs(self.model, tokens, state)


class ScoreGraph(nn.Module):
    def __init__(self, model: NeuralLM) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens: Tensor, targets: Tensor, *state: Tensor) -> tuple[Tensor, ...]:
        lp, *new_state = log_probs(self.model, tokens, state)
        picked = lp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        return (picked, *new_state)


@contextmanager
def _quiet_legacy_exporter() -> Iterator[None]:
    """Silences the legacy exporter's own notices, only for the export call itself.

    Its deprecation notices (we choose it deliberately, see the module docstring), the tracer's
    note about a Python bool inside nn.LSTM's argument checks (parity checks prove the graph),
    and the advice to make h0/c0 graph inputs (they are).
    """
    with warnings.catch_warnings():
        for message in (
            "You are using the legacy TorchScript-based ONNX export",
            "The feature will be removed",
            "Exporting a model to ONNX with a batch_size other than 1",
        ):
            warnings.filterwarnings("ignore", message=message)
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        yield


def _export(
    module: nn.Module, args: tuple[Tensor, ...], names: dict[str, list[str]], kind: str, opset: int
) -> onnx.ModelProto:
    inputs, outputs = names[f"{kind}_inputs"], names[f"{kind}_outputs"]
    axes: dict[str, dict[int, str]] = {}
    for name in [*inputs, *outputs]:
        # States are [layers, batch, hidden]; everything else is [batch, time(, vocab)].
        axes[name] = {1: "batch"} if name in STATE_NAMES else {0: "batch", 1: "time"}
    with tempfile.TemporaryDirectory() as tmp, _quiet_legacy_exporter(), torch.no_grad():
        path = Path(tmp) / f"{kind}.onnx"
        torch.onnx.export(
            module,
            args,
            str(path),
            dynamo=False,
            opset_version=opset,
            input_names=inputs,
            output_names=outputs,
            dynamic_axes=axes,
            do_constant_folding=True,
        )
        return onnx.load_model(str(path))


def example_state(cfg: RecurrentLMConfig, batch: int) -> tuple[Tensor, ...]:
    """A state of the model's shape and dtype (zeros: float, or `<unk>` ids for a window)."""
    if cfg.cell == "ffnn":
        return (torch.zeros(1, batch, cfg.state_size, dtype=torch.long),)
    return tuple(torch.zeros(cfg.num_layers, batch, cfg.hidden_size) for _ in cfg.state_names)


def export_onnx(model: NeuralLM, folder: Path, *, opset: int = OPSET) -> dict[str, str]:
    """Writes step.onnx, score.onnx and weights.bin into `folder`; returns {files key: name}.

    Both graphs are checked with onnx.checker (external data included).
    """
    if opset < 17:
        raise ValueError(f"opset {opset}: 17 or newer is needed")
    cfg = model.config
    names = io_names(cfg.cell)
    # Example inputs: batch 2, time 3; dynamic_axes frees both axes.
    tokens = torch.randint(0, cfg.vocab_size, (2, 3), dtype=torch.long)
    state = example_state(cfg, 2)
    was_training = model.training
    try:
        # The wrappers must be in eval mode too: the exporter restores the wrapper's mode
        # afterwards, recursively, which would otherwise switch the model's dropout back on.
        step = _export(StepGraph(model).eval(), (tokens, *state), names, "step", opset)
        score = _export(ScoreGraph(model).eval(), (tokens, tokens, *state), names, "score", opset)
    finally:
        model.train(was_training)
    write_shared_weights([step, score], folder / WEIGHTS_FILE)
    files = {"step": "step.onnx", "score": "score.onnx", "weights": WEIGHTS_FILE}
    for graph, key in ((step, "step"), (score, "score")):
        path = folder / files[key]
        # Serialised directly: onnx.save would try to (re)write external tensors itself.
        path.write_bytes(graph.SerializeToString())
        onnx.checker.check_model(str(path), full_check=True)
    return files
