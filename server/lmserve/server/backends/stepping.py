"""One token at a time over any backend: the uniform interface generation is written against.

A `Stepper` keeps no state of its own (the backend contract: state in, state out). A batch state
can be split into per-sequence states and merged back in any order, so a scheduler adds and
removes sequences between steps and beam search reorders (and duplicates) beams:

    lp, state = stepper.prefill([[5, 6], [7]])        # log P(next | <s> prompt) [2, V], nats
    lp, state = stepper.step(np.array([3, 4]), state)  # feed one token per row
    lp, state = stepper.feed([[8, 9], [3]], state)    # feed several tokens per row (prefill
                                                      # in chunks: prefill = feed from the start)
    a, b = stepper.split(state)
    state = stepper.merge([b, a, a])                   # reorder and duplicate rows
    state = stepper.select(state, np.array([1, 0, 0])) # the same, in one gather

Implementations:
- `RecurrentStepper`: the state is the backend's tuple of arrays with the batch on axis 1
  (float32 [layers, batch, hidden], or a feed-forward model's int64 window [1, batch, order-1]);
  a step is one batched graph call with T = 1.
- `ContextStepper`: any backend with `next_token_log_probs(context)`; the state is each row's
  token history (with an explicit `<s>`), kept to the last `max_context` ids. For an n-gram model
  that is the last order-1 ids (KenLM's state), and a step is one batched call
  (`next_token_log_probs_batch`, float32, in C); other backends cost one distribution per
  distinct context in the batch (rows sharing a context, like beams or samples of one prompt,
  share it).
- `KvStepper` (`kv_stepping`): a transformer; the state is each row's key/value cache,
  left-padded, and a step is one batched graph call with T = 1.
- `SharedKvStepper` (`shared_kv_stepping`): a transformer whose graph appends to its cache in
  place; the state is rows of pooled buffers (a value: kept states are never overwritten).
- `InterpolatedStepper`: one stepper per component, states side by side, the distributions mixed
  by log sum_i w_i p_i over the common vocabulary.

A model's family picks one (`families.catalog.make_stepper`). All log-probabilities are
natural logs.

A stepper may also offer exact word lookups (`WordLookup`, found by `word_lookup(stepper)`):
log P(token | state) and the next state per (state, token), with no distribution computed.
Rescoring that needs a few tokens' log-probs per state (lattice arcs, Fuse's token and
candidate log-probs) uses them where a stepper has them: the n-gram model's, whose
distribution costs a pass over the words after the context while a lookup is a few probes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from lmserve.server.backends.base import FloatArray, LanguageModelBackend, Vocabulary
from lmserve.server.backends.feed_groups import feed_in_groups
from lmserve.server.backends.interpolated import InterpolatedBackend
from lmserve.server.backends.recurrent import RecurrentBackend, RecurrentState
from lmserve.server.errors import Unimplemented

IndexArray = npt.NDArray[np.int64]

# A stepper's model state, opaque to everything above the stepper: the scheduler, the prefill,
# beam search and the autocomplete sessions only carry it between the stepper's own calls
# (`step`, `feed`, `split`, `merge`, `select`) and never read it. Each stepper has its own
# (`RecurrentState`, `KvState`, a `ContextStepper`'s histories, an `InterpolatedStepper`'s
# tuple of its components'). It stays `Any`, named once here, rather than a type parameter of
# `Stepper`: the model's family picks the stepper at load time (`make_stepper`), so every
# holder of one would be generic in a state type that no caller can name; and no narrower type
# fits (a stepper whose methods take `RecurrentState` does not implement a protocol whose
# methods take `object`).
State = Any


@dataclass(frozen=True)
class HistoryKey:
    """What a model's next-token distribution depends on, so that histories can be merged
    exactly (lattice rescoring): at most the last `window` tokens, and of those only the ones
    `key(recent)` keeps (for a back-off n-gram, KenLM's minimised state: the longest suffix the
    model holds an entry for; any longer history gives the same distributions). A model whose
    state is its whole history (recurrent, transformer) has none."""

    window: int
    key: Callable[[tuple[int, ...]], tuple[int, ...]]


# A `WordLookup`'s state: hashable, and minimised (equal states give equal distributions, so
# histories that reach equal states may be merged exactly).
LookupState = Any


@runtime_checkable
class WordLookup(Protocol):
    """Exact next-token log-probs of given tokens, without whole distributions.

    Each value equals the stepper's distribution entry (its float32 value) for the same
    history, so a rescorer may use either and answer the same; the state after a token is the
    model's minimised state (for an n-gram model KenLM's: `NgramModel.score_next`).
    """

    def lookup_start(self, *, bos: bool) -> LookupState:
        """The state after `<s>` (bos), or before anything was read."""
        ...

    def score_next(
        self, states: Sequence[LookupState], tokens: Sequence[int]
    ) -> tuple[list[float], list[LookupState]]:
        """Per row: log P(token | state) (nats) and the state after the token."""
        ...

    def state_distributions(self, states: Sequence[LookupState]) -> npt.NDArray[np.float32]:
        """Each state's whole next-token distribution, float32 [len(states), V] (the
        stepper's rows: what a top k needs)."""
        ...


