"""Shallow fusion sessions: one `Fuse` stream kept open while an external beam search runs.

    with LmServeClient("localhost:50051") as client, client.fuse("kjv-lstm") as lm:
        root, = lm.step(query=[0], candidate_ids=ids)           # log P(c | <s>) for c in ids
        kids = lm.step(extend=[(1, 0, "in"), (2, 0, "and")], top_k=5)
        kids[0].token_log_prob                                  # log P("in" | <s>)
        lm.step(extend=[(3, 1, "the")], drop=[2])               # prune, extend the survivors

The search keeps its hypotheses as ids; the server keeps each one's model state. Each `step`
is one message and one answer: `extend` adds children (id, parent id, token as an id or a
string), `drop` releases pruned ids (their children stay), `query` asks again for live ones.
Natural logs throughout. A refused step raises the server's error (`InvalidArgumentError`,
`ResourceExhaustedError`...) and ends the stream: the server released its hypotheses.
"""

from __future__ import annotations

import asyncio
import queue
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Self, TypedDict, Unpack

import grpc
import grpc.aio

from lmserve.client.errors import error_for_status, from_rpc_error
from lmserve.v1 import lm_service_pb2 as pb

# An extension: (new id, parent id, token as an id of the model's vocabulary or its string).
Extension = tuple[int, int, int | str]
_EOF: Any = grpc.aio.EOF  # type: ignore[attr-defined]  # (missing from grpc-stubs)


@dataclass(frozen=True)
class FusedToken:
    """One of a hypothesis's most probable next tokens."""

    id: int
    token: str
    log_prob: float


@dataclass(frozen=True)
class Fused:
    """A hypothesis's answer: log P(its token | parent) (0 for the root), log P(c | it) for each
    of the step's `candidate_ids`, its `top_k` next tokens, log P(</s> | it) when asked."""

    id: int
    token_log_prob: float
    candidate_log_probs: tuple[float, ...]
    top: tuple[FusedToken, ...]
    end_log_prob: float | None

    @classmethod
    def from_proto(cls, h: pb.FusedHypothesis, end: bool) -> Fused:
        top = tuple(
            FusedToken(i, t, lp)
            for i, t, lp in zip(h.top_ids, h.top_tokens, h.top_log_probs, strict=True)
        )
        return cls(
            h.id,
            h.token_log_prob,
            tuple(h.candidate_log_probs),
            top,
            h.end_log_prob if end else None,
        )


class StepOptions(TypedDict, total=False):
    """A step's options besides `extend`, by keyword (see the module doc): named once here
    for the sync and asyncio sessions' `step`."""

    drop: Sequence[int]  # ids to release (their children stay)
    query: Sequence[int]  # live ids to answer again
    candidate_ids: Sequence[int]  # ids whose log P(c | hypothesis) each answer carries
    top_k: int  # each answer's most probable next tokens
    end_log_prob: bool  # each answer's log P(</s> | hypothesis)


class _Stream:
    """What the sync and asyncio sessions share: the model, `bos`, the step counter and the
    live count the last answer gave."""

    def __init__(self, method: Any, model: str, *, bos: bool = True) -> None:
        self._method = method
        self.model = model
        self.bos = bos
        self._sequence = 0
        self.live = 0  # hypotheses the server holds for this stream after the last step

    def _next(self, extend: Iterable[Extension], options: StepOptions) -> pb.FuseRequest:
        """The step's message; an unknown option is a TypeError, as a keyword argument no
        function takes."""
        unknown = sorted(set(options) - StepOptions.__optional_keys__)
        if unknown:
            raise TypeError(f"step() got unexpected keyword arguments: {unknown}")
        self._sequence += 1
        request = pb.FuseRequest(
            drop=list(options.get("drop", ())),
            query=list(options.get("query", ())),
            candidate_ids=list(options.get("candidate_ids", ())),
            top_k=options.get("top_k", 0),
            end_log_prob=options.get("end_log_prob", False),
            sequence=self._sequence,
        )
        if self._sequence == 1:
            request.model = self.model
            request.options.bos = self.bos
        for hid, parent, token in extend:
            if isinstance(token, str):
                request.extend.add(id=hid, parent=parent, token=token)
            else:
                request.extend.add(id=hid, parent=parent, token_id=token)
        return request

    def _answered(self, request: pb.FuseRequest, response: pb.FuseResponse) -> list[Fused]:
        self.live = response.live
        return [Fused.from_proto(h, request.end_log_prob) for h in response.hypotheses]


class FuseSession(_Stream):
    """A beam search's language model on one Fuse stream (see the module doc). Not
    thread-safe: one session per search."""

    _END = object()
    _call: Any = None
    _answers: Iterator[pb.FuseResponse]

    def step(
        self,
        extend: Sequence[Extension] = (),
        **options: Unpack[StepOptions],
    ) -> list[Fused]:
        """One message; its answers: the extensions in order, then the queried ids."""
        request = self._next(extend, options)
        if self._call is None:
            self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
            self._call = self._method(iter(self._queue.get, self._END))
            self._answers = iter(self._call)
        self._queue.put(request)
        try:
            response = next(self._answers, None)
        except grpc.RpcError as exc:
            self._call = None
            raise from_rpc_error(exc) from None
        if response is None:
            self._call = None
            raise error_for_status(grpc.StatusCode.UNAVAILABLE, "the server ended the stream")
        return self._answered(request, response)

    def close(self) -> None:
        """Ends the stream: the server releases every hypothesis."""
        if self._call is not None:
            self._queue.put(self._END)
            self._call.cancel()
            self._call = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class AsyncFuseSession(_Stream):
    """`FuseSession` for asyncio: `async with client.fuse(model) as lm`, `await lm.step(...)`."""

    _call: Any = None

    async def step(
        self,
        extend: Sequence[Extension] = (),
        **options: Unpack[StepOptions],
    ) -> list[Fused]:
        request = self._next(extend, options)
        if self._call is None:
            self._call = self._method()
        try:
            try:
                await self._call.write(request)
            except (grpc.RpcError, asyncio.InvalidStateError):
                pass  # the call already ended: its status comes on read
            response = await self._call.read()
        except grpc.RpcError as exc:
            self._call = None
            raise from_rpc_error(exc) from None
        if response is _EOF:
            self._call = None
            raise error_for_status(grpc.StatusCode.UNAVAILABLE, "the server ended the stream")
        return self._answered(request, response)

    async def close(self) -> None:
        if self._call is not None:
            call, self._call = self._call, None
            await call.done_writing()
            call.cancel()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
