"""cProfile of an engine worker's per-token path: the scheduler thread of a real `EngineCore`
with the worker's own frames (`WirePoster`, `_WireStream`, protobuf rendering, `sendall` to a
socket a thread drains), `--streams` plain-sampling streams of `--tokens` tokens on kjv-lstm,
no front and no gRPC. Prints the scheduler thread's top functions and its CPU per token beside
the raw `Stepper.step` at the same batch.

    python bench/profile_generate_worker.py [--streams 32] [--tokens 256] [--top 30]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import pstats
import socket
import statistics
import threading
import time
from typing import Any

from common import DEFAULT_LSTM, default_model, log


def _drain(sock: socket.socket) -> None:
    while sock.recv(1 << 20):
        pass


def _raw_step_cpu_per_row(stepper: Any, batch: int, steps: int = 30) -> float:
    import numpy as np

    rng = np.random.default_rng(0)
    _, state = stepper.prefill([[int(t)] for t in rng.integers(3, len(stepper.vocab), batch)])
    tokens = rng.integers(3, len(stepper.vocab), batch)
    stepper.step(tokens, state)
    out = []
    for _ in range(3):
        start = time.process_time()
        for _ in range(steps):
            stepper.step(tokens, state)
        out.append((time.process_time() - start) / (steps * batch))
    return statistics.median(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()

    from lmserve.server.decoding.params import GenerateParams, StoppingParams
    from lmserve.server.registry.repository import LoadOptions, load_entry
    from lmserve.server.settings import Settings
    from lmserve.server.shared import protocol as p
    from lmserve.server.shared.stats import EngineStats
    from lmserve.server.worker import process as worker
    from lmserve.server.worker.core import EngineCore
    from lmserve.server.worker.generation import scheduler
    from lmserve.server.worker.limits import EngineLimits

    settings = Settings()
    entry = load_entry(default_model(DEFAULT_LSTM), LoadOptions.from_settings(settings), {})
    profile = cProfile.Profile()
    thread_cpu: list[float] = []
    original = scheduler.GenerationScheduler._run

    def profiled_run(self: Any) -> None:  # the scheduler thread, profiled throughout
        start = time.thread_time()
        profile.enable()
        try:
            original(self)
        finally:
            profile.disable()
            thread_cpu.append(time.thread_time() - start)

    scheduler.GenerationScheduler._run = profiled_run  # type: ignore[method-assign]
    core = EngineCore(
        entry, EngineLimits.from_settings(settings), EngineStats(entry.name),
        poster=worker.WirePoster(),
    )  # fmt: skip
    ours, theirs = socket.socketpair()
    threading.Thread(target=_drain, args=(theirs,), daemon=True).start()
    loop = asyncio.new_event_loop()
    server = worker._WorkerServer(core, worker._Sender(ours), loop, asyncio.Event())
    params = GenerateParams(StoppingParams(max_new_tokens=args.tokens, ignore_eos=True))

    async def run() -> float:
        started = time.process_time()
        for sid in range(args.streams):
            server.dispatch(p.Generate(sid, [], params, None, time.time()))
        while server.streams:
            for stream in list(server.streams.values()):
                stream.took(stream.handed)  # the front took everything: no backpressure
            await asyncio.sleep(0.002)
        return time.process_time() - started

    process_cpu = loop.run_until_complete(run())
    core.close()
    core.join(5.0)
    tokens = args.streams * args.tokens
    raw = _raw_step_cpu_per_row(core.stepper, args.streams)
    log(
        f"{tokens} tokens: process CPU {1000 * process_cpu / tokens:.3f} ms/token, scheduler "
        f"thread {1000 * thread_cpu[0] / tokens:.3f} ms/token; raw step {1000 * raw:.3f} ms/row"
    )
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(args.top)
    print(out.getvalue())


if __name__ == "__main__":
    main()
