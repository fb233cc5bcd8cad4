"""Reads Generate streams from a server until killed: a client process to run beside a benchmark.

    python bench/stream_reader.py TARGET [--tokens 100000]

It reads with `AsyncLmServeClient`, as the Generate benchmarks' clients do, one stream at a time.
"""

from __future__ import annotations

import argparse
import asyncio

from lmserve.client import AsyncLmServeClient


async def read_forever(target: str, tokens: int) -> None:
    async with AsyncLmServeClient(target) as client:
        while True:
            async for _ in client.generate("canned", max_new_tokens=tokens):
                pass


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("target")
    parser.add_argument("--tokens", type=int, default=100_000)
    args = parser.parse_args()
    asyncio.run(read_forever(args.target, args.tokens))
