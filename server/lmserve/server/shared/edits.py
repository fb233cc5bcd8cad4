"""One Complete message as the engine sees it: the context edits, in order, and the question.

    edit = CompleteEdit("kjv-lstm/3f2a...", context=None, reset=False, rollback=1,
                        append=[17], partial="th", k=3)
    answer = await completer.apply(edit)       # CompleteAnswer(context_tokens, rebuilt, words)

The API layer encodes the message's text into ids and checks what needs no session; the
engine applies the edits to the session it holds (`Completer.apply`), in the order the RPC
documents: `context` (reused when held as is, else rebuilt), `reset`, `rollback`, `append`.
Both cross the process boundary to an engine worker as they are (plain data).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field


def new_session_id(model: str) -> str:
    """A fresh session id; its owner prefix names the model."""
    return f"{model}/{uuid.uuid4().hex}"


@dataclass(frozen=True)
class CompleteEdit:
    """The edits of one message; `suggest` False answers without completions (skipped)."""

    session_id: str
    context: list[int] | None = None
    reset: bool = False
    rollback: int = 0
    append: list[int] = field(default_factory=list)
    partial: str = ""
    k: int = 1
    suggest: bool = True
    # The request field a context over the token limit is reported on.
    append_field: str = "append_text"
    # Adaptive sessions (word models): the words behind `context` and `append` (an unknown
    # word as itself, where its id is the unknown-word id), and the cache's inputs when the
    # message sets them (None: keep the session's).
    context_words: list[str] | None = None
    append_words: list[str] = field(default_factory=list)
    user_words: list[str] | None = None
    history: list[list[str]] | None = None
    cache_weight: float | None = None


@dataclass(frozen=True)
class CompleteAnswer:
    """The session after the edits; `completions` is None when the message was skipped."""

    session_id: str
    context_tokens: int
    rebuilt: bool
    completions: list[tuple[str, float]] | None
