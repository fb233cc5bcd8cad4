"""The exported graph against transformers' own forward: log-probabilities of sample texts read
in one pass, in two chunks through the cache (the second a chunk, then a single step), and
left-padded in a batch beside a longer text (in one pass, and with its last position a cached
step: how a generation step batches streams of different lengths). Refused past the one
tolerance of every export, `lmserve.export.parity.PARITY_NATS`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import onnxruntime as ort  # type: ignore[import-untyped,unused-ignore]
import torch

from lmserve.export.parity import PARITY_NATS, ParityError, log_softmax
from lmserve.server.backends.transformer import CacheShape, past_names

Floats = npt.NDArray[np.float32]


@dataclass(frozen=True)
class Parity:
    """The largest difference (nats a token) each way of reading showed."""

    one_pass: float
    two_chunks: float
    left_padded: float

    @property
    def worst(self) -> float:
        return max(self.one_pass, self.two_chunks, self.left_padded)

    def as_provenance(self) -> dict[str, float]:
        """The manifest's parity figures (GetModel's `provenance.parity`)."""
        return {
            "one_pass_max_abs_diff_nats": self.one_pass,
            "two_chunks_max_abs_diff_nats": self.two_chunks,
            "left_padded_max_abs_diff_nats": self.left_padded,
        }

    def require(self) -> Parity:
        """These figures, or ParityError when the worst is past PARITY_NATS."""
        if not self.worst <= PARITY_NATS:
            raise ParityError(
                f"the exported graph is {self.worst:.2e} nats a token from transformers' "
                f"forward (allowed {PARITY_NATS:g}): {self}"
            )
        return self


def run_graph(
    session: ort.InferenceSession,
    cache: CacheShape,
    ids: npt.NDArray[np.int64],
    mask: npt.NDArray[np.int64],
    past: list[Floats] | None = None,
) -> tuple[npt.NDArray[np.float64], list[Floats]]:
    batch, time = ids.shape
    if past is None:
        empty = np.zeros((batch, cache.kv_heads, 0, cache.head_dim), np.float32)
        past = [empty] * (2 * cache.layers)
    seen = past[0].shape[2]
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)[:, seen : seen + time]
    feed: dict[str, npt.NDArray[Any]] = {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": positions.astype(np.int64),
    }
    feed |= dict(zip(past_names(cache.layers), past, strict=True))
    logits, *present = session.run(None, feed)
    return log_softmax(logits), present


def check_parity(
    model: Any, session: ort.InferenceSession, cache: CacheShape, texts: Sequence[Sequence[int]]
) -> Parity:
    """Differences between the graph and `model` (a transformers causal LM, eval mode)."""
    one_pass = two_chunks = left_padded = 0.0
    longest = max(texts, key=len)
    for text in texts:
        ids = np.asarray([text], dtype=np.int64)
        with torch.no_grad():
            reference = log_softmax(model(torch.from_numpy(ids)).logits.numpy())
        whole, _ = run_graph(session, cache, ids, np.ones_like(ids))
        one_pass = max(one_pass, float(np.abs(whole - reference).max()))
        for cut in sorted({max(1, len(text) // 2), len(text) - 1}):  # a chunk, then one step
            if not 0 < cut < len(text):
                continue
            first, past = run_graph(session, cache, ids[:, :cut], np.ones_like(ids[:, :cut]))
            rest, _ = run_graph(session, cache, ids[:, cut:], np.ones_like(ids), past)
            chunked = np.concatenate([first, rest], axis=1)
            two_chunks = max(two_chunks, float(np.abs(chunked - reference).max()))
        pad = len(longest) - len(text)
        batch = np.asarray([[0] * pad + list(text), list(longest)], dtype=np.int64)
        mask = np.asarray([[0] * pad + [1] * len(text), [1] * len(longest)], dtype=np.int64)
        padded, _ = run_graph(session, cache, batch, mask)
        left_padded = max(left_padded, float(np.abs(padded[0, pad:] - reference[0]).max()))
        if len(text) > 1:  # the padded batch read but its last position, then one cached step
            head, past = run_graph(session, cache, batch[:, :-1], mask[:, :-1])
            step, _ = run_graph(session, cache, batch[:, -1:], mask, past)
            stepped = np.concatenate([head, step], axis=1)[0, pad:]
            left_padded = max(left_padded, float(np.abs(stepped - reference[0]).max()))
    return Parity(one_pass, two_chunks, left_padded)
