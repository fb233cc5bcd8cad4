"""Fuse streams' hypothesis tables: id -> model state, checked and applied one message at a time.

    fuser = Fuser("kjv-lstm", stepper, vocab, FusionSettings(), positions)
    answer = await fuser.apply(key, FuseStep(opens=True, query=[0], top_k=5))
    answer = await fuser.apply(key, FuseStep(ids=[1, 2], parents=[0, 0], tokens=[17, 4]))
    fuser.close_session(key)          # the stream ended (or its caller left): states released

A session is one stream's: the front opens it with the stream's first message and closes it
when the stream ends for any reason, so a caller's hypotheses never outlive its stream. Every
field that depends on the table is checked before anything changes (an unknown parent, an id
already live, a drop or query of an id that is not), with the request's field path in the
message; a refused message ends its stream only. Live hypotheses are bounded per stream
(`fuse_max_hypotheses`) and per model across streams (`fuse_max_live_hypotheses`): each holds
its model state and its next-token distribution (vocabulary x 4 bytes), or, on a model with
word lookups (n-gram), its lookup state alone (`steps`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from dataclasses import dataclass, field, replace

from lmserve.server.backends.positions import Positions
from lmserve.server.backends.stepping import Stepper
from lmserve.server.errors import InvalidArgument, ModelUnavailable, Overloaded
from lmserve.server.settings import FusionSettings
from lmserve.server.shared.fusion import FuseAnswer, FuseStep
from lmserve.server.worker.foreground import Foreground
from lmserve.server.worker.fusion.steps import ROOT, FusionJob, FusionSteps, Hypothesis


@dataclass(eq=False)
class FusionSession:
    """One stream's live hypotheses by the caller's ids (0: the root)."""

    bos: bool
    table: dict[int, Hypothesis] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    closed: bool = False


class Fuser:
    """One model's Fuse sessions (see the module doc); used on one event loop."""

    def __init__(
        self,
        model: str,
        stepper: Stepper,
        limits: FusionSettings,
        positions: Positions,
        *,
        foreground: Foreground | None = None,
    ) -> None:
        self.model = model
        self.limits = limits
        self.positions = positions
        self.eos_id = stepper.vocab.eos_id
        self.steps = FusionSteps(model, stepper, foreground=foreground)
        self._sessions: dict[Hashable, FusionSession] = {}
        self.live = 0  # hypotheses held (or reserved) across every session

    @property
    def sessions(self) -> int:
        return len(self._sessions)

    async def apply(self, key: Hashable, step: FuseStep) -> FuseAnswer:
        """Applies one message of stream `key` (see `shared.fusion` for the order)."""
        session = self._session(key, step)
        async with session.lock:
            job, reserved = self._plan(session, step)
            try:
                await self.steps.run(job)
            except BaseException:
                self.live -= reserved
                raise
            return self._commit(session, step, job, reserved)

    def close_session(self, key: Hashable) -> None:
        """Releases a stream's states (its end, a cancel, its front gone)."""
        session = self._sessions.pop(key, None)
        if session is not None:
            session.closed = True
            self.live -= len(session.table)
            session.table.clear()

    def close(self) -> None:
        for key in list(self._sessions):
            self.close_session(key)
        self.steps.close()

    def join(self, timeout: float) -> None:
        self.steps.join(timeout)

    # -- checks ----------------------------------------------------------------------------------

    def _session(self, key: Hashable, step: FuseStep) -> FusionSession:
        session = self._sessions.get(key)
        if step.opens:
            if session is not None:
                raise InvalidArgument("model", "the stream's session is already open")
            session = self._sessions[key] = FusionSession(step.bos)
        elif session is None:
            raise ModelUnavailable(
                f"model {self.model!r}: this Fuse stream's hypotheses are gone (its engine "
                "restarted); start a new stream"
            )
        return session

    def _plan(self, session: FusionSession, step: FuseStep) -> tuple[FusionJob, int]:
        """Checks the message against the table; the model work it needs and the hypotheses
        it adds (reserved against the model's bound until the answer)."""
        table = session.table
        live_before = set(table) | ({0} if step.opens else set())
        parents: list[Hypothesis | int] = []
        created: dict[int, int] = {}
        bos_positions = 1 if session.bos else 0
        for i, (hid, parent) in enumerate(zip(step.ids, step.parents, strict=True)):
            if hid == 0:
                raise InvalidArgument(
                    f"extend[{i}].id", "0 is the root's id; give new hypotheses ids > 0"
                )
            if hid in live_before:
                raise InvalidArgument(
                    f"extend[{i}].id", f"{hid} is already a live hypothesis; drop it first"
                )
            if hid in created:
                raise InvalidArgument(
                    f"extend[{i}].id", f"{hid} is also extend[{created[hid]}].id; ids are unique"
                )
            created[hid] = i
            if parent not in live_before:
                hint = (
                    "is created by this message; extend it in a later one"
                    if parent in created
                    else "is not a live hypothesis"
                )
                raise InvalidArgument(f"extend[{i}].parent", f"{parent} {hint}")
            held = table.get(parent)
            ref: Hypothesis | int = ROOT if held is None else held
            depth = 0 if held is None else held.depth
            self.positions.check(bos_positions + depth + 1, f"extend[{i}]")
            parents.append(ref)
        dropped: set[int] = set()
        for i, hid in enumerate(step.drop):
            if hid not in live_before and hid not in created:
                raise InvalidArgument(f"drop[{i}]", f"{hid} is not a live hypothesis")
            dropped.add(hid)
        answered: list[Hypothesis | int] = list(range(len(step.ids)))
        for i, hid in enumerate(step.query):
            if hid in dropped or (hid not in live_before and hid not in created):
                raise InvalidArgument(f"query[{i}]", f"{hid} is not a live hypothesis")
            if hid in created:
                answered.append(created[hid])
            else:
                held = table.get(hid)
                answered.append(ROOT if held is None else held)
        added = len(created) + (1 if step.opens else 0)
        after = len(live_before) + len(created) - len(dropped)
        limits = self.limits
        if after > limits.fuse_max_hypotheses:
            raise Overloaded(
                f"extend: the stream would hold {after} live hypotheses, more than "
                f"fuse_max_hypotheses ({limits.fuse_max_hypotheses}); drop pruned ones",
                limit="fuse_max_hypotheses",
                model=self.model,
                retry_after=None,
            )
        if self.live + added > limits.fuse_max_live_hypotheses:
            raise Overloaded(
                f"model {self.model!r} holds {self.live} live Fuse hypotheses; {added} more "
                f"would pass fuse_max_live_hypotheses ({limits.fuse_max_live_hypotheses})",
                limit="fuse_max_live_hypotheses",
                model=self.model,
            )
        self.live += added
        job = FusionJob(
            bos=session.bos,
            opens=step.opens,
            parents=parents,
            tokens=list(step.tokens),
            answered=answered,
            candidates=list(step.candidates),
            top_k=step.top_k,
            end=step.end,
            eos_id=self.eos_id,
            loop=asyncio.get_running_loop(),
            future=asyncio.get_running_loop().create_future(),
        )
        return job, added

    def _commit(
        self, session: FusionSession, step: FuseStep, job: FusionJob, reserved: int
    ) -> FuseAnswer:
        """The table after the message: the new root and children in, the drops out."""
        if session.closed:  # the stream ended while its step ran
            self.live -= reserved
            raise ModelUnavailable(f"model {self.model!r}: the Fuse stream was closed")
        table = session.table
        if job.root is not None:
            table[0] = job.root
        for hid, child in zip(step.ids, job.children, strict=True):
            table[hid] = child
        for hid in set(step.drop):
            if table.pop(hid, None) is not None:
                self.live -= 1
        assert job.answer is not None
        return replace(job.answer, ids=list(step.ids) + list(step.query), live=len(table))
