"""The checks a brought model passes before its folder appears, each failure naming its part.

`check_contract` calls the team's model as it is (a `TeamModel`: the module, the original ONNX
graph, the TorchScript file) and checks what the contract promises: it runs on the stated
states, returns as many states as it takes with their shapes and dtypes, scores the
vocabulary's size, runs at any batch and time length, gives normalised log-probabilities where
it says it does, and reading a text in two chunks with the state carried equals one pass.

`check_parity` then compares the written folder (`ServedModel`: its step and score graphs) with
the team's model over several batch sizes and lengths, two consecutive calls each (the second
from the state the folder returned), to `PARITY_NATS`, through the one comparison loop of
`lmserve.export.parity`. The reference's arithmetic (layout moves,
log_softmax, gathers) is numpy's in float64, written apart from the graphs' own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from lmserve.export.custom.contract import ContractError, ModelContract
from lmserve.export.parity import (
    PARITY_NATS,
    Cases,
    ParityMismatch,
    ShapeMismatch,
    compare_step_and_score,
    log_softmax,
)

Array = npt.NDArray[Any]
# The team's model on its own terms: tokens [B, T] (batch-major: the caller's transposition is
# the model's `time_major`), states in its layout -> (scores as returned, states as returned).
TeamModel = Callable[[Array, list[Array]], tuple[Array, list[Array]]]

# A declared log-prob row must sum to 1 within this (log-sum-exp within ±NORMALISED_TOL).
NORMALISED_TOL = 1e-3
BATCH_SIZES = (1, 3)
LENGTHS = (1, 7, 25)


@dataclass(frozen=True)
class ParityFigures:
    max_abs_diff: float  # nats, over every compared log-prob and state entry
    positions: int  # compared token positions (step and score each)
    chunk_carry_max_abs_diff: float  # two chunks with the state carried vs one pass

    def as_provenance(self) -> dict[str, float]:
        return {
            "max_abs_diff_nats": self.max_abs_diff,
            "positions": float(self.positions),
            "chunk_carry_max_abs_diff_nats": self.chunk_carry_max_abs_diff,
            "atol_nats": PARITY_NATS,
        }


def _log_sum_exp(x: Array) -> Array:
    x = x.astype(np.float64)
    top = x.max(axis=-1, keepdims=True)
    return (top + np.log(np.exp(x - top).sum(axis=-1, keepdims=True)))[..., 0]


class Reference:
    """The team's model seen as the served graphs are: served states in, log-probs out."""

    def __init__(self, team: TeamModel, contract: ModelContract, vocab_size: int, bos_id: int):
        self.team = team
        self.contract = contract
        self.vocab_size = vocab_size
        self.bos_id = bos_id

    def initial(self, batch: int) -> list[Array]:
        return [s.initial_value(batch, self.bos_id) for s in self.contract.states]

    def call(self, tokens: Array, team_states: list[Array], what: str) -> tuple[Array, list[Array]]:
        """The team's model, with any failure named as the contract's `call` part."""
        try:
            scores, states = self.team(tokens, team_states)
        except ContractError:
            raise
        except Exception as exc:  # whatever the team's code or runtime raises
            shapes = ", ".join(
                f"{s.name} {list(a.shape)}"
                for s, a in zip(self.contract.states, team_states, strict=True)
            )
            raise ContractError(
                "call",
                f"the model fails on {what} (tokens {list(tokens.shape)}, {shapes}): "
                f"{type(exc).__name__}: {exc}",
            ) from exc
        return np.asarray(scores), [np.asarray(s) for s in states]

    def log_probs(self, scores: Array, tokens: Array) -> Array:
        """Scores as returned -> log-probs [B, T, V] float64 (checked shapes)."""
        b, t = tokens.shape
        c = self.contract
        if scores.ndim == 2:
            if scores.shape[0] != b * t:
                raise ContractError(
                    "scores",
                    f"scores have shape {list(scores.shape)} for tokens [{b}, {t}]: expected "
                    f"[{b * t}, V] (or [batch, time, V])",
                )
            scores = scores.reshape((t, b, -1) if c.time_major else (b, t, -1))
        elif scores.ndim != 3:
            raise ContractError(
                "scores",
                f"scores have rank {scores.ndim} (shape {list(scores.shape)}): expected "
                "[batch, time, V] or [batch * time, V]",
            )
        if c.time_major:
            scores = scores.transpose(1, 0, 2)
        if scores.shape[:2] != (b, t):
            raise ContractError(
                "scores",
                f"scores have shape {list(scores.shape)} for tokens [{b}, {t}] "
                f"({'time' if c.time_major else 'batch'}-major): the positions do not match",
            )
        if scores.shape[2] != self.vocab_size:
            raise ContractError(
                "vocabulary",
                f"the model scores {scores.shape[2]} tokens a position, the vocabulary has "
                f"{self.vocab_size}: give the vocabulary the model was trained with",
            )
        if c.scores == "logits" or c.normalize:
            return log_softmax(scores)
        return scores.astype(np.float64)

    def check_states(self, states: list[Array], batch: int, what: str) -> None:
        c = self.contract
        if len(states) != len(c.states):
            raise ContractError(
                "states",
                f"the model returns {len(states)} state(s) after the scores on {what}, the "
                f"contract lists {len(c.states)} ({c.describe_states()}): "
                + ("a state is missing" if len(states) < len(c.states) else "an extra state"),
            )
        for spec, got in zip(c.states, states, strict=True):
            want = spec.team_shape(batch)
            if tuple(got.shape) != want or got.dtype != np.dtype(spec.dtype):
                raise ContractError(
                    "states",
                    f"state {spec.name!r} comes back as {list(got.shape)} {got.dtype} on {what}, "
                    f"the contract says {list(want)} {spec.dtype}",
                )

    def run(self, tokens: Array, served: list[Array], what: str) -> tuple[Array, list[Array]]:
        """Served states in -> (log-probs [B, T, V] float64, served states out)."""
        specs = self.contract.states
        team_states = [
            np.ascontiguousarray(s.from_served(a)) for s, a in zip(specs, served, strict=True)
        ]
        scores, states = self.call(tokens, team_states, what)
        self.check_states(states, tokens.shape[0], what)
        lp = self.log_probs(scores, tokens)
        return lp, [s.to_served(a) for s, a in zip(specs, states, strict=True)]