class Stepper(Protocol):
    """Generation over one backend, one token per row per step (natural-log probabilities).

    `releases_gil`: whether `step` spends its time outside the GIL (ONNX Runtime, torch), so
    that other Python work can run during it (the scheduler streams tokens meanwhile).
    `costly_prompts`: whether `feed` costs model compute per token (a recurrent net runs its
    graph over every prompt token; an n-gram state is only its last ids), so a scheduler bounds
    the time of a prompt chunk only where it grows with the chunk.
    """

    releases_gil: bool
    costly_prompts: bool

    @property
    def vocab(self) -> Vocabulary: ...

    def initial_state(self, batch: int) -> State:
        """The state before anything, `<s>` included, was read."""
        ...

    def step(self, tokens: npt.ArrayLike, state: State) -> tuple[FloatArray, State]:
        """tokens [B] -> log P(next | history, token) [B, V] and the state after the token."""
        ...

    def prefill(
        self, prompts: Sequence[Sequence[int]], *, bos: bool = True
    ) -> tuple[FloatArray, State]:
        """Reads `[<s>] prompt` per row: the next-token log-probs [B, V] and the state."""
        ...

    def feed(self, chunks: Sequence[Sequence[int]], state: State) -> tuple[FloatArray, State]:
        """Reads each row's tokens (one at least) after `state`: the log-probs after each row's
        last token [B, V] and the new state. `prefill` in pieces: a scheduler reads a long
        prompt a chunk per iteration, between the steps of running sequences."""
        ...

    def split(self, state: State) -> list[State]:
        """A batch state -> one state per row (each a batch of one)."""
        ...

    def merge(self, states: Sequence[State]) -> State:
        """Per-row (or any batch) states -> one batch state, rows in the given order."""
        ...

    def select(self, state: State, rows: npt.ArrayLike) -> State:
        """The batch state of rows `rows` (repeats allowed): beams reordered in one gather."""
        ...


@runtime_checkable
class TruncatingStepper(Stepper, Protocol):
    """A stepper whose state goes back by cutting it, with no model call (a key/value cache
    holds every earlier position): a Complete session keeps one state, not its last few."""

    def truncate(self, state: State, count: int) -> State:
        """The state before each row's last `count` tokens."""
        ...


