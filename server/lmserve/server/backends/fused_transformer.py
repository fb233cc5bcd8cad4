"""Decoder-only transformers whose graph appends to a preallocated key/value cache in place
(ONNX Runtime's GroupQueryAttention with past and present bound to one buffer), run with
I/O binding. What `lmserve import-hf` writes for GPT-2 and Llama checkpoints
(`lmserve.export.hf.fused_graph` documents the graph); other folders keep optimum's layout
(`transformer.TransformerBackend`), where ONNX Runtime copies the whole cache at every token.

    input_ids [B, T], position_ids [B, T] (when the graph reads them), seqlens_k [B] int32,
    total_sequence_length [] int32, past_key_values.N.key / .value [B, kv_heads, C, head_dim]
      -> logits [B, T, V], present.N.key / .value (the past's own memory, T positions written)

The op's contract on CPU (ONNX Runtime 1.32, checked against torch by the export's parity
reading and by this package's tests): a call either starts every row from nothing (T equals
`total_sequence_length`, shorter rows right-padded, their padding written but never read) or
reads one token per row after rows of any lengths, or reads T > 1 tokens after a past in a
batch of one row. Row b's positions are 0..seqlens_k[b] of its buffer row.

Score reads each group of texts in one call from nothing (rows right-padded); generation steps
through `shared_kv_stepping.SharedKvStepper`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from lmserve.server.backends.base import FloatArray, Vocabulary
from lmserve.server.backends.onnx import OnnxOptions
from lmserve.server.backends.transformer import (
    MAX_PASS_LOGITS,
    CacheShape,
    Floats,
    Ids,
    Past,
    TransformerBackend,
    _gather,
    log_softmax,
    logits_width,
    open_graph,
)
from lmserve.server.errors import ModelLoadError, Unimplemented

# The manifest's mark of a folder whose graph is this layout (`architecture.kv_cache`).
SHARED_BUFFER = "shared_buffer"
SEQLENS = "seqlens_k"
TOTAL = "total_sequence_length"


def right_padded(rows: Sequence[Sequence[int]]) -> tuple[Ids, Ids]:
    """Rows of ids as one [B, longest] array, right-padded with 0 (the op writes the padding
    but never reads it), and each row's length."""
    lengths = np.asarray([len(r) for r in rows], dtype=np.int64)
    ids = np.zeros((len(rows), int(lengths.max())), dtype=np.int64)
    for k, row in enumerate(rows):
        ids[k, : len(row)] = row
    return ids, lengths


class FusedTransformerBackend(TransformerBackend):
    """A transformer LM whose graph writes its cache in place (see the module doc)."""

    def __init__(self, session: Any, cache: CacheShape, vocab: Vocabulary) -> None:
        # The cache lives in numpy buffers the stepper pools (CPU), never on a device.
        super().__init__(session, cache, vocab, device_states="off")
        width = logits_width(session)
        self.logits_width = width if width is not None else len(vocab)

    @classmethod
    def load(
        cls, folder: Path, manifest: Any, options: OnnxOptions, vocab: Vocabulary
    ) -> FusedTransformerBackend:
        cache, session = open_graph(folder, manifest, options, ["input_ids", SEQLENS, TOTAL])
        where = manifest.file_path(folder, "graph")
        backend = cls(session, cache, vocab)
        if backend.logits_width < len(vocab):
            raise ModelLoadError(
                str(where),
                f"logits have {backend.logits_width} entries, the tokenizer has {len(vocab)}",
            )
        return backend

    # -- the graph -----------------------------------------------------------------------

    def run(
        self,
        ids: Ids,
        positions: Ids,
        seqlens: npt.NDArray[np.int32],
        caches: Sequence[npt.NDArray[np.float32]],
    ) -> Floats:
        """One graph call over `caches` (per layer a key and a value [B, kv_heads, C, D],
        C-contiguous; written in place): logits [B, T, V']. `seqlens` are each row's length
        after the call minus one; `positions` each new token's position."""
        batch, time = ids.shape
        total = int(seqlens.max(initial=0)) + 1
        if total < time:  # every row padded: the op reads T == total as "from nothing"
            total = time
        logits = np.empty((batch, time, self.logits_width), dtype=np.float32)
        binding = self.session.io_binding()
        binding.bind_cpu_input("input_ids", np.ascontiguousarray(ids, dtype=np.int64))
        if self._feeds_positions:
            limit = self.cache.max_positions - 1
            where = np.minimum(positions, limit).astype(np.int64)
            binding.bind_cpu_input("position_ids", where)
        binding.bind_cpu_input(SEQLENS, np.ascontiguousarray(seqlens, dtype=np.int32))
        binding.bind_cpu_input(TOTAL, np.array(total, dtype=np.int32))
        for past, present, array in zip(self._past_names, self._present_names, caches, strict=True):
            shape = list(array.shape)
            pointer = array.ctypes.data
            binding.bind_input(past, "cpu", 0, np.float32, shape, pointer)
            binding.bind_output(present, "cpu", 0, np.float32, shape, pointer)
        binding.bind_output("logits", "cpu", 0, np.float32, list(logits.shape), logits.ctypes.data)
        self.session.run_with_iobinding(binding)
        return logits

    def forward(self, ids: Ids, mask: Ids, positions: Ids, past: Past) -> tuple[Floats, Past]:
        raise NotImplementedError("a shared-buffer graph is called through run()")

    def prompt_pass(self, rows: Sequence[Sequence[int]]) -> Floats:
        """Logits of each row read from nothing, in one call (rows right-padded)."""
        ids, lengths = right_padded(rows)
        width = ids.shape[1]
        shape = (len(rows), self.cache.kv_heads, width, self.cache.head_dim)
        caches = [np.empty(shape, dtype=np.float32) for _ in range(2 * self.cache.layers)]
        positions = np.broadcast_to(np.arange(width, dtype=np.int64), ids.shape)
        return self.run(ids, positions, (lengths - 1).astype(np.int32), caches)

    # -- scoring -------------------------------------------------------------------------

    def _score_rows(self, inputs: list[list[int]], targets: list[list[int]]) -> list[FloatArray]:
        """Each row's log P(target | inputs so far), longest rows first in passes bounded by
        MAX_PASS_LOGITS, each pass one call from nothing (no prefix read once: a past of
        several tokens is read one row at a time by this op, which costs more than reading
        the prefix again in the batch)."""
        out: list[FloatArray] = [np.zeros(0)] * len(inputs)
        order = sorted(range(len(inputs)), key=lambda r: -len(inputs[r]))
        vocab_width = max(self.logits_width, 1)
        size = len(self._vocab)
        start = 0
        while start < len(order):
            width = len(inputs[order[start]])
            fit = max(1, MAX_PASS_LOGITS // (vocab_width * max(width, 1)))
            group = order[start : start + fit]
            start += len(group)
            logits = self.prompt_pass([inputs[r] for r in group])
            for k, r in enumerate(group):
                n = len(inputs[r])
                out[r] = _gather(log_softmax(logits[k, :n], size), targets[r])
        return out

    def next_token_log_probs(self, context: Sequence[int], *, bos: bool = True) -> FloatArray:
        """log P(w | <s> context) for every id w, natural logs (shape [len(vocab)])."""
        ids = ([self._vocab.bos_id] if bos else []) + [int(i) for i in context]
        if not ids:
            raise Unimplemented("a transformer needs <s> or a context to predict from")
        self.positions.check(len(ids), "context")
        logits = self.prompt_pass([ids])
        return np.asarray(log_softmax(logits[0, -1], len(self._vocab)), dtype=np.float64)
