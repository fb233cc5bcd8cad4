"""The hand-over of events from a scheduler thread to the event loop.

    poster = Poster(courier=True, name="lmserve-post-kjv")
    poster.loop = asyncio.get_running_loop()        # set by `submit`
    poster.post_events({stream: [event, ...]})      # held per `stream_interval`, then handed over
    poster.post([(stream, exc)])                    # a failure ends the stream

One `call_soon_threadsafe` per batch of streams, never one per token. For a model that steps
without the GIL a courier thread wakes the event loop during the step (`Courier`).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading

from lmserve.server.worker.generation.sequence import Event, GenerationStream

Items = list[tuple[GenerationStream, list[Event] | BaseException]]


def _deliver(items: Items) -> None:
    for stream, item in items:
        stream._put(item)


def _wake(loop: asyncio.AbstractEventLoop, items: Items) -> None:
    with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
        loop.call_soon_threadsafe(_deliver, items)


class Courier:
    """Carries event batches to the event loop from a thread of its own.

    Waking the loop (`call_soon_threadsafe` writes to its self-pipe) lets it take the GIL at
    once and write its messages, so the thread that woke it waits for the GIL meanwhile. The
    scheduler therefore only queues the batch here and goes on into the model step, which
    releases the GIL: this thread wakes the loop during the step. Batches keep their order.
    """

    def __init__(self, name: str) -> None:
        self._items: Items = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._closed = False
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def send(self, loop: asyncio.AbstractEventLoop, items: Items) -> None:
        with self._lock:
            self._loop = loop
            self._items.extend(items)
        self._ready.set()

    def close(self) -> None:
        """Delivers what was sent, then ends the thread."""
        self._closed = True
        self._ready.set()

    def _run(self) -> None:
        while True:
            self._ready.wait()
            self._ready.clear()
            closed = self._closed  # read before taking the items: nothing sent after close
            with self._lock:
                items, self._items = self._items, []
                loop = self._loop
            if items and loop is not None and not loop.is_closed():
                _wake(loop, items)
            if closed:
                return


class Poster:
    """Posts a scheduler's events to its streams on the event loop `loop`.

    For a model that keeps the GIL while it steps (the n-gram kernel) a courier would only add
    time (12% at one stream, measured), so the scheduler thread wakes the loop itself.
    """

    def __init__(self, *, courier: bool, name: str) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self._courier = Courier(name) if courier else None

    def post_events(self, events: dict[GenerationStream, list[Event]]) -> None:
        """Posts each stream's events once its `stream_interval` steps have gathered (at once
        when a sample ended); fewer messages for streams that asked for them."""
        ready: Items = []
        for stream, new in events.items():
            held = stream.hold(new)
            if held:
                ready.append((stream, held))
        if ready:
            self.post(ready)

    def post(self, items: Items) -> None:
        loop = self.loop
        if not items or loop is None or loop.is_closed():
            return
        if self._courier is not None:
            self._courier.send(loop, items)
        else:
            _wake(loop, items)

    def close(self) -> None:
        if self._courier is not None:
            self._courier.close()
