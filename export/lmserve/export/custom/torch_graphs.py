"""A team's torch model (an `nn.Module`, or a loaded TorchScript module) in the served layout.

`ServedAdapter` wraps the team's `forward(tokens, *states) -> (scores, *states)` into the two
methods every served neural folder has:

    step(tokens [B, T], *states)           -> (log_probs [B, T, V], *states)   full distributions
    score(tokens, targets [B, T], *states) -> (token_log_probs [B, T], *states) gathered

with natural-log probabilities and every state's batch on axis 1, whatever the team's layout
(`ModelContract`). From it, `export_onnx` writes `step.onnx` + `score.onnx` sharing one
`weights.bin`, and `export_torchscript` traces both methods into one `model.ts`; the traced
module calls the team's own TorchScript code as it is, so nothing of it is rewritten.
"""

from __future__ import annotations

import tempfile
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import onnx
import torch
from torch import Tensor, nn

from lmserve.export.custom.contract import BATCH, ContractError, ModelContract, StateSpec
from lmserve.export.rnn.to_onnx import WEIGHTS_FILE, write_shared_weights
from lmserve.export.rnn.to_torchscript import quiet_torchscript

MODEL_FILE = "model.ts"
OPSET = 17


def flatten_outputs(out: Any) -> list[Tensor]:
    """(scores, h, c), (scores, (h, c)) or [scores, [h, c]]: the tensors in order."""
    if isinstance(out, Tensor):
        return [out]
    if isinstance(out, tuple | list):
        return [t for item in out for t in flatten_outputs(item)]
    raise ContractError(
        "outputs", f"forward returned a {type(out).__name__}: expected tensors (scores, *states)"
    )


def to_served(state: Tensor, spec: StateSpec) -> Tensor:
    if len(spec.shape) == 1:
        return state.unsqueeze(0)
    return state.movedim(spec.batch_axis, 1)


def from_served(state: Tensor, spec: StateSpec) -> Tensor:
    if len(spec.shape) == 1:
        return state.squeeze(0)
    return state.movedim(1, spec.batch_axis).contiguous()


class ServedAdapter(nn.Module):
    """The team's model behind the served signature (see the module docstring)."""

    def __init__(self, model: Callable[..., Any], contract: ModelContract) -> None:
        super().__init__()
        self.model = model
        self.contract = contract

    def call_team(self, tokens: Tensor, states: list[Tensor]) -> tuple[Tensor, list[Tensor]]:
        """The team's forward on its own layouts: (scores as returned, states as returned)."""
        x = tokens.transpose(0, 1) if self.contract.time_major else tokens
        if self.contract.states_as_tuple:
            out = self.model(x, tuple(states))
        else:
            out = self.model(x, *states)
        flat = flatten_outputs(out)
        return flat[0], flat[1:]

    def log_probs(self, scores: Tensor, tokens: Tensor) -> Tensor:
        """Scores as returned -> natural-log probabilities [B, T, V] (float32)."""
        if scores.dim() == 2:  # flattened positions, in the tokens' own order
            if self.contract.time_major:
                scores = scores.reshape(tokens.shape[1], tokens.shape[0], -1)
            else:
                scores = scores.reshape(tokens.shape[0], tokens.shape[1], -1)
        if self.contract.time_major:
            scores = scores.transpose(0, 1)
        scores = scores.float()
        if self.contract.scores == "logits" or self.contract.normalize:
            scores = torch.log_softmax(scores, dim=-1)
        return scores

    def step(self, tokens: Tensor, *states: Tensor) -> tuple[Tensor, ...]:
        specs = self.contract.states
        team = [from_served(s, spec) for s, spec in zip(states, specs, strict=True)]
        scores, new = self.call_team(tokens, team)
        out = [to_served(s, spec) for s, spec in zip(new, specs, strict=True)]
        return (self.log_probs(scores, tokens), *out)

    def score(self, tokens: Tensor, targets: Tensor, *states: Tensor) -> tuple[Tensor, ...]:
        lp, *new = self.step(tokens, *states)
        return (lp.gather(-1, targets.unsqueeze(-1)).squeeze(-1), *new)

    def forward(self, tokens: Tensor, *states: Tensor) -> tuple[Tensor, ...]:
        return self.step(tokens, *states)


