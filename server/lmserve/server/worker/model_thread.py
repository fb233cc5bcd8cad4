"""The queue and lifetime of a per-model worker thread that batches waiting requests.

Fuse streams (`fusion.steps.FusionSteps`) and autocomplete sessions
(`autocomplete.session_steps.SessionSteps`) each step one model on one thread, taking
whatever waits when a call starts; what they share is here: the waiting queue and its
condition, handing an item in (refused once closed), and closing without blocking (every
item still waiting fails as the model shutting down). Each keeps its own loop (`_run`: which
items make one call, how they are stepped).
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from typing import Any, Generic, Protocol, TypeVar

from lmserve.server.errors import ModelUnavailable
from lmserve.server.worker.handoff import settle


class Waiting(Protocol):
    """An item handed to the thread: its caller's loop and the future it awaits there."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...

    @property
    def future(self) -> asyncio.Future[Any]: ...


ItemT = TypeVar("ItemT", bound=Waiting)


class ModelThread(Generic[ItemT]):
    """A model's batching thread: `_run` (the subclass's) takes items from `_waiting` under
    `_cond` and returns once `_closed`. The thread starts with the first item, or when the
    subclass calls `_start` (once its own fields are set)."""

    def __init__(self, model: str, thread_name: str) -> None:
        self.model = model
        self._thread_name = thread_name
        self._waiting: deque[ItemT] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None

    def _start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self._thread_name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        raise NotImplementedError

    def _enqueue(self, item: ItemT) -> None:
        """Hands `item` to the thread (its future is settled there)."""
        with self._cond:
            if self._closed:
                raise ModelUnavailable(f"model {self.model!r} is shutting down")
            if self._thread is None:
                self._start()
            self._waiting.append(item)
            self._cond.notify()

    def close(self) -> None:
        """Stops the thread after the call in flight; never blocks."""
        with self._cond:
            self._closed = True
            waiting, self._waiting = list(self._waiting), deque()
            self._cond.notify()
        for item in waiting:
            settle(
                item.loop, item.future, ModelUnavailable(f"model {self.model!r} is shutting down")
            )

    def join(self, timeout: float) -> None:
        """Waits (at most `timeout` s) for the call in flight after `close`."""
        if self._thread is not None:
            self._thread.join(timeout)
