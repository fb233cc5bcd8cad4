"""Handing a worker thread's outcome to the coroutine that awaits it on its event loop.

    settle(loop, future, result_or_exception)   # from any thread

Scoring passes, beam searches and autocomplete steps all finish on worker threads; the future
belongs to the event loop, so it is settled there. A future already done (its caller left) or
a loop already closed (shutdown) takes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TypeVar

T = TypeVar("T")


def settle(
    loop: asyncio.AbstractEventLoop, future: asyncio.Future[T], outcome: T | BaseException
) -> None:
    """Sets `outcome` (a result, or an exception to raise) on `future`, on `loop`."""

    def deliver() -> None:
        if future.done():
            return
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)

    if loop.is_closed():
        return
    with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
        loop.call_soon_threadsafe(deliver)
