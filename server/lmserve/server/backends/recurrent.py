"""What every recurrent (RNN/LSTM/GRU) backend shares, whatever runs the graph.

The feed-forward (Bengio) model is served here too: its state is the window of the last
`order - 1` ids, int64 [1, batch, order - 1], filled with `<s>` at the start. Every state array
has the batch on axis 1, whatever its dtype, so batching, splitting and reordering states
(the steppers, the scheduler, beam search, Complete sessions) need not know the model. A model
brought from outside (`lmserve.export.custom`) lists its states in the manifest, any number,
each with its own shape and dtype, already moved to that layout by the graphs it was written with.

A subclass supplies two graph calls on numpy arrays, both state in, state out:

    _run_step(tokens [B,T], state) -> (log_probs [B,T,V], state)      # full distributions
    _run_score(tokens [B,T], targets [B,T], state) -> (lp [B,T], state)  # gathered log-probs

and this module turns them into the `LanguageModelBackend` contract: `<s>` as the first input,
`</s>` scored last, right-padding (rows sorted by length, so finished rows simply drop out of
later time chunks and padding never reaches a result), and texts longer than `max_chunk_tokens`
scored chunk by chunk with the state carried across (no truncation). All scores are natural logs.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from lmserve.server.backends.base import BatchScores, EncodedBatch, FloatArray, Vocabulary
from lmserve.server.backends.segments import segment_sums
from lmserve.server.errors import ModelLoadError, Unimplemented

# One array per state name ("h", or "h" and "c"), each float32 [layers, batch, hidden]; for a
# feed-forward model one int64 [1, batch, order - 1] ("window").
RecurrentState = tuple[npt.NDArray[Any], ...]
TokenArray = npt.NDArray[np.int64]
CELLS = ("rnn", "lstm", "gru", "ffnn")
STATE_NAMES = {"lstm": ("h", "c"), "ffnn": ("window",)}
STATE_DTYPES = ("float32", "int64")
# The batch axis of every served state array, and how a manifest writes it in a shape.
BATCH_AXIS = 1
BATCH = "batch"


@dataclass(frozen=True)
class StateLayout:
    """One state array as the server carries it: batch on axis 1, the other axes fixed.

    `initial` is what a text starts from: "zeros", or "bos" (every entry the `<s>` id: a window
    of previous ids). A model brought from elsewhere (`lmserve.export.custom`) lists its states
    in the manifest (`architecture.states`); this project's own cells derive theirs.
    """

    name: str
    shape: tuple[int, ...]  # the served shape with the batch axis (1) written as -1
    dtype: str = "float32"
    initial: str = "zeros"

    def shape_for(self, batch: int) -> tuple[int, ...]:
        return tuple(batch if i == BATCH_AXIS else n for i, n in enumerate(self.shape))

    def zeros(self, batch: int, bos_id: int) -> npt.NDArray[Any]:
        fill = bos_id if self.initial == "bos" else 0
        return np.full(self.shape_for(batch), fill, dtype=self.dtype)

    @classmethod
    def from_manifest(cls, raw: Any, where: str) -> StateLayout:
        """`{name, shape: [n, batch, ...], dtype, initial}`, refused with the entry named."""
        try:
            name = str(raw["name"])
            dims = list(raw["shape"])
            dtype = str(raw.get("dtype", "float32"))
            initial = str(raw.get("initial", "bos" if dtype == "int64" else "zeros"))
        except (KeyError, TypeError, AttributeError) as exc:
            raise ModelLoadError(
                where, f"architecture.states: each entry needs a name and a shape ({exc!r})"
            ) from exc
        if len(dims) < 2 or dims[BATCH_AXIS] != BATCH or dims.count(BATCH) != 1:
            raise ModelLoadError(
                where, f"architecture.states {name!r}: shape {dims} must have 'batch' at axis 1"
            )
        if any(not isinstance(d, int) or d <= 0 for i, d in enumerate(dims) if i != BATCH_AXIS):
            raise ModelLoadError(
                where, f"architecture.states {name!r}: shape {dims}: sizes must be positive ints"
            )
        if dtype not in STATE_DTYPES:
            raise ModelLoadError(
                where, f"architecture.states {name!r}: dtype {dtype!r} is not one of {STATE_DTYPES}"
            )
        if initial not in ("zeros", "bos"):
            raise ModelLoadError(
                where, f"architecture.states {name!r}: initial {initial!r} is not zeros or bos"
            )
        shape = tuple(-1 if i == BATCH_AXIS else int(d) for i, d in enumerate(dims))
        return cls(name, shape, dtype, initial)


@dataclass(frozen=True)
class RecurrentSpec:
    """The manifest's `architecture` block, validated for serving.

    >>> RecurrentSpec.from_architecture({"cell": "gru", "vocab_size": 9, "hidden_size": 4,
    ...                                  "num_layers": 1}, "model.yaml").state_names
    ('h',)
    """

    cell: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    state_names: tuple[str, ...]
    order: int | None = None  # feed-forward models only
    # Listed in the manifest for a brought model; else derived from the cell (`layouts`).
    states: tuple[StateLayout, ...] | None = None

    @functools.cached_property
    def layouts(self) -> tuple[StateLayout, ...]:
        """Every state array's layout, in the graphs' order (built once: every batch reads it)."""
        if self.states is not None:
            return self.states
        if self.window:
            return (StateLayout("window", (1, -1, self.state_size), "int64", "bos"),)
        shape = (self.num_layers, -1, self.hidden_size)
        return tuple(StateLayout(name, shape) for name in self.state_names)

    @property
    def brought(self) -> bool:
        """Whether the model came from outside this project's trainer (its states listed)."""
        return self.states is not None

    @property
    def window(self) -> bool:
        """Whether the state is a window of ids (feed-forward) rather than float activations."""
        return self.cell == "ffnn"

    @property
    def state_size(self) -> int:
        """The last axis of every state array: hidden units, or the window's length."""
        return self.order - 1 if self.order is not None else self.hidden_size

    def state_shape(self, batch: int) -> tuple[int, int, int]:
        return (1 if self.window else self.num_layers, batch, self.state_size)

    @classmethod
    def from_architecture(cls, arch: dict[str, Any], where: str) -> RecurrentSpec:
        if "states" in arch:
            return cls._brought(arch, where)
        try:
            cell = str(arch["cell"]).lower()
            vocab_size, hidden = int(arch["vocab_size"]), int(arch["hidden_size"])
            layers = int(arch.get("num_layers", 1))
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelLoadError(
                where, f"architecture needs cell, vocab_size, hidden_size: {exc}"
            ) from exc
        if cell not in CELLS:
            raise ModelLoadError(where, f"architecture.cell {cell!r} is not one of {CELLS}")
        expected = STATE_NAMES.get(cell, ("h",))
        names = tuple(arch.get("state_names", expected))
        if names != expected:
            raise ModelLoadError(
                where, f"architecture.state_names {list(names)} for a {cell}: expected {expected}"
            )
        if min(vocab_size, hidden, layers) <= 0:
            raise ModelLoadError(where, "architecture sizes must be positive")
        order = None
        if cell == "ffnn":
            try:
                order = int(arch["order"])
            except (KeyError, TypeError, ValueError) as exc:
                raise ModelLoadError(where, f"an ffnn architecture needs an order: {exc}") from exc
            if order < 2:
                raise ModelLoadError(where, f"architecture.order {order}: 2 or more is needed")
        return cls(cell, vocab_size, hidden, layers, names, order)

    @classmethod
    def _brought(cls, arch: dict[str, Any], where: str) -> RecurrentSpec:
        """A model written by `lmserve.export.custom`: its states are listed, any shapes."""
        cell = str(arch.get("cell", "rnn")).lower()
        if cell not in CELLS:
            raise ModelLoadError(where, f"architecture.cell {cell!r} is not one of {CELLS}")
        try:
            vocab_size = int(arch["vocab_size"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelLoadError(where, f"architecture needs a vocab_size: {exc!r}") from exc
        raw = arch["states"]
        if not isinstance(raw, list) or not raw:
            raise ModelLoadError(where, "architecture.states must list at least one state")
        states = tuple(StateLayout.from_manifest(entry, where) for entry in raw)
        names = tuple(s.name for s in states)
        if len(set(names)) != len(names):
            raise ModelLoadError(where, f"architecture.states repeats a name: {list(names)}")
        if vocab_size <= 0:
            raise ModelLoadError(where, "architecture.vocab_size must be positive")
        hidden = int(arch.get("hidden_size", 0) or 0)
        layers = int(arch.get("num_layers", 0) or 0)
        return cls(cell, vocab_size, hidden, layers, names, None, states)


def read_vocab(path: Path, spec: RecurrentSpec, specials: Any) -> Vocabulary:
    """`vocab.txt`: one token per line, id = line index; its size must be the graph's."""
    try:
        words = path.read_text(encoding="utf-8").split("\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelLoadError(str(path), "unreadable vocabulary", f"{exc}") from exc
    if words and words[-1] == "":
        words.pop()
    if len(words) != spec.vocab_size:
        raise ModelLoadError(
            str(path), f"has {len(words)} tokens, architecture.vocab_size is {spec.vocab_size}"
        )
    try:
        return Vocabulary.from_words(
            words, unk=specials.unk, bos=specials.bos, eos=specials.eos, pad=specials.pad
        )
    except (KeyError, ValueError) as exc:
        raise ModelLoadError(str(path), f"vocabulary: {type(exc).__name__}", f"{exc}") from exc


class RecurrentBackend(ABC):
    """Scoring and next-token distributions over a stateless recurrent graph (natural logs)."""

    def __init__(self, spec: RecurrentSpec, vocab: Vocabulary, *, max_chunk_tokens: int) -> None:
        if max_chunk_tokens < 1:
            raise ValueError("max_chunk_tokens must be at least 1")
        self.spec = spec
        self._vocab = vocab
        self.max_chunk_tokens = max_chunk_tokens

    @property
    def vocab(self) -> Vocabulary:
        return self._vocab

    def adopt_vocabulary(self, vocab: Vocabulary) -> None:
        """Takes a codec's token strings for the same ids (a character or BPE model's
        `vocab.txt` lists them escaped: `families.codecs.check_escaped_tokens`)."""
        if len(vocab) != len(self._vocab):
            raise ValueError(f"{len(vocab)} tokens for a vocabulary of {len(self._vocab)}")
        self._vocab = vocab

    # -- what a runtime supplies -------------------------------------------------------------

    @abstractmethod
    def _run_step(
        self, tokens: TokenArray, state: RecurrentState
    ) -> tuple[npt.NDArray[np.float32], RecurrentState]:
        """tokens [B,T] -> log-probs [B,T,V] (natural log) and the state after them."""

    @abstractmethod
    def _run_score(
        self, tokens: TokenArray, targets: TokenArray, state: RecurrentState
    ) -> tuple[npt.NDArray[np.float32], RecurrentState]:
        """log P(targets[b,t] | tokens[b,:t+1]) [B,T] (natural log) and the state after them."""

    # -- the state-in/state-out contract -----------------------------------------------------

    def initial_state(self, batch: int) -> RecurrentState:
        """The state a text starts from, before `<s>` is read: zeros, or a window of `<s>`."""
        bos = self._vocab.bos_id
        return tuple(layout.zeros(batch, bos) for layout in self.spec.layouts)

    def step(
        self, tokens: npt.ArrayLike, state: RecurrentState
    ) -> tuple[npt.NDArray[np.float32], RecurrentState]:
        """tokens [B,T] -> natural-log probs [B,T,V] and the new state (T=1 to generate)."""
        return self._run_step(np.ascontiguousarray(tokens, dtype=np.int64), state)

    forward = step

    # -- scoring ---------------------------------------------------------------------------

    def score(
        self, batch: EncodedBatch, *, bos: bool = True, eos: bool = True, per_token: bool = False
    ) -> BatchScores:
        """log P(tokens [+ </s>] | <s>) per text, natural logs; `</s>` scored last when eos."""
        if not bos:
            raise Unimplemented(
                "recurrent models always read <s> first: options.bos=false is not available"
            )
        n = batch.batch_size
        lengths = np.diff(batch.offsets) + (1 if eos else 0)  # scored positions per text
        token_offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=token_offsets[1:])
        flat = np.zeros(int(token_offsets[-1]), dtype=np.float64)
        if n and len(flat):
            self._score_rows(batch, lengths, token_offsets, eos, flat)
        totals = segment_sums(flat, token_offsets)  # empty texts (any place) sum to 0
        if not per_token:
            return BatchScores(totals=totals)
        return BatchScores(totals=totals, token_log_probs=flat, token_offsets=token_offsets)

    def _score_rows(
        self,
        batch: EncodedBatch,
        lengths: npt.NDArray[np.int64],
        token_offsets: npt.NDArray[np.int64],
        eos: bool,
        out: FloatArray,
    ) -> None:
        """Fills `out` (flat per-token results) by padded, time-chunked forward passes."""
        vocab = self._vocab
        order = np.argsort(-lengths, kind="stable")  # longest first: active rows are a prefix
        order = order[lengths[order] > 0]
        width = int(lengths[order[0]])
        rows = len(order)
        # inputs <s> w1..wn (the last word is input only when </s> is not scored);
        # targets w1..wn [</s>]; padding is a valid id (0) whose results are never read.
        inputs = np.zeros((rows, width), dtype=np.int64)
        targets = np.zeros((rows, width), dtype=np.int64)
        for r, i in enumerate(order.tolist()):
            ids = batch.ids[batch.offsets[i] : batch.offsets[i + 1]]
            length = int(lengths[i])
            inputs[r, 0] = vocab.bos_id
            inputs[r, 1:length] = ids[: length - 1]
            targets[r, : len(ids)] = ids
            if eos:
                targets[r, len(ids)] = vocab.eos_id
        row_lengths = lengths[order]
        scores = np.zeros((rows, width), dtype=np.float32)
        state = self.initial_state(rows)
        chunk = self.max_chunk_tokens
        for start in range(0, width, chunk):
            active = int(np.count_nonzero(row_lengths > start))
            if active < rows:  # finished rows leave the batch; their state is no longer needed
                state = tuple(np.ascontiguousarray(s[:, :active]) for s in state)
                rows = active
            window = slice(start, start + chunk)
            lp, state = self._run_score(
                np.ascontiguousarray(inputs[:rows, window]),
                np.ascontiguousarray(targets[:rows, window]),
                state,
            )
            scores[:rows, window] = lp
        # Scatter valid positions back into text order (the mask drops the padding).
        mask = np.arange(width)[None, :] < row_lengths[:, None]
        starts = token_offsets[order]
        positions = starts[:, None] + np.arange(width)[None, :]
        out[positions[mask]] = scores[mask]

    def next_token_log_probs(self, context: Sequence[int], *, bos: bool = True) -> FloatArray:
        """log P(w | <s> context) for every id w, natural logs (shape [len(vocab)])."""
        ids = ([self._vocab.bos_id] if bos else []) + [int(i) for i in context]
        if not ids:
            raise Unimplemented("a recurrent model needs <s> or a context to predict from")
        tokens = np.asarray([ids], dtype=np.int64)
        state = self.initial_state(1)
        log_probs: npt.NDArray[np.float32] | None = None
        for start in range(0, len(ids), self.max_chunk_tokens):
            window = tokens[:, start : start + self.max_chunk_tokens]
            log_probs, state = self._run_step(np.ascontiguousarray(window), state)
        assert log_probs is not None
        return np.asarray(log_probs[0, -1], dtype=np.float64)
