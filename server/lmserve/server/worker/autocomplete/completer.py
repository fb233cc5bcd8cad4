"""Autocomplete for one served model: sessions, their context edits, and the next words.

    completer = Completer(served_name, backend, stepper, codec, limits, stats)
    session = completer.session(session_id)               # held, or a new empty one
    rebuilt = await completer.set_context(session, ids)   # reuse when equal, else rebuild
    await completer.rollback(session, 2); await completer.append(session, ids)
    words = await completer.suggest(session, "th", k=3)   # [(word, log P(word | context))]
    answer = await completer.apply(CompleteEdit(session_id, rollback=1, partial="th", k=3))

Costs by construction: a keystroke that only changes the partial word costs no model step
(the distribution after the context is kept in the session); an appended token costs one
batched step shared with every session typing at the same time (`SessionSteps`); a backspace
over a few tokens reuses a kept state; a context the replica does not hold is rebuilt in one
prefill. n-gram sessions keep no state at all: their distribution is the engine's exact
(float64) next-token distribution of the last order-1 words, computed in microseconds.

What is exact: for a word-level model every answer is the top k over the whole vocabulary by
the model's log P(word | context) (never `<s>`, `</s>`, `<unk>`). For a model whose tokens are
pieces (BPE, characters) a word's probability is the product of its pieces up to its word
boundary, and the top k come from a best-first search with an expansion budget
(`decoding.completion.top_k_subword_words`): exact when it finishes within the budget.
"""

from __future__ import annotations

import asyncio

import numpy as np
import numpy.typing as npt

from lmserve.server.backends.base import LanguageModelBackend
from lmserve.server.backends.stepping import State, Stepper, TruncatingStepper
from lmserve.server.decoding.completion import (
    top_k_subword_words,
    top_k_words,
    top_k_words_with_cache,
)
from lmserve.server.decoding.scoring import check_token_count
from lmserve.server.decoding.word_cache import WordCache
from lmserve.server.errors import InvalidArgument
from lmserve.server.shared.edits import CompleteAnswer, CompleteEdit
from lmserve.server.shared.stats import EngineStats
from lmserve.server.text.codec import TextCodec
from lmserve.server.text.prefix_index import WordPrefixIndex
from lmserve.server.worker.autocomplete.session_steps import SessionSteps
from lmserve.server.worker.autocomplete.sessions import Session, SessionCache, SessionLimits
from lmserve.server.worker.foreground import Foreground

# The words an n-gram session's distribution is computed from: any order up to this + 1 is
# exact, and a long context costs no more than a short one.
_NGRAM_CONTEXT = 256
# Model calls one subword completion may make (the search's budget).
SUBWORD_EXPANSIONS = 64


