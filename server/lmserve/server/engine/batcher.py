"""Micro-batching: concurrent scoring requests for one model share one forward pass.

    batcher = MicroBatcher(backend, BatchLimits(max_texts=256, max_tokens=16384, max_wait_ms=2))
    scorer = Scorer(batcher.backend, tokenizer)         # a backend whose score() is batched
    scored = await batcher.run(lambda: scorer.score_texts(texts, options), metrics, "kjv-lstm")

`run` executes the (synchronous) scoring call in a request thread, so tokenizing and assembling
results stay ordinary code and the event loop keeps accepting RPCs. When that call reaches
`backend.score`, the batch is put on the model's asyncio queue and the thread waits. One task per
model takes the first waiting batch, collects more until `max_texts`/`max_tokens` or until
`max_wait_ms` has passed, concatenates them, runs one forward pass in a worker thread, and hands
each request its slice. A forward that fails is retried request by request, so an error belongs
to the request that caused it alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

import numpy as np

from lmserve.server.backends.base import BatchScores, EncodedBatch, LanguageModelBackend
from lmserve.server.metrics import Metrics

T = TypeVar("T")


@dataclass(frozen=True)
class BatchLimits:
    """How much one forward pass may merge, and how long the first request waits for company."""

    max_texts: int = 256
    max_tokens: int = 16_384
    max_wait_ms: float = 2.0


@dataclass
class _Pending:
    batch: EncodedBatch
    bos: bool
    eos: bool
    per_token: bool
    future: Future[BatchScores]
    enqueued: float = field(default_factory=time.perf_counter)

    @property
    def texts(self) -> int:
        return self.batch.batch_size

    @property
    def tokens(self) -> int:  # inputs including <s>/</s>: what the forward pass costs
        return len(self.batch.ids) + 2 * self.batch.batch_size


def merge_batches(batches: Sequence[EncodedBatch]) -> EncodedBatch:
    """One batch holding every text of `batches`, in order."""
    if len(batches) == 1:
        return batches[0]
    shifts = np.cumsum([0] + [len(b.ids) for b in batches[:-1]])
    offsets = np.concatenate(
        [np.zeros(1, dtype=np.int64)]
        + [b.offsets[1:] + s for b, s in zip(batches, shifts, strict=True)]
    )
    return EncodedBatch(
        ids=np.concatenate([b.ids for b in batches]),
        offsets=offsets,
        oov=np.concatenate([b.oov for b in batches]),
    )


def split_scores(
    scores: BatchScores, sizes: Sequence[int], per_token: Sequence[bool]
) -> list[BatchScores]:
    """The results of a merged batch, back per request (`sizes` texts each)."""
    parts = []
    start = 0
    for n, wants_tokens in zip(sizes, per_token, strict=True):
        totals = scores.totals[start : start + n]
        if wants_tokens and scores.token_offsets is not None:
            assert scores.token_log_probs is not None
            offsets = scores.token_offsets[start : start + n + 1]
            lo, hi = int(offsets[0]), int(offsets[-1])
            lengths = None if scores.ngram_lengths is None else scores.ngram_lengths[lo:hi]
            parts.append(BatchScores(totals, scores.token_log_probs[lo:hi], offsets - lo, lengths))
        else:
            parts.append(BatchScores(totals))
        start += n
    return parts


class BatchedBackend:
    """The backend seen by the scorer: `score` goes through the batcher, the rest is direct."""

    def __init__(self, inner: LanguageModelBackend, batcher: MicroBatcher) -> None:
        self.inner = inner
        self._batcher = batcher

    @property
    def vocab(self) -> Any:
        return self.inner.vocab

    def score(
        self, batch: EncodedBatch, *, bos: bool = True, eos: bool = True, per_token: bool = False
    ) -> BatchScores:
        return self._batcher.submit(batch, bos=bos, eos=eos, per_token=per_token)

    def __getattr__(self, name: str) -> Any:  # next_token_log_probs, step, initial_state...
        return getattr(self.inner, name)


class MicroBatcher:
    """Merges concurrent `score` calls on one backend into shared forward passes."""

    def __init__(
        self,
        backend: LanguageModelBackend,
        limits: BatchLimits,
        *,
        request_threads: int = 64,
    ) -> None:
        self.inner = backend
        self.limits = limits
        self.backend = BatchedBackend(backend, self)
        # Threads that run whole scoring calls (mostly waiting for their batch).
        self._requests = ThreadPoolExecutor(request_threads, thread_name_prefix="lmserve-req")
        # One forward pass at a time per model: sessions are configured for the whole machine.
        self._forward = ThreadPoolExecutor(1, thread_name_prefix="lmserve-forward")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue[_Pending] | None = None
        self._worker: asyncio.Task[None] | None = None
        self._metrics: Metrics | None = None
        self._model = ""
        self._direct_lock = threading.Lock()

    async def run(self, fn: Callable[[], T], metrics: Metrics | None = None, model: str = "") -> T:
        """Runs `fn` in a request thread; its backend.score calls are micro-batched."""
        self._start(metrics, model)
        return await asyncio.get_running_loop().run_in_executor(self._requests, fn)

    def _start(self, metrics: Metrics | None, model: str) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._worker is None or self._worker.done():
            self._loop = loop
            self._queue = asyncio.Queue()
            self._worker = loop.create_task(self._work(), name=f"lmserve-batcher-{model}")
        if metrics is not None:
            self._metrics, self._model = metrics, model

    def submit(self, batch: EncodedBatch, *, bos: bool, eos: bool, per_token: bool) -> BatchScores:
        """Called from a request thread: waits for this batch's share of a forward pass."""
        loop, queue = self._loop, self._queue
        if loop is None or queue is None or not loop.is_running() or _on_loop(loop):
            # Not serving (a command, a test) or called on the loop itself: score directly.
            with self._direct_lock:
                return self.inner.score(batch, bos=bos, eos=eos, per_token=per_token)
        future: Future[BatchScores] = Future()
        loop.call_soon_threadsafe(queue.put_nowait, _Pending(batch, bos, eos, per_token, future))
        return future.result()

    async def _work(self) -> None:
        assert self._queue is not None
        queue = self._queue
        held: _Pending | None = None
        while True:
            first = held if held is not None else await queue.get()
            items, held = await self._collect(queue, first)
            try:
                await self._run_batch(items)
            except Exception as exc:  # a bug here must not leave request threads waiting
                for item in items:
                    if not item.future.done():
                        item.future.set_exception(exc)

    async def _collect(
        self, queue: asyncio.Queue[_Pending], first: _Pending
    ) -> tuple[list[_Pending], _Pending | None]:
        """The first request plus whatever arrives within the wait, up to the limits."""
        limits = self.limits
        items, texts, tokens = [first], first.texts, first.tokens
        deadline = time.perf_counter() + limits.max_wait_ms / 1000.0
        while texts < limits.max_texts and tokens < limits.max_tokens:
            try:
                item = queue.get_nowait()
            except asyncio.QueueEmpty:
                remaining = deadline - time.perf_counter()
                if remaining <= 0:
                    break
                try:
                    item = await asyncio.wait_for(queue.get(), remaining)
                except TimeoutError:
                    break
            if texts + item.texts > limits.max_texts or tokens + item.tokens > limits.max_tokens:
                return items, item  # it starts the next batch
            items.append(item)
            texts += item.texts
            tokens += item.tokens
        return items, None

    async def _run_batch(self, items: list[_Pending]) -> None:
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        # Requests with different options cannot share a pass; group them (usually one group).
        groups: dict[tuple[bool, bool], list[_Pending]] = {}
        for item in items:
            groups.setdefault((item.bos, item.eos), []).append(item)
        for (bos, eos), group in groups.items():
            if self._metrics is not None:
                for item in group:
                    self._metrics.queue_duration.labels(model=self._model).observe(
                        started - item.enqueued
                    )
                self._metrics.batch_size.labels(model=self._model).observe(
                    sum(i.texts for i in group)
                )
            per_token = any(i.per_token for i in group)
            merged = merge_batches([i.batch for i in group])
            try:
                scores = await loop.run_in_executor(
                    self._forward,
                    partial(self.inner.score, merged, bos=bos, eos=eos, per_token=per_token),
                )
            except Exception:
                await self._one_by_one(group, bos, eos)
                continue
            parts = split_scores(scores, [i.texts for i in group], [i.per_token for i in group])
            for item, part in zip(group, parts, strict=True):
                item.future.set_result(part)

    async def _one_by_one(self, group: list[_Pending], bos: bool, eos: bool) -> None:
        """After a failed merged pass: each request alone, so only the faulty one fails."""
        loop = asyncio.get_running_loop()
        for item in group:
            try:
                score = partial(
                    self.inner.score, item.batch, bos=bos, eos=eos, per_token=item.per_token
                )
                result = await loop.run_in_executor(self._forward, score)
            except Exception as exc:
                item.future.set_exception(exc)
            else:
                item.future.set_result(result)

    async def aclose(self) -> None:
        """Stops the queue's task (on the loop that runs it) and the threads."""
        worker, self._worker = self._worker, None
        if worker is not None and not worker.done():
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker
        self._requests.shutdown(wait=False)
        self._forward.shutdown(wait=False)


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False