class RecurrentStepper:
    """Steps a recurrent (or feed-forward) backend; its state is a tuple of arrays, batch on
    axis 1."""

    releases_gil = True  # ONNX Runtime and torch compute without the GIL
    costly_prompts = True  # the graph runs over every prompt token

    def __init__(self, backend: RecurrentBackend) -> None:
        self.backend = backend

    @property
    def vocab(self) -> Vocabulary:
        return self.backend.vocab

    def initial_state(self, batch: int) -> RecurrentState:
        return self.backend.initial_state(batch)

    def step(self, tokens: npt.ArrayLike, state: RecurrentState) -> tuple[FloatArray, State]:
        ids = np.asarray(tokens, dtype=np.int64).reshape(-1, 1)
        log_probs, new_state = self.backend.step(ids, state)
        # The model's own precision (float32): sampling copies it once anyway.
        return np.ascontiguousarray(log_probs[:, 0, :]), new_state

    def prefill(
        self, prompts: Sequence[Sequence[int]], *, bos: bool = True
    ) -> tuple[FloatArray, RecurrentState]:
        inputs = [([self.vocab.bos_id] if bos else []) + [int(t) for t in p] for p in prompts]
        if any(not row for row in inputs):
            raise Unimplemented("a recurrent model needs <s> or a prompt to predict from")
        return self.feed(inputs, self.initial_state(len(inputs)))

    def feed(
        self, chunks: Sequence[Sequence[int]], state: RecurrentState
    ) -> tuple[FloatArray, RecurrentState]:
        # Windows of max_chunk_tokens counted from each row's first token here.
        return feed_in_groups(
            chunks,
            state,
            window=self.backend.max_chunk_tokens,
            forward=self._last_log_probs,
            select=self.select,
            merge=self.merge,
        )

    def _last_log_probs(
        self, tokens: npt.NDArray[np.int64], state: RecurrentState
    ) -> tuple[FloatArray, RecurrentState]:
        log_probs, new_state = self.backend.step(tokens, state)
        return np.ascontiguousarray(log_probs[:, -1, :]), new_state

    def split(self, state: RecurrentState) -> list[RecurrentState]:
        batch = state[0].shape[1]
        return [tuple(np.ascontiguousarray(s[:, i : i + 1]) for s in state) for i in range(batch)]

    def merge(self, states: Sequence[RecurrentState]) -> RecurrentState:
        if not states:
            return self.initial_state(0)
        return tuple(
            np.ascontiguousarray(np.concatenate([st[k] for st in states], axis=1))
            for k in range(len(states[0]))
        )

    def select(self, state: RecurrentState, rows: npt.ArrayLike) -> RecurrentState:
        index = np.asarray(rows, dtype=np.int64)
        return tuple(np.ascontiguousarray(s[:, index]) for s in state)


ContextState = tuple[tuple[int, ...], ...]


class ContextStepper:
    """Steps any backend through `next_token_log_probs`; the state is each row's recent ids.

    Each row's context starts with an explicit `<s>` (when bos) and is cut to the last
    `max_context` ids (None: the whole history). A backend with `next_token_log_probs_batch`
    (the n-gram engine) gets one call for the whole batch and returns float32 rows; any other is
    asked once per distinct context in the batch, a tight loop (float64 rows).
    """

    releases_gil = False  # the n-gram kernel keeps it for a step's batch (too short to drop)
    costly_prompts = False  # a prompt costs one distribution per row, whatever its length

    def __init__(
        self,
        backend: LanguageModelBackend,
        *,
        max_context: int | None = None,
        lookup: WordLookup | None = None,
    ) -> None:
        self.backend = backend
        self.max_context = max_context
        # Exact lookups over the same model (the n-gram family gives its model's).
        self.word_lookup = lookup

    @property
    def vocab(self) -> Vocabulary:
        return self.backend.vocab

    def _cut(self, context: tuple[int, ...]) -> tuple[int, ...]:
        if self.max_context is None:
            return context
        return context[-self.max_context :] if self.max_context else ()

    def initial_state(self, batch: int) -> ContextState:
        return ((),) * batch

    def _distributions(self, state: ContextState) -> FloatArray:
        # `<s>` is already in the context when the row started with one.
        batched = getattr(self.backend, "next_token_log_probs_batch", None)
        if batched is not None:
            # One call for every row: the kernel copies a row whose context an earlier row has
            # (no gather here, which would copy every row once more).
            result: FloatArray = batched(state, bos=False)
            return result
        out = np.empty((len(state), len(self.vocab)), dtype=np.float64)
        cache: dict[tuple[int, ...], FloatArray] = {}
        for i, context in enumerate(state):
            row = cache.get(context)
            if row is None:
                row = cache[context] = self.backend.next_token_log_probs(context, bos=False)
            out[i] = row
        return out

    def step(self, tokens: npt.ArrayLike, state: ContextState) -> tuple[FloatArray, State]:
        ids = np.asarray(tokens, dtype=np.int64).reshape(-1).tolist()
        if len(ids) != len(state):
            raise ValueError(f"{len(ids)} tokens for a state of {len(state)} rows")
        new_state = tuple(self._cut((*ctx, t)) for ctx, t in zip(state, ids, strict=True))
        return self._distributions(new_state), new_state

    def prefill(
        self, prompts: Sequence[Sequence[int]], *, bos: bool = True
    ) -> tuple[FloatArray, ContextState]:
        head = (self.vocab.bos_id,) if bos else ()
        state = tuple(self._cut((*head, *(int(t) for t in p))) for p in prompts)
        return self._distributions(state), state

    def feed(
        self, chunks: Sequence[Sequence[int]], state: ContextState
    ) -> tuple[FloatArray, ContextState]:
        if len(chunks) != len(state):
            raise ValueError(f"{len(chunks)} chunks for a state of {len(state)} rows")
        new_state = tuple(
            self._cut((*ctx, *(int(t) for t in chunk)))
            for ctx, chunk in zip(state, chunks, strict=True)
        )
        return self._distributions(new_state), new_state

    def split(self, state: ContextState) -> list[ContextState]:
        return [(ctx,) for ctx in state]

    def merge(self, states: Sequence[ContextState]) -> ContextState:
        return tuple(ctx for st in states for ctx in st)

    def select(self, state: ContextState, rows: npt.ArrayLike) -> ContextState:
        return tuple(state[int(i)] for i in np.asarray(rows).reshape(-1))


