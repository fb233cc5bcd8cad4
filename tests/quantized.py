"""What the quantized-export tests (int8, float16) share: one client on a server of their
repository, and the per-token log-probs Score gives a model's texts (what a folder's recorded
`max_token_error` is recomputed from)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
from served import ServerFactory

from lmserve.client import LmServeClient


def served_client(serve: ServerFactory, repository: Path) -> Iterator[LmServeClient]:
    """A client of a server over `repository` (a module fixture's body: `yield from`)."""
    server = serve(repository)
    with LmServeClient(server.address, timeout=60) as c:
        yield c


def token_log_probs(client: LmServeClient, model: str, texts: list[str]) -> np.ndarray:
    """Every token's log P (natural logs) of `texts`, in order, as Score gives them."""
    results = client.score(model, texts, return_tokens=True)
    return np.array([t.log_prob for r in results for t in r.tokens or ()], dtype=np.float64)
