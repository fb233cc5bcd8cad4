"""One Fuse message as the engine sees it, and its answer: plain data both processes read.

    step = FuseStep(opens=True, bos=True, ids=[1, 2], parents=[0, 0], tokens=[17, 4],
                    drop=[], query=[0], candidates=[17, 4, 9], top_k=5, end=True)
    answer = await core.fuse(session, step)   # FuseAnswer: one row per answered hypothesis

The API layer turns token strings into ids and checks every field that needs only the
vocabulary (ids in range, `top_k` and the number of candidates within the limits); the engine
checks what needs the session (a parent that is live, an id not already live, the number of
live hypotheses) and names the request field in the same way ("extend[3].parent: ...").
The order a message is applied in: extensions (every parent live before the message), then
drops (a parent extended by this very message may be dropped in it), then queries.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True)
class FuseStep:
    """One message: extensions (`ids[i]` = `parents[i]` + `tokens[i]`), drops, queries and
    what every answer gives (`candidates`' log-probs, the `top_k`, log P(</s>) when `end`).
    `opens`: the stream's first message, which creates the root (id 0) from `<s>` (`bos`)."""

    opens: bool = False
    bos: bool = True
    ids: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    drop: list[int] = field(default_factory=list)
    query: list[int] = field(default_factory=list)
    candidates: list[int] = field(default_factory=list)
    top_k: int = 0
    end: bool = False


@dataclass(frozen=True)
class FuseAnswer:
    """The answered hypotheses (extensions in request order, then queries), natural logs:
    `token_log_probs` [n] (log P(token | parent), 0 for the root), `candidate_log_probs`
    [n, len(candidates)], `top_ids` / `top_log_probs` [n, top_k] (most probable first, ties by
    id), `end_log_probs` [n] (zeros unless asked), and the live hypotheses after the message."""

    ids: list[int]
    token_log_probs: npt.NDArray[np.float64]
    candidate_log_probs: npt.NDArray[np.float64]
    top_ids: npt.NDArray[np.int64]
    top_log_probs: npt.NDArray[np.float64]
    end_log_probs: npt.NDArray[np.float64]
    live: int