def check_contract(reference: Reference, rng: np.random.Generator) -> float:
    """Raises ContractError naming the first broken part; returns the chunk-carry difference."""
    v = reference.vocab_size
    # Batch 3 on the first call: a batch axis laid out wrong shows here, not as a fixed axis
    # (at batch 2 a [B, 2, H] state has the shape of a [2, B, H] one).
    first = rng.integers(0, v, (3, 4), dtype=np.int64)
    start = reference.initial(3)
    served = [s.to_served(a) for s, a in zip(reference.contract.states, start, strict=True)]
    lp, _ = reference.run(first, served, "a first call")
    if reference.contract.scores == "log_probs" and not reference.contract.normalize:
        sums = _log_sum_exp(lp)
        worst = float(np.max(np.abs(sums)))
        if not worst <= NORMALISED_TOL:
            raise ContractError(
                "normalised",
                f"the scores are declared log-probs but a row's log-sum-exp is {worst:.3g}, "
                "not 0: declare scores as logits, or pass normalize=True (--normalize) to apply "
                "log_softmax",
            )
    for b, t, axis in ((5, 4, "batch"), (3, 11, "time"), (1, 1, "batch and time")):
        tokens = rng.integers(0, v, (b, t), dtype=np.int64)
        init = [
            s.to_served(a)
            for s, a in zip(reference.contract.states, reference.initial(b), strict=True)
        ]
        try:
            reference.run(tokens, init, f"batch {b}, time {t}")
        except ContractError as exc:
            raise ContractError(
                "fixed axis",
                f"the model does not run at batch {b}, time {t} (a fixed {axis} axis?): {exc}",
            ) from exc
    # A text read in two chunks, the state carried, equals one pass over it.
    tokens = rng.integers(0, v, (3, 12), dtype=np.int64)
    whole, _ = reference.run(tokens, served, "one pass of 12 tokens")
    head, state = reference.run(tokens[:, :5], served, "the first 5 tokens")
    tail, _ = reference.run(tokens[:, 5:], state, "the next 7 tokens, state carried")
    diff = float(np.max(np.abs(np.concatenate([head, tail], axis=1) - whole)))
    if not diff <= PARITY_NATS:
        raise ContractError(
            "state carry",
            f"reading 12 tokens as 5 + 7 with the returned state carried differs from one pass "
            f"by {diff:.3g} nats (> {PARITY_NATS:g}): the states returned are not the states after "
            "the tokens (check their order and the batch axis)",
        )
    return diff


