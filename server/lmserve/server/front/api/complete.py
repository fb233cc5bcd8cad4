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

from collections.abc import AsyncIterator

from lmserve.server.errors import InvalidArgument, RequestTooLarge
from lmserve.server.front.api.model_use import same_model, use_model
from lmserve.server.front.api.pipelining import read_ahead
from lmserve.server.front.api.validation import check_no_empty_token, check_text_bytes
from lmserve.server.front.models.served_model import ServedModel
from lmserve.server.front.models.served_models import ServedModels
from lmserve.server.settings import RequestLimits
from lmserve.server.shared.edits import CompleteAnswer, CompleteEdit, new_session_id
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
            message: pb.CompleteRequest | Exception | None = first
            while message is not None:
                if isinstance(message, BaseException):
                    raise message
                _check_same_session(models, served, session_id, message)
                newer = inbox.newer_request_waiting()
                edit, names = _edit(served, limits, session_id, message, suggest=not newer)
                answer = await served.complete(edit)
                yield _response(served, message, answer, names)
                message = await inbox.get()
    finally:
        reader.cancel()


def _open(served: ServedModel, first: pb.CompleteRequest) -> str:
    """The stream's session id (a new one when the first message has none)."""
    session_id = first.session_id or new_session_id(served.name)
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


def _ids(served: ServedModel, message: pb.CompleteRequest) -> tuple[list[int], list[str]]:
    """The appended tokens as ids and as the tokens the client keeps in its context."""
    if message.append_text and message.append_tokens:
        raise InvalidArgument("append_text", "set either append_text or append_tokens, not both")
    if message.append_tokens:
        tokens = list(message.append_tokens)
        check_no_empty_token("append_tokens", tokens)
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


def _edit(
    served: ServedModel,
    limits: RequestLimits,
    session_id: str,
    message: pb.CompleteRequest,
    *,
    suggest: bool,
) -> tuple[CompleteEdit, list[str]]:
    """Checks every field that needs no session and encodes the message as the engine's edit;
    what depends on the session (rollback past the start, the context's length) the engine
    checks (`Completer.apply`). Also returns the appended tokens as the client keeps them."""
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
    cache_weight = None
    if message.HasField("cache_weight"):
        cache_weight = message.cache_weight
        if not 0.0 <= cache_weight < 1.0:  # NaN fails too
            raise InvalidArgument("cache_weight", f"is {cache_weight}; must be in [0, 1)")
    edit = CompleteEdit(
        session_id,
        context=context,
        reset=message.reset,
        rollback=message.rollback_tokens,
        append=appended,
        partial=message.partial_word,
        k=message.k,
        suggest=suggest,
        append_field="append_tokens" if message.append_tokens else "append_text",
        context_words=list(message.context.tokens) if context is not None else None,
        append_words=names,
        user_words=_user_words(served, limits, message),
        history=_history(limits, message),
        cache_weight=cache_weight,
    )
    return edit, names


def _user_words(
    served: ServedModel, limits: RequestLimits, message: pb.CompleteRequest
) -> list[str] | None:
    """The message's user words as the model's tokenizer writes them (each one word), or
    None when it sets none; only word-level models adapt."""
    if not message.HasField("user_words"):
        return None
    given = list(message.user_words.tokens)
    if given and not served.codec.tokens_are_words:
        raise InvalidArgument(
            "user_words",
            f"model {served.name!r} spells words from pieces; user words need a word-level model",
        )
    if len(given) > limits.max_user_words:
        raise RequestTooLarge("user_words.tokens", len(given), limits.max_user_words, "words")
    words = served.codec.split_batch(given)
    for i, (raw, split) in enumerate(zip(given, words, strict=True)):
        if len(split) != 1:
            raise InvalidArgument(
                f"user_words.tokens[{i}]",
                f"{raw[:100]!r} is {len(split)} words under model {served.name!r}'s tokenizer; "
                "give one word per entry",
            )
    return [split[0] for split in words]


def _history(limits: RequestLimits, message: pb.CompleteRequest) -> list[list[str]] | None:
    """The finished sentences the message sets (None: keep the session's)."""
    if not message.HasField("history"):
        return None
    sentences = [list(s.tokens) for s in message.history.sentences]
    total = sum(map(len, sentences))
    if total > limits.max_tokens_per_text:
        raise RequestTooLarge("history", total, limits.max_tokens_per_text, "words")
    for i, sentence in enumerate(sentences):
        check_no_empty_token(f"history.sentences[{i}].tokens", sentence)
    return sentences


def _response(
    served: ServedModel, message: pb.CompleteRequest, answer: CompleteAnswer, names: list[str]
) -> pb.CompleteResponse:
    response = pb.CompleteResponse(
        session_id=answer.session_id,
        context_tokens=answer.context_tokens,
        sequence=message.sequence,
        appended_tokens=names,
        rebuilt=answer.rebuilt,
        model=served.name,
    )
    if answer.completions is None:
        response.skipped = True
    else:
        response.completions.extend(
            pb.Completion(word=w, log_prob=lp) for w, lp in answer.completions
        )
    return response
