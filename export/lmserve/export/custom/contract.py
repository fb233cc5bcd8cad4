"""The contract a neural LM brought from outside must meet, stated once for every way in.

A team's model, whether a `torch.nn.Module`, an ONNX graph or a TorchScript file, is a function

    forward(tokens, *states) -> (scores, *new_states)

- `tokens`: int64 ids [batch, time] (or [time, batch] with `time_major`);
- `scores`: logits or natural-log probabilities over the vocabulary, [batch, time, V] (or
  [time, batch, V], or either flattened to [batch * time, V] as `tokens` is laid out);
- `states`: any number of arrays (an LSTM's h and c, a GRU's h, a feed-forward model's window of
  previous ids), each of a fixed shape except its batch axis, which may sit anywhere; the
  function returns the state after reading `tokens`, so reading a text in two chunks with the
  state carried across gives what one pass gives. A text starts from zeros (float states) or
  from a window filled with the `<s>` id (int64 states).

`ModelContract` describes one such model: its states (names, shapes with "batch" in place of the
batch axis, dtypes) and how to read its scores. An ONNX graph also names its inputs and outputs
(`tokens`, `scores`, each state's `input`/`output`). The same description reads from a small
YAML file (`lmserve import-onnx --contract contract.yaml`).

The server carries every state with its batch on axis 1 (`lmserve.server.backends.recurrent`):
`to_served`/`from_served` move a state between the team's layout and that one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
import numpy.typing as npt
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

BATCH = "batch"
SERVED_BATCH_AXIS = 1


class ContractError(ValueError):
    """The brought model breaks its contract; `part` names which part (for tests and logs)."""

    def __init__(self, part: str, message: str) -> None:
        super().__init__(message)
        self.part = part


class StateSpec(BaseModel):
    """One state array of the model, as the team's code lays it out.

    >>> StateSpec(name="h", shape=(2, "batch", 64)).batch_axis
    1
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    # Sizes of every axis, with "batch" written where the batch goes.
    shape: tuple[int | Literal["batch"], ...]
    dtype: Literal["float32", "int64"] = "float32"
    # Where a text starts from: zeros, or every entry the <s> id (a window of previous ids).
    initial: Literal["zeros", "bos"] | None = None
    # ONNX only: the graph's input and output for this state (default: name, name + "_out").
    input: str | None = None
    output: str | None = None

    @model_validator(mode="after")
    def _one_batch_axis(self) -> StateSpec:
        if sum(d == BATCH for d in self.shape) != 1:
            raise ValueError(f"state {self.name!r}: shape {list(self.shape)} needs one 'batch'")
        if any(d != BATCH and int(d) <= 0 for d in self.shape):
            raise ValueError(f"state {self.name!r}: shape {list(self.shape)} has a size <= 0")
        return self

    @property
    def batch_axis(self) -> int:
        return next(i for i, d in enumerate(self.shape) if d == BATCH)

    @property
    def start(self) -> Literal["zeros", "bos"]:
        return self.initial or ("bos" if self.dtype == "int64" else "zeros")

    @property
    def graph_input(self) -> str:
        return self.input or self.name

    @property
    def graph_output(self) -> str:
        return self.output or f"{self.name}_out"

    def team_shape(self, batch: int) -> tuple[int, ...]:
        return tuple(batch if d == BATCH else int(d) for d in self.shape)

    def served_shape(self) -> list[int | str]:
        """The shape the server carries (batch on axis 1; a rank-1 state gets a leading 1)."""
        others = [int(d) for d in self.shape if d != BATCH]
        if len(self.shape) == 1:
            return [1, BATCH]
        return [others[0], BATCH, *others[1:]]

    def initial_value(self, batch: int, bos_id: int) -> npt.NDArray[np.generic]:
        fill = bos_id if self.start == "bos" else 0
        return np.full(self.team_shape(batch), fill, dtype=self.dtype)

    def to_served(self, array: npt.NDArray[np.generic]) -> npt.NDArray[np.generic]:
        """The team's layout -> batch on axis 1 (numpy; the graphs do the same in their ops)."""
        if array.ndim == 1:
            return array[None, :]
        return np.moveaxis(array, self.batch_axis, SERVED_BATCH_AXIS)

    def from_served(self, array: npt.NDArray[np.generic]) -> npt.NDArray[np.generic]:
        if len(self.shape) == 1:
            return array[0]
        return np.moveaxis(array, SERVED_BATCH_AXIS, self.batch_axis)


class ModelContract(BaseModel):
    """How to call one brought model and read what it returns (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    states: tuple[StateSpec, ...] = Field(min_length=1)
    # What the model's first output holds: logits (normalised here by log_softmax) or
    # natural-log probabilities (checked to be normalised; `normalize` applies log_softmax).
    scores: Literal["logits", "log_probs"] = "logits"
    normalize: bool = False
    # tokens [time, batch] (and scores [time, batch, V]): PyTorch's seq-first RNN convention.
    time_major: bool = False
    # torch modules only: the states go in as one tuple argument, forward(tokens, (h, c)),
    # as nn.LSTM-style code often takes them, instead of one argument each.
    states_as_tuple: bool = False
    # ONNX only: the graph's token input and score output (defaults: the first of each).
    tokens_input: str | None = None
    scores_output: str | None = None

    @model_validator(mode="after")
    def _distinct_names(self) -> ModelContract:
        names = [s.name for s in self.states]
        if len(set(names)) != len(names):
            raise ValueError(f"state names repeat: {names}")
        return self

    @property
    def state_names(self) -> list[str]:
        return [s.name for s in self.states]

    def describe_states(self) -> str:
        return ", ".join(f"{s.name} {list(s.shape)} {s.dtype}" for s in self.states)

    @classmethod
    def from_yaml(cls, path: Path) -> ModelContract:
        """Reads a contract file; a bad one is refused with every problem named."""
        try:
            raw = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as exc:
            raise ContractError("contract", f"{path}: unreadable contract ({exc})") from exc
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}"
                for e in exc.errors()
            )
            raise ContractError("contract", f"{path}: {problems}") from exc