class ServedModel:
    """The written folder's step and score graphs (ONNX Runtime, or the traced model.ts)."""

    def __init__(self, folder: Path, contract: ModelContract, fmt: str) -> None:
        self.names = contract.state_names
        self.fmt = fmt
        if fmt == "onnx":
            import onnxruntime as ort  # type: ignore[import-untyped,unused-ignore]

            options = ort.SessionOptions()
            options.intra_op_num_threads = 1
            cpu = ["CPUExecutionProvider"]
            self._step = ort.InferenceSession(str(folder / "step.onnx"), options, providers=cpu)
            self._score = ort.InferenceSession(str(folder / "score.onnx"), options, providers=cpu)
        else:
            from lmserve.export.rnn.to_torchscript import load_torchscript

            self._module = load_torchscript(folder / "model.ts")

    def step(self, tokens: Array, states: Sequence[Array]) -> tuple[Array, list[Array]]:
        if self.fmt == "onnx":
            out = self._step.run(
                None, {"tokens": tokens, **dict(zip(self.names, states, strict=True))}
            )
            return out[0], list(out[1:])
        return self._torch("step", [tokens, *states])

    def score(
        self, tokens: Array, targets: Array, states: Sequence[Array]
    ) -> tuple[Array, list[Array]]:
        if self.fmt == "onnx":
            feeds = {
                "tokens": tokens,
                "targets": targets,
                **dict(zip(self.names, states, strict=True)),
            }
            out = self._score.run(None, feeds)
            return out[0], list(out[1:])
        return self._torch("score", [tokens, targets, *states])

    def _torch(self, method: str, args: list[Array]) -> tuple[Array, list[Array]]:
        import torch

        with torch.no_grad():
            first, *rest = getattr(self._module, method)(
                *[torch.from_numpy(np.ascontiguousarray(a)) for a in args]
            )
        return first.numpy(), [r.numpy() for r in rest]


def random_served_state(reference: Reference, batch: int, rng: np.random.Generator) -> list[Array]:
    """A random start (not the initial one), so the state inputs are really exercised."""
    out = []
    for spec in reference.contract.states:
        shape = spec.team_shape(batch)
        if spec.dtype == "int64":
            team = rng.integers(0, reference.vocab_size, shape, dtype=np.int64)
        else:
            team = (0.5 * rng.standard_normal(shape)).astype(np.float32)
        out.append(np.ascontiguousarray(spec.to_served(team)))
    return out


def check_parity(
    reference: Reference, served: ServedModel, rng: np.random.Generator, chunk_carry: float
) -> ParityFigures:
    """Raises ContractError("parity") naming the first case over PARITY_NATS; returns the
    figures (the loop is `lmserve.export.parity.compare_step_and_score`)."""
    contract = reference.contract
    cases = Cases(BATCH_SIZES, LENGTHS, reference.vocab_size, contract.state_names)
    try:
        report = compare_step_and_score(
            lambda tokens, states: reference.run(tokens, list(states), f"batch {len(tokens)}"),
            served,
            cases,
            lambda batch: random_served_state(reference, batch, rng),
            rng,
        )
    except ShapeMismatch as exc:
        raise ContractError(
            "parity", f"the folder gives shape {list(exc.got)}, the model {list(exc.want)}"
        ) from None
    except ParityMismatch as exc:
        what = {"log_probs": "log_probs", "token_log_probs": "scores"}.get(exc.quantity)
        raise ContractError(
            "parity",
            f"the written folder's {what or f'state {exc.state}'} differ from the model's own "
            f"by {exc.diff:.3g} > {exc.atol:g} ({exc.case})",
        ) from None
    return ParityFigures(report.max_abs_diff, report.positions, chunk_carry)
