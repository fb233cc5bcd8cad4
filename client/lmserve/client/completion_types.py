"""Typed results of autocomplete sessions (`complete.py`), kept apart so that the session code
and `types.py` do not depend on each other. Re-exported by `types.py`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Completion:
    """One suggested next word: the whole word (the typed part included) and
    log P(word | context) in nats."""

    word: str
    log_prob: float
