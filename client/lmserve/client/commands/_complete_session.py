"""The session `lmserve complete` opens, from its flags: one place for the `--type` run
(`complete`) and the interactive screen (`complete_app`), which `complete` imports only when
asked for, so neither imports the other's module to reach it."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lmserve.client import CompletionSession, LmServeClient


def open_session(client: LmServeClient, args: argparse.Namespace) -> CompletionSession:
    """The command's session: its model, k, session id, user words and cache weight."""
    return client.complete(
        args.model,
        k=args.k,
        session_id=args.session_id,
        user_words=args.user_words,
        cache_weight=args.cache_weight,
    )
