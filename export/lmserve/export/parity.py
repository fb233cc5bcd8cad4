"""Parity: an exported model against the model it came from, in one tolerance.

Every export (`export-rnn`, `export_module`, `import-onnx`, `import-torchscript`, `import-hf`)
refuses a folder whose log-probabilities differ from its source's by more than `PARITY_NATS`,
so a served model scores what its author trained. Graphs with a step and a score entry point
and carried states (recurrent, feed-forward, brought) share one comparison loop here,
`compare_step_and_score`; a transformer's cache has its own reading (`hf/parity.py`) against
the same tolerance.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np
import numpy.typing as npt

PARITY_NATS = 1e-4
"""The largest difference allowed between an exported log-prob (or state entry) and its
source's, in nats: float32 graphs reorder sums, so exact equality is not the bar, but a wrong
weight or state shows up far above it."""

Array = npt.NDArray[Any]
States = Sequence[Array]
Tokens = npt.NDArray[np.int64]
# Tokens [batch, time] and states in -> (log-probs [batch, time, vocab], states after them).
ReferenceCall = Callable[[Tokens, States], tuple[Array, Sequence[Array]]]


class ParityError(ValueError):
    """The exported model disagrees with its source beyond PARITY_NATS; says where."""


class ShapeMismatch(ParityError):
    """An exported output has another shape than the source's."""

    def __init__(self, got: tuple[int, ...], want: tuple[int, ...]) -> None:
        super().__init__(f"shape {got} where the source gives {want}")
        self.got, self.want = got, want


Quantity = Literal["log_probs", "token_log_probs", "state"]
Entry = Literal["step", "score", ""]


class ParityMismatch(ParityError):
    """The first compared quantity over the tolerance: what, by how much, in which case."""

    def __init__(
        self,
        quantity: Quantity,
        diff: float,
        case: str,
        *,
        state: str = "",
        entry: Entry = "",
        atol: float = PARITY_NATS,
    ) -> None:
        self.quantity, self.diff, self.case = quantity, diff, case
        self.state, self.entry, self.atol = state, entry, atol
        super().__init__(f"{self.label} differ by {diff:.3g} > {atol:g} ({case})")

    @property
    def label(self) -> str:
        """`log_probs`, `token_log_probs`, or `step h` / `score h` for a state."""
        return f"{self.entry} {self.state}" if self.quantity == "state" else self.quantity


@dataclass(frozen=True)
class _Found:
    """One compared quantity's largest difference in one call."""

    diff: float
    quantity: Quantity
    state: str = ""
    entry: Entry = ""


@dataclass(frozen=True)
class ParityReport:
    """The largest absolute difference seen (nats, log-probs and states) over `cases` compared
    calls covering `positions` token positions."""

    max_abs_diff: float
    cases: int
    positions: int


class Served(Protocol):
    """An exported model's two entry points, on numpy: `step` gives the log-probs of every
    token, `score` those of the targets; both return the states after the tokens."""

    def step(self, tokens: Tokens, state: States) -> tuple[Array, Sequence[Array]]: ...

    def score(
        self, tokens: Tokens, targets: Tokens, state: States
    ) -> tuple[Array, Sequence[Array]]: ...


@dataclass(frozen=True)
class Cases:
    """What to compare: batch sizes by lengths, two consecutive calls each."""

    batch_sizes: Sequence[int]
    lengths: Sequence[int]
    vocab_size: int
    state_names: Sequence[str]


def compare_step_and_score(
    reference: ReferenceCall,
    served: Served,
    cases: Cases,
    start_state: Callable[[int], States],
    rng: np.random.Generator,
    *,
    atol: float = PARITY_NATS,
) -> ParityReport:
    """Raises ParityMismatch (or ShapeMismatch) at the first case over `atol`.

    Each case starts from `start_state(batch)` (random, so the state inputs are exercised)
    and makes two calls: the second continues from the states the *served* model returned, so
    a wrong state output shows up as a wrong second call.
    """
    worst, compared, positions = 0.0, 0, 0
    for batch in cases.batch_sizes:
        for length in cases.lengths:
            ref_state = start_state(batch)
            step_state, score_state = ref_state, ref_state
            for call in (1, 2):
                shape = (batch, length)
                tokens = rng.integers(0, cases.vocab_size, shape, dtype=np.int64)
                targets = rng.integers(0, cases.vocab_size, shape, dtype=np.int64)
                ref_lp, ref_next = reference(tokens, ref_state)
                got_lp, step_state = served.step(tokens, step_state)
                got_tlp, score_state = served.score(tokens, targets, score_state)
                ref_tlp = np.take_along_axis(ref_lp, targets[..., None], axis=-1)[..., 0]
                found = [
                    _Found(max_abs_diff(got_lp, ref_lp), "log_probs"),
                    _Found(max_abs_diff(got_tlp, ref_tlp), "token_log_probs"),
                ]
                entries: tuple[tuple[Entry, States], ...] = (
                    ("step", step_state),
                    ("score", score_state),
                )
                for entry, states in entries:
                    for name, got, ref in zip(cases.state_names, states, ref_next, strict=True):
                        found.append(_Found(max_abs_diff(got, ref), "state", name, entry))
                compared += 1
                positions += batch * length
                top = max(found, key=lambda f: f.diff)
                worst = max(worst, top.diff)
                if not top.diff <= atol:  # also catches NaN
                    case = f"batch {batch}, length {length}, call {call} of 2"
                    raise ParityMismatch(
                        top.quantity, top.diff, case, state=top.state, entry=top.entry, atol=atol
                    )
                ref_state = ref_next
    return ParityReport(max_abs_diff=worst, cases=compared, positions=positions)


def max_abs_diff(got: Array, ref: Array) -> float:
    """The largest |got - ref| in float64; ShapeMismatch when the shapes differ."""
    if got.shape != ref.shape:
        raise ShapeMismatch(tuple(got.shape), tuple(ref.shape))
    if not got.size:
        return 0.0
    return float(np.max(np.abs(got.astype(np.float64) - ref.astype(np.float64))))


def log_softmax(x: Array) -> npt.NDArray[np.float64]:
    """Natural-log probabilities of scores along the last axis, in float64 (a reference's
    arithmetic, written apart from the graphs' own)."""
    x = x.astype(np.float64)
    top = x.max(axis=-1, keepdims=True)
    out: npt.NDArray[np.float64] = x - top - np.log(np.exp(x - top).sum(axis=-1, keepdims=True))
    return out
