"""Autocomplete sessions: each session's context and model state, kept between keystrokes.

    cache = SessionCache("kjv-lstm", SessionLimits.of(settings), stats)
    session = cache.get(session_id)            # None: unknown, expired or evicted (a miss)
    cache.put(session)                          # most recently used; evicts past the bounds

A session is an optimisation, never a dependency: the client can always send the whole
committed context, and a replica that lacks the session (restart, eviction, another replica)
rebuilds it from that context and answers the same words. So the cache may drop any session at
any time: on an idle TTL, past a session count, or past a memory bound, least recently used
first. Each session keeps the model states after its last few positions, so a backspace over a
few tokens costs one step instead of a rebuild.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from lmserve.server.backends.stepping import State
from lmserve.server.decoding.word_cache import CacheConfig, WordCache
from lmserve.server.settings import SessionSettings
from lmserve.server.shared.stats import EngineStats


@dataclass(frozen=True)
class SessionLimits:
    """How many sessions a model keeps, for how long, in how much memory: the settings'
    `SessionSettings` in the units the cache counts (`of`), which own every default."""

    max_sessions: int
    idle_seconds: float
    max_bytes: int
    # The adaptive cache's weights and history bound (word models).
    cache: CacheConfig
    # Model states kept per session, one per recent position (cheap backspaces): not a setting.
    kept_states: int = 8

    @classmethod
    def of(cls, settings: SessionSettings) -> SessionLimits:
        return cls(
            max_sessions=settings.complete_max_sessions,
            idle_seconds=settings.complete_session_idle_seconds,
            max_bytes=settings.complete_session_memory_mb * 1024 * 1024,
            cache=CacheConfig(
                weight=settings.complete_cache_weight,
                user_word_count=settings.complete_user_word_count,
                history_words=settings.complete_cache_history_words,
            ),
        )


@dataclass(eq=False)
class Session:
    """One session: its context ids, the states after its last positions, and the
    distribution after the whole context (natural-log probabilities over the vocabulary)."""

    session_id: str
    context: list[int] = field(default_factory=list)
    # states[i] is the state after <s> + context[: offset + i]; older ones are dropped.
    states: list[State] = field(default_factory=list)
    offset: int = 0
    log_probs: npt.NDArray[np.floating] | None = None
    state_bytes: int = 0
    last_used: float = field(default_factory=time.monotonic)
    # What the cache counted for this session when it was last stored.
    counted_bytes: int = 0
    # Created by `Completer.apply` on its event loop: one message at a time changes the session.
    stream_lock: asyncio.Lock | None = None
    # The session's own words (word models; `decoding.word_cache`).
    cache: WordCache | None = None

    @property
    def nbytes(self) -> int:
        dist = 0 if self.log_probs is None else int(self.log_probs.nbytes)
        cache = self.cache.nbytes if self.cache is not None else 0
        return dist + self.state_bytes * len(self.states) + 8 * len(self.context) + cache

    def state_at(self, length: int) -> State | None:
        """The state after <s> + context[:length], if still kept."""
        i = length - self.offset
        if 0 <= i < len(self.states):
            return self.states[i]
        return None

    def keep(self, kept_states: int) -> None:
        """Drops all but the newest `kept_states` states."""
        extra = len(self.states) - kept_states
        if extra > 0:
            del self.states[:extra]
            self.offset += extra


class SessionCache:
    """Sessions of one model, least recently used first (thread-safe)."""

    def __init__(self, model: str, limits: SessionLimits, stats: EngineStats | None = None) -> None:
        self.model = model
        self.limits = limits
        self.stats = stats if stats is not None else EngineStats(model)
        self._sessions: OrderedDict[str, Session] = OrderedDict()
        self._lock = threading.Lock()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._sessions)

    def get(self, session_id: str) -> Session | None:
        """The session if held (a hit), else None (a miss); expired sessions are dropped."""
        now = time.monotonic()
        with self._lock:
            self._expire(now)
            session = self._sessions.get(session_id)
            if session is not None:
                self._sessions.move_to_end(session_id)
                session.last_used = now
        self._event("hit" if session is not None else "miss")
        return session

    def put(self, session: Session) -> None:
        """Stores (or refreshes) a session as the most recently used; evicts past the bounds."""
        session.last_used = time.monotonic()
        with self._lock:
            old = self._sessions.pop(session.session_id, None)
            if old is not None:
                self._bytes -= old.counted_bytes
            session.counted_bytes = session.nbytes
            self._sessions[session.session_id] = session
            self._bytes += session.counted_bytes
            evicted = self._evict()
        for _ in range(evicted):
            self._event("evicted")
        self._gauge()

    def record(self, event: str) -> None:
        """Counts a cache event the caller observed (e.g. a rebuild)."""
        self._event(event)

    def _expire(self, now: float) -> None:
        idle = self.limits.idle_seconds
        while self._sessions:
            oldest = next(iter(self._sessions.values()))
            if now - oldest.last_used < idle:
                break
            self._remove(oldest.session_id)

    def _evict(self) -> int:
        count = 0
        limits = self.limits
        while len(self._sessions) > 1 and (
            len(self._sessions) > limits.max_sessions or self._bytes > limits.max_bytes
        ):
            self._remove(next(iter(self._sessions)))
            count += 1
        return count

    def _remove(self, session_id: str) -> None:
        session = self._sessions.pop(session_id)
        self._bytes -= session.counted_bytes

    def _event(self, event: str) -> None:
        self.stats.session_event(event)

    def _gauge(self) -> None:
        self.stats.sessions_active = len(self._sessions)
