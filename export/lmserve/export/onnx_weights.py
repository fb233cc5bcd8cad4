"""One weights file for a folder's ONNX graphs: each distinct large tensor stored once.

A recurrent folder's step and score graphs (`rnn.to_onnx`, `custom.torch_graphs`) carry the same
weights; `write_shared_weights` moves them into `weights.bin` (ONNX external data: location,
offset, length, page-aligned so ONNX Runtime can map them) and both graphs point into it. The
int8 graphs `quantize` writes are shared again the same way.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import onnx
from onnx import numpy_helper
from onnx.external_data_helper import set_external_data

WEIGHTS_FILE = "weights.bin"
# Tensors smaller than this stay inside the graph (shapes, scalars); everything else is shared.
EXTERNAL_MIN_BYTES = 1024
# Page-aligned offsets let onnxruntime memory-map each tensor instead of copying it.
ALIGNMENT = 4096


def write_shared_weights(models: Sequence[onnx.ModelProto], weights_path: Path) -> int:
    """Moves every large initializer of `models` into one file, each distinct tensor once.

    Tensors are keyed by dtype, shape and content, so equal weights under different names (the
    two exports name folded constants differently) share one range. Returns the bytes written.
    """
    ranges: dict[tuple[int, tuple[int, ...], str], tuple[int, int]] = {}
    with weights_path.open("wb") as f:
        for model in models:
            for tensor in model.graph.initializer:
                if not tensor.HasField("raw_data"):
                    # Typed fields (float_data...) -> raw bytes, so the tensor can go external.
                    tensor.CopyFrom(
                        numpy_helper.from_array(numpy_helper.to_array(tensor), tensor.name)
                    )
                raw = tensor.raw_data
                if len(raw) < EXTERNAL_MIN_BYTES:
                    continue
                key = (tensor.data_type, tuple(tensor.dims), hashlib.sha256(raw).hexdigest())
                if key not in ranges:
                    offset = -(-f.tell() // ALIGNMENT) * ALIGNMENT
                    f.seek(offset)
                    f.write(raw)
                    ranges[key] = (offset, len(raw))
                offset, length = ranges[key]
                set_external_data(tensor, WEIGHTS_FILE, offset, length)
                tensor.ClearField("raw_data")
        return f.tell()
