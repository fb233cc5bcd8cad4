"""A transformers decoder -> one ONNX graph with past key values, in optimum's layout.

One graph serves both prefill (past of length 0, many positions) and the cached step (one
position), so Score reads a whole text in one pass and Generate steps with the cache.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from lmserve.server.backends.transformer import CacheShape, past_names, present_names

INPUTS = ("input_ids", "attention_mask", "position_ids")
OPSET = 17


class _WithFlatCache(torch.nn.Module):
    """The decoder with its cache as flat tensors (ONNX has no cache objects)."""

    def __init__(self, model: torch.nn.Module, layers: int) -> None:
        super().__init__()
        self.model = model
        self.layers = layers

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        *past: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        from transformers.cache_utils import DynamicCache

        cache = DynamicCache()
        for layer in range(self.layers):
            cache.update(past[2 * layer], past[2 * layer + 1], layer)
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=True,
        )
        present: list[torch.Tensor] = []
        for layer in out.past_key_values.layers:
            present += [layer.keys, layer.values]
        return (out.logits, *present)


def export_with_past(model: Any, cache: CacheShape, path: Path) -> None:
    """Write `model` (a transformers causal LM in eval mode) to `path` as one ONNX graph."""
    wrapper = _WithFlatCache(model, cache.layers).eval()
    batch, time, past = 2, 3, 4
    ids = torch.zeros((batch, time), dtype=torch.long)
    mask = torch.ones((batch, past + time), dtype=torch.long)
    positions = torch.arange(past, past + time).expand(batch, time)
    cached = [
        torch.zeros((batch, cache.kv_heads, past, cache.head_dim)) for _ in range(2 * cache.layers)
    ]
    dynamic: dict[str, dict[int, str]] = {
        "input_ids": {0: "batch", 1: "time"},
        "attention_mask": {0: "batch", 1: "past_and_time"},
        "position_ids": {0: "batch", 1: "time"},
        "logits": {0: "batch", 1: "time"},
    }
    dynamic |= {name: {0: "batch", 2: "past"} for name in past_names(cache.layers)}
    dynamic |= {name: {0: "batch", 2: "past_and_time"} for name in present_names(cache.layers)}
    with torch.no_grad():
        torch.onnx.export(
            wrapper,
            (ids, mask, positions, *cached),
            str(path),
            input_names=[*INPUTS, *past_names(cache.layers)],
            output_names=["logits", *present_names(cache.layers)],
            dynamic_axes=dynamic,
            opset_version=OPSET,
            dynamo=False,
        )