class _Method(nn.Module):
    """One method of the adapter as `forward`, for the ONNX exporter."""

    def __init__(self, adapter: ServedAdapter, name: str) -> None:
        super().__init__()
        self.adapter = adapter
        self.name = name

    def forward(self, *args: Tensor) -> tuple[Tensor, ...]:
        method: Callable[..., tuple[Tensor, ...]] = getattr(self.adapter, self.name)
        return method(*args)


def served_example(contract: ModelContract, batch: int, bos_id: int) -> list[Tensor]:
    """Initial states of `batch` rows in the served layout."""
    return [to_served(torch.from_numpy(s.initial_value(batch, bos_id)), s) for s in contract.states]


@contextmanager
def _quiet_exporters() -> Iterator[None]:
    """The legacy exporter's and the tracer's notices about code that is not ours (the parity
    check that follows is what proves the graphs)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", message=".*legacy TorchScript-based ONNX export.*")
        warnings.filterwarnings("ignore", message=".*batch_size other than 1.*")
        yield


def export_onnx(
    adapter: ServedAdapter, folder: Path, vocab_size: int, bos_id: int, opset: int = OPSET
) -> dict[str, str]:
    """Writes step.onnx, score.onnx and their shared weights.bin; returns {files key: name}."""
    names = adapter.contract.state_names
    tokens = torch.randint(0, vocab_size, (2, 3), dtype=torch.long)
    states = served_example(adapter.contract, 2, bos_id)
    axes: dict[str, dict[int, str]] = {"tokens": {0: BATCH, 1: "time"}}
    axes |= {"targets": {0: BATCH, 1: "time"}, "log_probs": {0: BATCH, 1: "time"}}
    axes |= {"token_log_probs": {0: BATCH, 1: "time"}}
    axes |= {n: {1: BATCH} for n in names} | {f"{n}_out": {1: BATCH} for n in names}
    graphs = []
    for kind, args, inputs, first in (
        ("step", (tokens, *states), ["tokens", *names], "log_probs"),
        ("score", (tokens, tokens, *states), ["tokens", "targets", *names], "token_log_probs"),
    ):
        outputs = [first, *[f"{n}_out" for n in names]]
        with tempfile.TemporaryDirectory() as tmp, _quiet_exporters(), torch.no_grad():
            path = Path(tmp) / f"{kind}.onnx"
            try:
                torch.onnx.export(
                    _Method(adapter, kind).eval(),
                    args,
                    str(path),
                    dynamo=False,
                    opset_version=opset,
                    input_names=inputs,
                    output_names=outputs,
                    dynamic_axes={k: v for k, v in axes.items() if k in inputs + outputs},
                    do_constant_folding=True,
                )
            except Exception as exc:  # the exporter's many types: unsupported ops and more
                raise ContractError(
                    "export",
                    f"torch.onnx.export cannot export the module ({type(exc).__name__}: {exc}); "
                    "try format='torchscript'",
                ) from exc
            graphs.append(onnx.load_model(str(path)))
    return write_graphs(graphs, folder)


def write_graphs(graphs: list[onnx.ModelProto], folder: Path) -> dict[str, str]:
    """step and score graphs into the folder, their large tensors stored once in weights.bin."""
    write_shared_weights(graphs, folder / WEIGHTS_FILE)
    files = {"step": "step.onnx", "score": "score.onnx", "weights": WEIGHTS_FILE}
    for graph, key in zip(graphs, ("step", "score"), strict=True):
        path = folder / files[key]
        path.write_bytes(graph.SerializeToString())  # external data already written
        onnx.checker.check_model(str(path), full_check=True)
    return files


def export_torchscript(
    adapter: ServedAdapter, folder: Path, vocab_size: int, bos_id: int
) -> dict[str, str]:
    """Traces step and score into one model.ts (the team's scripted code kept as it is)."""
    tokens = torch.randint(0, vocab_size, (2, 3), dtype=torch.long)
    states = tuple(served_example(adapter.contract, 2, bos_id))
    inputs = {"step": (tokens, *states), "score": (tokens, tokens, *states)}
    with _quiet_exporters(), quiet_torchscript(), torch.no_grad():
        try:
            traced = torch.jit.trace_module(adapter.eval(), inputs, check_trace=False)
        except Exception as exc:  # tracing errors come in many types
            raise ContractError(
                "export", f"torch.jit.trace cannot trace the module ({type(exc).__name__}: {exc})"
            ) from exc
        torch.jit.save(traced, str(folder / MODEL_FILE))
    return {"model": MODEL_FILE}
