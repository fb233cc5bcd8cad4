"""Complete: one bidirectional stream per typing user; every message is answered, in order.

    async for response in complete_stream(models, limits, request_iterator):
        yield response

The first message names the model (and optionally a session id to resume); later messages
continue that session. Each message applies, in this order: `context` (the whole committed
context: reused when the server holds it, else rebuilt), `reset`, `rollback_tokens`, then
`append_text` or `append_tokens`; then the answer is the k most probable next words starting
with `partial_word`. `append_text` is whole words: a character model's context gets the space
that ends the last of them (a word model's words and BPE's `x</w>` pieces end themselves).
When a newer message is already waiting, this one's changes are applied and it is answered
`skipped` without completions, so a fast typist is never answered late.
Every field is checked before the session changes; an error ends the stream with its status,
and the session stays usable from a new stream.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from lmserve.server.api.model_use import same_model, use_model
from lmserve.server.api.pipelining import read_ahead
from lmserve.server.api.validation import check_text_bytes
from lmserve.server.engine.completion import Completer
from lmserve.server.engine.limits import RequestLimits
from lmserve.server.engine.served_model import ServedModel
from lmserve.server.engine.served_models import ServedModels
from lmserve.server.engine.sessions import Session
from lmserve.server.errors import InvalidArgument
from lmserve.v1 import lm_service_pb2 as pb

# Messages read ahead of the one being answered (what makes "a newer one is waiting" visible).
_READ_AHEAD = 64
_MAX_SESSION_ID = 256


async def complete_stream(
    models: ServedModels, limits: RequestLimits, requests: AsyncIterator[pb.CompleteRequest]
) -> AsyncIterator[pb.CompleteResponse]:
    """Answers a Complete stream (see the module doc)."""
    inbox, reader = read_ahead(requests, _READ_AHEAD)
    try:
        first = await inbox.get()
        if isinstance(first, BaseException):
            raise first
        if first is None:
            return
        if not first.model:
            raise InvalidArgument(
                "model", "is empty; the first message of a Complete stream names the model"
            )
        with use_model(models, first.model) as served:  # held for the whole stream
            session_id = _open(served, first)
            completer = served.completer
            message: pb.CompleteRequest | Exception | None = first
            while message is not None:
                if isinstance(message, BaseException):
                    raise message
                _check_same_session(models, served, session_id, message)
                session = completer.session(session_id)
                async with _session_lock(session):
                    response = await _apply(completer, served, limits, session, message)
                    if inbox.empty():
                        words = await completer.suggest(session, message.partial_word, message.k)
                        response.completions.extend(
                            pb.Completion(word=w, log_prob=lp) for w, lp in words
                        )
                    else:
                        response.skipped = True
                    completer.store(session)
                yield response
                message = await inbox.get()
    finally:
        reader.cancel()


def _open(served: ServedModel, first: pb.CompleteRequest) -> str:
    """The stream's session id (a new one when the first message has none)."""
    session_id = first.session_id or served.completer.new_session_id()
    if len(session_id) > _MAX_SESSION_ID:
        raise InvalidArgument("session_id", f"is longer than {_MAX_SESSION_ID} characters")
    owner, slash, _ = session_id.partition("/")
    if slash and owner != served.name:
        raise InvalidArgument(
            "session_id",
            f"belongs to model {owner[:100]!r}, not {served.name!r}; start a new session",
        )
    return session_id


def _check_same_session(
    models: ServedModels, served: ServedModel, session_id: str, message: pb.CompleteRequest
) -> None:
    if not same_model(models, served, message.model):
        raise InvalidArgument(
            "model",
            f"changed mid-stream from {served.name!r}; open a new stream for another model",
        )
    if message.session_id and message.session_id != session_id:
        raise InvalidArgument(
            "session_id", "changed mid-stream; open a new stream for another session"
        )


def _session_lock(session: Session) -> asyncio.Lock:
    """One stream at a time changes a session (two streams of one session queue)."""
    if session.stream_lock is None:
        session.stream_lock = asyncio.Lock()
    lock: asyncio.Lock = session.stream_lock
    return lock


def _ids(served: ServedModel, message: pb.CompleteRequest) -> tuple[list[int], list[str]]:
    """The appended tokens as ids and as the tokens the client keeps in its context."""
    if message.append_text and message.append_tokens:
        raise InvalidArgument("append_text", "set either append_text or append_tokens, not both")
    if message.append_tokens:
        tokens = list(message.append_tokens)
        if "" in tokens:
            raise InvalidArgument(f"append_tokens[{tokens.index('')}]", "is an empty token")
        return served.encode_tokens(tokens), tokens
    if not message.append_text:
        return [], []
    ids = served.encode_prompt(message.append_text, field="append_text")
    # Appended text is whole words (the partial word is sent apart): on a character model the
    # next word starts after a space, which the tokenizer drops at the end of a text.
    boundary = served.codec.word_separator_id()
    if ids and boundary is not None and ids[-1] != boundary:
        ids.append(boundary)
    return ids, served.token_names_of_text(message.append_text, ids)


async def _apply(
    completer: Completer,
    served: ServedModel,
    limits: RequestLimits,
    session: Session,
    message: pb.CompleteRequest,
) -> pb.CompleteResponse:
    """Checks every field, then applies the message's context edits to the session."""
    if not 1 <= message.k <= limits.max_completions:
        raise InvalidArgument(
            "k", f"is {message.k}; ask for 1 to {limits.max_completions} completions"
        )
    if message.rollback_tokens < 0:
        raise InvalidArgument("rollback_tokens", f"is {message.rollback_tokens}; must be >= 0")
    context = (
        served.encode_tokens(list(message.context.tokens), field="context.tokens")
        if message.HasField("context")
        else None
    )
    check_text_bytes("append_text", message.append_text, limits)
    appended, names = _ids(served, message)
    length = len(context) if context is not None else len(session.context)
    if message.reset:
        length = 0
    if message.rollback_tokens > length:
        raise InvalidArgument(
            "rollback_tokens",
            f"is {message.rollback_tokens}, but the context holds only {length} tokens",
        )
    total = length - message.rollback_tokens + len(appended)
    if total > limits.max_tokens_per_text:
        field = "context.tokens" if not appended else "append_text"
        raise InvalidArgument(
            field,
            f"the context would hold {total} tokens, more than the limit of "
            f"{limits.max_tokens_per_text}",
        )
    rebuilt = False
    if context is not None:
        rebuilt = await completer.set_context(session, context)
    if message.reset and session.context:
        await completer.set_context(session, [])
    await completer.rollback(session, message.rollback_tokens)
    await completer.append(session, appended)
    return pb.CompleteResponse(
        session_id=session.session_id,
        context_tokens=len(session.context),
        sequence=message.sequence,
        appended_tokens=names,
        rebuilt=rebuilt,
        model=served.name,
    )