def word_lookup(stepper: Stepper) -> WordLookup | None:
    """The stepper's exact word lookups, or None where it only gives whole distributions."""
    lookup = getattr(stepper, "word_lookup", None)
    return lookup if isinstance(lookup, WordLookup) else None


InterpolatedState = tuple[State, ...]


class InterpolatedStepper:
    """Steps each component and mixes: log sum_i w_i p_i(w) over the common vocabulary.

    Common ids map to component ids by token string (a word a component lacks is its `<unk>`),
    as `InterpolatedBackend` scores; the state is the tuple of the components' states.
    """

    def __init__(self, backend: InterpolatedBackend, parts: Sequence[Stepper]) -> None:
        if len(parts) != len(backend.components):
            raise ValueError(f"{len(parts)} steppers for {len(backend.components)} components")
        self.backend = backend
        self.parts = list(parts)
        # Mostly outside the GIL when a neural component dominates the step.
        self.releases_gil = any(p.releases_gil for p in self.parts)
        self.costly_prompts = any(p.costly_prompts for p in self.parts)
        words = backend.vocab.words
        self._maps = [
            np.array([b.vocab.index.get(w, b.vocab.unk_id) for w in words], dtype=np.int64)
            for b in backend.components
        ]
        with np.errstate(divide="ignore"):
            self._log_weights = np.log(backend.weights)

    @property
    def vocab(self) -> Vocabulary:
        return self.backend.vocab

    def _mix(self, rows: Sequence[FloatArray]) -> FloatArray:
        mixed: FloatArray | None = None
        for k, lp in enumerate(rows):
            term = lp[:, self._maps[k]] + self._log_weights[k]
            mixed = term if mixed is None else np.logaddexp(mixed, term)
        assert mixed is not None
        return mixed

    def initial_state(self, batch: int) -> InterpolatedState:
        return tuple(p.initial_state(batch) for p in self.parts)

    def step(self, tokens: npt.ArrayLike, state: InterpolatedState) -> tuple[FloatArray, State]:
        ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
        results = [p.step(m[ids], s) for p, m, s in zip(self.parts, self._maps, state, strict=True)]
        return self._mix([lp for lp, _ in results]), tuple(s for _, s in results)

    def prefill(
        self, prompts: Sequence[Sequence[int]], *, bos: bool = True
    ) -> tuple[FloatArray, InterpolatedState]:
        results = [
            p.prefill([m[np.asarray(q, dtype=np.int64)].tolist() for q in prompts], bos=bos)
            for p, m in zip(self.parts, self._maps, strict=True)
        ]
        return self._mix([lp for lp, _ in results]), tuple(s for _, s in results)

    def feed(
        self, chunks: Sequence[Sequence[int]], state: InterpolatedState
    ) -> tuple[FloatArray, InterpolatedState]:
        results = [
            p.feed([m[np.asarray(c, dtype=np.int64)].tolist() for c in chunks], s)
            for p, m, s in zip(self.parts, self._maps, state, strict=True)
        ]
        return self._mix([lp for lp, _ in results]), tuple(s for _, s in results)

    def split(self, state: InterpolatedState) -> list[InterpolatedState]:
        per_part = [p.split(s) for p, s in zip(self.parts, state, strict=True)]
        return [tuple(rows) for rows in zip(*per_part, strict=True)]

    def merge(self, states: Sequence[InterpolatedState]) -> InterpolatedState:
        return tuple(p.merge([st[k] for st in states]) for k, p in enumerate(self.parts))

    def select(self, state: InterpolatedState, rows: npt.ArrayLike) -> InterpolatedState:
        return tuple(p.select(s, rows) for p, s in zip(self.parts, state, strict=True))
