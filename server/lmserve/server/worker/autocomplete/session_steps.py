"""Advancing autocomplete sessions through a model, many sessions per batched step.

    steps = SessionSteps("kjv-lstm", stepper)
    advanced = await steps.advance(state, [17, 4])      # states after each token, last output
    rebuilt = await steps.rebuild(context_ids)          # from <s>: final state and output

Sessions that type at the same time share forward passes: one worker thread per model takes
every waiting advance and steps them together, one token per row per call (a session that
appends three tokens rides three consecutive batched calls, next to the others). A rebuild (a
whole context read from `<s>`) is one `Stepper.prefill`. The worker keeps the model off the
event loop; outputs are natural-log next-token distributions.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from lmserve.server.backends.stepping import State, Stepper
from lmserve.server.logging_setup import log_failure
from lmserve.server.worker.foreground import Foreground
from lmserve.server.worker.handoff import settle
from lmserve.server.worker.model_thread import ModelThread

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Advanced:
    """The states after each fed token (oldest first) and the distribution after the last."""

    states: list[State]
    log_probs: npt.NDArray[np.floating]


@dataclass(eq=False)
class _Advance:
    state: State
    tokens: deque[int]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Advanced]
    states: list[State] = field(default_factory=list)
    rebuild: list[int] | None = None


class SessionSteps(ModelThread[_Advance]):
    """One model's session advances, batched on a worker thread (see the module doc)."""

    def __init__(
        self,
        model: str,
        stepper: Stepper,
        *,
        max_rows: int = 256,
        foreground: Foreground | None = None,
    ) -> None:
        super().__init__(model, f"lmserve-sessions-{model}")
        # Generation steps of the same model wait while sessions step (a keystroke first).
        self._foreground = foreground or Foreground()
        self.stepper = stepper
        self.max_rows = max_rows
        self.calls = 0  # batched model calls made (tests)
        self._start()

    async def advance(self, state: State, tokens: list[int]) -> Advanced:
        """Feeds `tokens` from `state`; at least one token."""
        assert tokens, "advance needs a token"
        return await self._submit(_Advance(state, deque(tokens), *self._future()))

    async def rebuild(self, context: list[int]) -> Advanced:
        """Reads `<s>` + context from scratch: the final state (alone) and its output."""
        item = _Advance(None, deque(), *self._future(), rebuild=list(context))
        return await self._submit(item)

    def _future(self) -> tuple[asyncio.AbstractEventLoop, asyncio.Future[Advanced]]:
        loop = asyncio.get_running_loop()
        return loop, loop.create_future()

    async def _submit(self, item: _Advance) -> Advanced:
        self._enqueue(item)
        return await item.future

    def _run(self) -> None:
        active: list[_Advance] = []
        while True:
            with self._cond:
                while not self._closed and not self._waiting and not active:
                    self._cond.wait()
                if self._closed:
                    return
                while self._waiting and len(active) < self.max_rows:
                    active.append(self._waiting.popleft())
            rebuilds = [item for item in active if item.rebuild is not None]
            steps = [item for item in active if item.rebuild is None]
            try:
                with self._foreground.busy():
                    for item in rebuilds:
                        self._rebuild(item)
                    if steps:
                        self._step(steps)
            except Exception as exc:  # a model failure fails these advances, not the worker
                log_failure(log, f"session step of {self.model}", exc)
                for item in active:
                    _resolve(item, exc)
                active = []
                continue
            active = [item for item in steps if item.tokens]

    def _rebuild(self, item: _Advance) -> None:
        assert item.rebuild is not None
        log_probs, state = self.stepper.prefill([item.rebuild])
        self.calls += 1
        _resolve(item, Advanced([state], log_probs[0]))

    def _step(self, items: list[_Advance]) -> None:
        """One batched call: the next token of every advancing session."""
        stepper = self.stepper
        tokens = np.asarray([item.tokens.popleft() for item in items], dtype=np.int64)
        state = items[0].state if len(items) == 1 else stepper.merge([i.state for i in items])
        out, new_state = stepper.step(tokens, state)
        self.calls += 1
        rows = [new_state] if len(items) == 1 else stepper.split(new_state)
        for k, (item, row) in enumerate(zip(items, rows, strict=True)):
            item.state = row
            item.states.append(row)
            if not item.tokens:
                _resolve(item, Advanced(item.states, np.array(out[k])))  # not a view


def _resolve(item: _Advance, outcome: Advanced | BaseException) -> None:
    settle(item.loop, item.future, outcome)