class Completer:
    """One model's autocomplete (see the module doc)."""

    def __init__(
        self,
        model: str,
        backend: LanguageModelBackend,
        stepper: Stepper,
        codec: TextCodec,
        limits: SessionLimits,
        stats: EngineStats | None = None,
        *,
        lowercase: bool = False,
        max_context_tokens: int = 100_000,
        foreground: Foreground | None = None,
    ) -> None:
        self.model = model
        self.max_context_tokens = max_context_tokens
        self.backend = backend
        self.stepper = stepper
        self.codec = codec
        self.limits = limits
        self.lowercase = lowercase
        self.cache = SessionCache(model, limits, stats)
        vocab = backend.vocab
        specials = {vocab.bos_id, vocab.eos_id, vocab.unk_id, vocab.pad_id} - {-1}
        # Word models answer from one distribution; piece models search over pieces.
        self._pieces = codec.piece_vocabulary()
        self._index = WordPrefixIndex.from_vocab(vocab, specials) if self._pieces is None else None
        # Word models adapt to the session's own words (`decoding.word_cache`).
        self._special_words = frozenset(vocab.words[i] for i in specials)
        # Neural models keep states and step in batches; n-gram models need neither.
        self._steps = (
            SessionSteps(model, stepper, foreground=foreground) if stepper.releases_gil else None
        )
        # A transformer's cache goes back by slicing (`truncate`): one state per session is
        # enough, where a recurrent model keeps its last few for cheap backspaces.
        self._truncate = stepper.truncate if isinstance(stepper, TruncatingStepper) else None
        self._kept_states = 1 if self._truncate is not None else limits.kept_states

    # -- sessions ------------------------------------------------------------------------------

    def session(self, session_id: str) -> Session:
        """The held session, or a new empty one under that id (a miss)."""
        held = self.cache.get(session_id)
        return held if held is not None else Session(session_id)

    def store(self, session: Session) -> None:
        self.cache.put(session)

    # -- context edits -------------------------------------------------------------------------

    async def apply(self, edit: CompleteEdit) -> CompleteAnswer:
        """Applies one message's edits to its session, in order, and answers it (see
        `edits`). Checks what depends on the session first; one message at a time per
        session (two streams of one session queue)."""
        session = self.session(edit.session_id)
        if session.stream_lock is None:
            session.stream_lock = asyncio.Lock()
        async with session.stream_lock:
            length = len(edit.context) if edit.context is not None else len(session.context)
            if edit.reset:
                length = 0
            if edit.rollback > length:
                raise InvalidArgument(
                    "rollback_tokens",
                    f"is {edit.rollback}, but the context holds only {length} tokens",
                )
            check_token_count(
                edit.append_field if edit.append else "context.tokens",
                length - edit.rollback + len(edit.append),
                self.max_context_tokens,
                holds="the context would hold",
            )
            rebuilt = False
            cache = self._cache_of(session, edit)
            if edit.context is not None:
                rebuilt = await self.set_context(session, edit.context)
                if cache is not None and cache.context != edit.context_words:
                    cache.set_context(edit.context_words or [])
            if edit.reset and session.context:
                await self.set_context(session, [])
            if edit.reset and cache is not None:
                cache.commit(cache.context)  # the finished sentence joins the history
                cache.set_context([])
            await self.rollback(session, edit.rollback)
            if cache is not None:
                cache.truncate(len(cache.context) - edit.rollback)
            await self.append(session, edit.append)
            if cache is not None:
                cache.extend(edit.append_words)
            words = await self.suggest(session, edit.partial, edit.k) if edit.suggest else None
            self.store(session)
        return CompleteAnswer(session.session_id, len(session.context), rebuilt, words)

    def _cache_of(self, session: Session, edit: CompleteEdit) -> WordCache | None:
        """The session's word cache with the message's cache inputs applied (word models;
        None for a piece model, whose sessions do not adapt)."""
        if self._index is None:
            return None
        cache = session.cache
        if cache is None:
            cache = session.cache = WordCache(self.limits.cache, word_id=self._word_id)
        if edit.cache_weight is not None:
            cache.weight = edit.cache_weight
        if edit.user_words is not None:
            cache.set_user_words(edit.user_words)
        if edit.history is not None and edit.history != cache.history:
            cache.set_history(edit.history)
        return cache

    async def set_context(self, session: Session, ids: list[int]) -> bool:
        """Makes the context exactly `ids`; True when that took a rebuild (not held as is)."""
        if session.log_probs is not None and session.context == ids:
            return False
        session.context = list(ids)
        session.states, session.offset = [], 0
        await self._refresh(session, rebuild=True)
        self.cache.record("rebuild")
        return True

    async def ensure_ready(self, session: Session) -> None:
        """A new session's distribution after `<s>`."""
        if session.log_probs is None:
            await self._refresh(session, rebuild=True)

    async def rollback(self, session: Session, count: int) -> None:
        """Removes the last `count` tokens (InvalidArgument past the start)."""
        if count <= 0:
            return
        if count > len(session.context):
            raise InvalidArgument(
                "rollback_tokens",
                f"is {count}, but the context holds only {len(session.context)} tokens",
            )
        del session.context[len(session.context) - count :]
        if self._truncate is not None and session.states and session.context:
            # The cache before the context's last token, sliced from the newest; `_refresh`
            # reads that token again for the distribution.
            covered = session.offset + len(session.states) - 1
            target = len(session.context) - 1
            session.states = [self._truncate(session.states[-1], covered - target)]
            session.offset = target
            await self._refresh(session, rebuild=False)
            return
        keep = len(session.context) - session.offset
        del session.states[max(keep, 0) :]
        await self._refresh(session, rebuild=keep <= 0)

    async def append(self, session: Session, ids: list[int]) -> None:
        """Adds tokens to the context (one batched step per token on a neural model)."""
        if not ids:
            return
        state = None
        if self._steps is not None:  # n-gram sessions keep no state: the context is enough
            await self.ensure_ready(session)
            state = session.state_at(len(session.context))
        if self._steps is None or state is None:
            session.context.extend(ids)
            await self._refresh(session, rebuild=True)
            return
        advanced = await self._steps.advance(state, ids)
        session.context.extend(ids)
        session.states.extend(advanced.states)
        session.keep(self._kept_states)
        session.log_probs = advanced.log_probs
        if session.states:  # a transformer's cache grows with the context
            session.state_bytes = _state_bytes(session.states[-1])

    async def _refresh(self, session: Session, *, rebuild: bool) -> None:
        """The distribution (and state) after the session's current context."""
        context = session.context
        if self._steps is None:  # n-gram: exact float64 from the last words only
            session.log_probs = self.backend.next_token_log_probs(context[-_NGRAM_CONTEXT:])
            return
        if rebuild:
            rebuilt = await self._steps.rebuild(context)
            session.states, session.offset = rebuilt.states, len(context)
            session.log_probs = rebuilt.log_probs
            session.state_bytes = _state_bytes(rebuilt.states[0])
            return
        # After a short backspace: the kept state before the last token, stepped once.
        previous = session.state_at(len(context) - 1) if context else None
        if previous is None:
            await self._refresh(session, rebuild=True)
            return
        del session.states[len(context) - session.offset :]
        advanced = await self._steps.advance(previous, [context[-1]])
        session.states.extend(advanced.states)
        session.keep(self._kept_states)
        session.log_probs = advanced.log_probs

    # -- suggestions ---------------------------------------------------------------------------

    def normalise(self, partial: str) -> str:
        return partial.lower() if self.lowercase else partial

    async def suggest(self, session: Session, partial: str, k: int) -> list[tuple[str, float]]:
        """The k most probable next words starting with `partial`, best first (nats)."""
        await self.ensure_ready(session)
        log_probs = session.log_probs
        assert log_probs is not None
        prefix = self.normalise(partial)
        if self._index is not None:
            words = self.backend.vocab.words
            ids = self._index.ids_with_prefix(prefix)
            cache = session.cache
            if cache is not None and cache.active:
                return top_k_words_with_cache(
                    log_probs,
                    ids,
                    k,
                    cache=cache,
                    prefix=prefix,
                    words=words,
                    excluded=self._special_words,
                )
            return [(words[i], lp) for i, lp in top_k_words(log_probs, ids, k)]
        return await asyncio.to_thread(self._suggest_pieces, session, log_probs, prefix, k)

    def _word_id(self, word: str) -> int | None:
        """A cache word's vocabulary id; None outside the vocabulary."""
        return self.backend.vocab.index.get(word)

    def _suggest_pieces(
        self, session: Session, log_probs: npt.NDArray[np.floating], prefix: str, k: int
    ) -> list[tuple[str, float]]:
        """A piece model's words: the bounded best-first search, each expansion one step."""
        assert self._pieces is not None
        stepper = self.stepper
        base = session.state_at(len(session.context))
        cache: dict[tuple[int, ...], tuple[npt.NDArray[np.floating], State]] = {}

        def expand(path: tuple[int, ...]) -> npt.NDArray[np.floating]:
            if not path:
                return log_probs
            parent = path[:-1]
            if parent and parent not in cache:
                expand(parent)
            state = base if not parent else cache[parent][1]
            if state is None:  # n-gram piece model: the context is the state
                out = self.backend.next_token_log_probs([*session.context, *path])
                cache[path] = (out, None)
                return out
            out, new_state = stepper.step(np.asarray([path[-1]], dtype=np.int64), state)
            cache[path] = (np.asarray(out[0]), new_state)
            return cache[path][0]

        pieces = self._pieces
        search = expand
        if pieces.opens is not None:  # a word ends where the next piece opens one

            def search(path: tuple[int, ...]) -> npt.NDArray[np.floating]:
                first, text_start = not path, not session.context
                return pieces.word_view(expand(path), first=first, text_start=text_start)

        found = top_k_subword_words(
            search, prefix, k, pieces=pieces, max_expansions=SUBWORD_EXPANSIONS
        )
        return found.words

    def close(self) -> None:
        if self._steps is not None:
            self._steps.close()

    def join(self, timeout: float) -> None:
        if self._steps is not None:
            self._steps.join(timeout)


def _state_bytes(state: object) -> int:
    """Memory of one session's model state (arrays anywhere inside it, or a transformer's
    cache, which counts its own)."""
    if isinstance(state, np.ndarray) or hasattr(state, "nbytes"):
        return int(state.nbytes)
    if isinstance(state, tuple | list):
        return sum(_state_bytes(s) for s in state)
    return 64
