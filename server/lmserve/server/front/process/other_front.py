"""One other front of `fronts: N` (see `extra_fronts`): its main, run as

    python -m lmserve.server.front.process.other_front   # its ExtraFrontConfig pickled on stdin

Kept apart from `extra_fronts` because it starts a whole front (`app.start_server`), and `app`
starts the other fronts through `extra_fronts`: with both in one module they imported each
other.
"""

from __future__ import annotations

import asyncio
import contextlib
import pickle
import signal
import sys

from lmserve.server.front.process.app import OtherFront, reload_done, start_server
from lmserve.server.front.process.extra_fronts import ExtraFrontConfig
from lmserve.server.front.workers.directory import WorkerDirectory
from lmserve.server.logging_setup import setup_logging
from lmserve.server.registry.rescan import RescanResult


async def _serve_other(config: ExtraFrontConfig) -> None:
    settings = config.settings
    running = await start_server(
        settings, other_front=OtherFront(config.index, WorkerDirectory(config.directory))
    )
    print("serving", flush=True)  # the first front waits for this line
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    reloads: set[asyncio.Task[RescanResult]] = set()

    def on_sighup() -> None:
        task = loop.create_task(running.reload())
        reloads.add(task)
        task.add_done_callback(reload_done(reloads))

    loop.add_signal_handler(signal.SIGHUP, on_sighup)
    await stop.wait()
    await running.stop(settings.grace_period_seconds)


def main() -> None:
    """One other front (see the module doc): its config comes pickled on stdin."""
    config: ExtraFrontConfig = pickle.loads(sys.stdin.buffer.read())
    setup_logging(config.settings.log_level, config.settings.log_format)
    with contextlib.suppress(ImportError):
        import setproctitle

        setproctitle.setproctitle(f"lmserve: front {config.index}")
    asyncio.run(_serve_other(config))


if __name__ == "__main__":
    main()
