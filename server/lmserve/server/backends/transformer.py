"""Decoder-only transformers exported to ONNX with past key values, run by ONNX Runtime.

The graph is optimum's `text-generation-with-past` layout (what `lmserve import-hf` writes and
`optimum-cli export onnx` writes):

    input_ids [B, T], attention_mask [B, P + T], position_ids [B, T],
    past_key_values.N.key / .value [B, kv_heads, P, head_dim]
      -> logits [B, T, V], present.N.key / .value [B, kv_heads, P + T, head_dim]

One graph serves every use: Score reads all positions of a batch of texts in one pass (past of
length 0, rows right-padded, the padding masked and never read), and generation steps with the
cache (`kv_stepping.KvStepper`). A text needs one position per input token (`<s>` included):
longer than the model's `max_positions` it is refused, never silently cut.

Rows of a scoring batch that share their first tokens (a Rerank n-best list) read those tokens
once: the shared prefix is one pass of batch 1, its cache is repeated for every row, and only
the rows' own suffixes are read in the batched pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from lmserve.server.backends.base import BatchScores, EncodedBatch, FloatArray, Vocabulary
from lmserve.server.backends.onnx import OnnxOptions, open_session, run_bound, state_binding
from lmserve.server.backends.positions import Positions
from lmserve.server.backends.segments import segment_sums
from lmserve.server.errors import ModelLoadError, Unimplemented
from lmserve.server.manifest import ModelManifest, read_json_object

Floats = npt.NDArray[np.float32]
Ids = npt.NDArray[np.int64]
# Past arrays: per layer a key and a value, each [batch, kv_heads, positions, head_dim].
Past = tuple[Floats, ...]

# Logits of one scoring pass are at most this many floats (rows x positions x vocabulary):
# 32M floats, 128 MB, about 640 positions of a 50k-token vocabulary.
MAX_PASS_LOGITS = 32 * 1024 * 1024
# A batch shares its first tokens through the cache from this many on (fewer cost more to
# copy than to recompute).
MIN_SHARED_PREFIX = 4


# The cache element types served, by ONNX Runtime's name: float16 is a `--quantize float16`
# folder's (the GPU's precision).
CACHE_DTYPES: dict[str, np.dtype[Any]] = {
    "tensor(float)": np.dtype(np.float32),
    "tensor(float16)": np.dtype(np.float16),
}


@dataclass(frozen=True)
class CacheShape:
    """The key/value cache of one decoder: per layer a key and a value of
    [batch, kv_heads, positions, head_dim], float32 (or the graph's float16)."""

    layers: int
    kv_heads: int
    head_dim: int
    max_positions: int
    dtype: np.dtype[Any] = np.dtype(np.float32)

    def bytes_per_position(self) -> int:
        """Cache bytes one stream adds per token it has read (keys and values, every layer)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype.itemsize

    def empty(self, batch: int) -> Past:
        """The cache of `batch` rows that have read nothing."""
        zeros = np.zeros((batch, self.kv_heads, 0, self.head_dim), dtype=self.dtype)
        return (zeros,) * (2 * self.layers)

    @classmethod
    def from_config(cls, config: dict[str, Any], where: str) -> CacheShape:
        """The cache a transformers `config.json` implies (GPT-2's key names or Llama's)."""

        def stated(*keys: str) -> int:
            for key in keys:
                value = config.get(key)
                if isinstance(value, int) and value > 0:
                    return value
            raise ModelLoadError(where, f"config.json does not state {' or '.join(keys)}")

        heads = stated("num_attention_heads", "n_head")
        kv_heads = config.get("num_key_value_heads") or heads
        head_dim = config.get("head_dim") or stated("hidden_size", "n_embd") // heads
        return cls(
            layers=stated("num_hidden_layers", "n_layer"),
            kv_heads=int(kv_heads),
            head_dim=int(head_dim),
            max_positions=stated("max_position_embeddings", "n_positions"),
        )


def past_names(layers: int) -> list[str]:
    return [f"past_key_values.{i}.{kind}" for i in range(layers) for kind in ("key", "value")]


def present_names(layers: int) -> list[str]:
    return [f"present.{i}.{kind}" for i in range(layers) for kind in ("key", "value")]


def open_graph(
    folder: Path, manifest: ModelManifest, options: OnnxOptions, inputs: list[str]
) -> tuple[CacheShape, Any]:
    """A transformer folder's cache (its `config.json`) and graph session, checked to read
    `inputs` and every past and to write the logits and every present."""
    config_path = manifest.file_path(folder, "config")
    cache = CacheShape.from_config(read_json_object(config_path), str(config_path))
    session = open_session(
        manifest.file_path(folder, "graph"),
        options,
        [*inputs, *past_names(cache.layers)],
        {"logits": None, **{name: None for name in present_names(cache.layers)}},
    )
    return cache, session


def logits_width(session: Any) -> int | None:
    """The logits' last dimension as the graph states it (None when symbolic)."""
    logits = next(o for o in session.get_outputs() if o.name == "logits")
    width = logits.shape[-1] if logits.shape else None
    return width if isinstance(width, int) else None


def log_softmax(logits: Floats, size: int) -> Floats:
    """Natural-log probabilities over the last axis, normalised over every logit the model
    has and cut to the vocabulary's `size` (a checkpoint may pad its output past the
    tokenizer's tokens: those keep their mass, as in transformers)."""
    top = logits.max(axis=-1, keepdims=True)
    shifted = logits - top
    lse = np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    out: Floats = shifted[..., :size] - lse
    return out


class TransformerBackend:
    """A transformer LM served by ONNX Runtime; keeps no per-request state (natural logs)."""

    def __init__(
        self, session: Any, cache: CacheShape, vocab: Vocabulary, device_states: str = "auto"
    ) -> None:
        self.session = session
        self.cache = cache
        self._vocab = vocab
        inputs = {i.name for i in session.get_inputs()}
        self._feeds_positions = "position_ids" in inputs
        self._past_names = past_names(cache.layers)
        self._present_names = present_names(cache.layers)
        self._outputs = ["logits", *self._present_names]
        # On the CUDA provider the cache stays in GPU memory between calls (I/O binding,
        # `DeviceState`): only ids go in and logits come out per step.
        self.binds_cache, self._cache_device = state_binding(session, device_states)

    @property
    def vocab(self) -> Vocabulary:
        return self._vocab

    @property
    def max_positions(self) -> int:
        return self.cache.max_positions

    @property
    def positions(self) -> Positions:
        """The positions rule (`backends.positions`) at this model's length."""
        return Positions(self.cache.max_positions)

    @classmethod
    def load(
        cls, folder: Path, manifest: ModelManifest, options: OnnxOptions, vocab: Vocabulary
    ) -> TransformerBackend:
        cache, session = open_graph(folder, manifest, options, ["input_ids", "attention_mask"])
        names = past_names(cache.layers)
        for arg in session.get_inputs():
            if arg.name in names and arg.type not in CACHE_DTYPES:
                raise ModelLoadError(
                    str(folder / manifest.files["graph"].path),
                    f"input {arg.name!r} is {arg.type}: float32 and float16 caches are served "
                    "(export the model in float32; `--quantize float16` for the GPU)",
                )
        past_type = next(arg.type for arg in session.get_inputs() if arg.name == names[0])
        cache = replace(cache, dtype=CACHE_DTYPES[past_type])
        width = logits_width(session)
        if width is not None and width < len(vocab):
            raise ModelLoadError(
                str(folder / manifest.files["graph"].path),
                f"logits have {width} entries, the tokenizer has {len(vocab)} tokens",
            )
        return cls(session, cache, vocab, options.device_states)

    # -- the graph -----------------------------------------------------------------------

    def forward(self, ids: Ids, mask: Ids, positions: Ids, past: Past) -> tuple[Floats, Past]:
        """One graph call: logits [B, T, V'] (float32) and the cache after the tokens. Bound
        (`binds_cache`), a cache that is a `DeviceState` (the last call's present) goes in where
        it lies and the new one stays on the device: only the logits come to the host."""
        feed: dict[str, npt.NDArray[Any]] = {"input_ids": ids, "attention_mask": mask}
        if self._feeds_positions:
            feed["position_ids"] = positions
        pasts = dict(zip(self._past_names, past, strict=True))
        if self.binds_cache:
            logits, cache = run_bound(
                self.session, feed, pasts, "logits", self._present_names, self._cache_device
            )
            return np.asarray(logits, dtype=np.float32), cache
        logits, *present = self.session.run(self._outputs, {**feed, **pasts})
        return np.asarray(logits, dtype=np.float32), tuple(present)

    # -- scoring -------------------------------------------------------------------------

    def score(
        self, batch: EncodedBatch, *, bos: bool = True, eos: bool = True, per_token: bool = False
    ) -> BatchScores:
        """log P(tokens [+ </s>] | <s>) per text in one pass per group of rows, natural logs.
        With `bos` off each text is read from its own first token instead (`batch.starts`):
        a transformer predicts nothing from an empty context."""
        if not bos and batch.starts is None:
            raise Unimplemented(
                "a transformer reads <s> or a text's first token first: with options.bos=false "
                "the batch must carry its texts' first tokens (EncodedBatch.first_as_starts)"
            )
        n = batch.batch_size
        lengths = np.diff(batch.offsets) + (1 if eos else 0)  # inputs = scored positions
        if n and lengths.max() > self.max_positions:  # the front refused these already
            i = int(np.argmax(lengths > self.max_positions))
            self.positions.check(int(lengths[i]), f"texts[{i}]")
        token_offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=token_offsets[1:])
        flat = np.zeros(int(token_offsets[-1]), dtype=np.float64)
        rows = [i for i in range(n) if lengths[i] > 0]
        if rows:
            inputs, targets = self._inputs_and_targets(batch, rows, eos)
            for i, scores in zip(rows, self._score_rows(inputs, targets), strict=True):
                flat[token_offsets[i] : token_offsets[i + 1]] = scores
        totals = segment_sums(flat, token_offsets)
        if not per_token:
            return BatchScores(totals=totals)
        return BatchScores(totals=totals, token_log_probs=flat, token_offsets=token_offsets)

    def _inputs_and_targets(
        self, batch: EncodedBatch, rows: Sequence[int], eos: bool
    ) -> tuple[list[list[int]], list[list[int]]]:
        """Per row: `<s> w1..wn` (the last word dropped when `</s>` is not scored; the row's
        start in place of `<s>` when the batch has `starts`) and `w1..wn [</s>]`."""
        bos_id, eos_id = self._vocab.bos_id, self._vocab.eos_id
        starts = batch.starts
        inputs, targets = [], []
        for i in rows:
            ids = batch.ids[batch.offsets[i] : batch.offsets[i + 1]].tolist()
            read = [bos_id if starts is None else int(starts[i]), *ids]
            wanted = [*ids, eos_id] if eos else ids
            inputs.append(read[: len(wanted)])
            targets.append(wanted)
        return inputs, targets

    def _score_rows(self, inputs: list[list[int]], targets: list[list[int]]) -> list[FloatArray]:
        """Each row's log P(target | inputs so far) per position, in passes bounded by
        MAX_PASS_LOGITS; a prefix every row shares is read once (see the module doc)."""
        shared = _shared_prefix(inputs, targets)
        prefix_scores: FloatArray = np.zeros(0)
        prefix_past: Past | None = None
        if len(inputs) > 1 and shared >= MIN_SHARED_PREFIX:
            ids = np.asarray([inputs[0][:shared]], dtype=np.int64)
            logits, prefix_past = self.forward(
                ids,
                np.ones_like(ids),
                np.arange(shared, dtype=np.int64)[None, :],
                self.cache.empty(1),
            )
            prefix_scores = _gather(log_softmax(logits, len(self._vocab))[0], targets[0][:shared])
            inputs = [row[shared:] for row in inputs]
            targets = [row[shared:] for row in targets]
        else:
            shared = 0
        out: list[FloatArray | None] = [None] * len(inputs)
        order = sorted(range(len(inputs)), key=lambda r: -len(inputs[r]))
        start = 0
        vocab_width = max(len(self._vocab), 1)
        while start < len(order):
            width = len(inputs[order[start]])
            fit = max(1, MAX_PASS_LOGITS // (vocab_width * max(width, 1)))
            group = order[start : start + fit]
            start += len(group)
            for r, scores in zip(
                group, self._pass(inputs, targets, group, shared, prefix_past), strict=True
            ):
                out[r] = np.concatenate([prefix_scores, scores]) if shared else scores
        return [row if row is not None else np.zeros(0) for row in out]

    def _pass(
        self,
        inputs: list[list[int]],
        targets: list[list[int]],
        group: list[int],
        shared: int,
        prefix_past: Past | None,
    ) -> list[FloatArray]:
        """One batched pass over the rows of `group` (right-padded after `shared` positions
        of cache)."""
        width = len(inputs[group[0]])
        ids = np.zeros((len(group), width), dtype=np.int64)
        mask = np.zeros((len(group), shared + width), dtype=np.int64)
        mask[:, :shared] = 1
        for k, r in enumerate(group):
            ids[k, : len(inputs[r])] = inputs[r]
            mask[k, shared : shared + len(inputs[r])] = 1
        positions = np.broadcast_to(
            np.arange(shared, shared + width, dtype=np.int64), ids.shape
        ).copy()
        if prefix_past is None:
            past = self.cache.empty(len(group))
        else:
            past = tuple(np.repeat(p, len(group), axis=0) for p in prefix_past)
        logits, _ = self.forward(ids, mask, positions, past)
        size = len(self._vocab)
        return [
            _gather(log_softmax(logits[k, : len(inputs[r])], size), targets[r])
            for k, r in enumerate(group)
        ]

    def next_token_log_probs(self, context: Sequence[int], *, bos: bool = True) -> FloatArray:
        """log P(w | <s> context) for every id w, natural logs (shape [len(vocab)])."""
        ids = ([self._vocab.bos_id] if bos else []) + [int(i) for i in context]
        if not ids:
            raise Unimplemented("a transformer needs <s> or a context to predict from")
        self.positions.check(len(ids), "context")
        tokens = np.asarray([ids], dtype=np.int64)
        logits, _ = self.forward(
            tokens,
            np.ones_like(tokens),
            np.arange(len(ids), dtype=np.int64)[None, :],
            self.cache.empty(1),
        )
        return np.asarray(log_softmax(logits[0, -1], len(self._vocab)), dtype=np.float64)


def _gather(log_probs: Floats, targets: Sequence[int]) -> FloatArray:
    picked = log_probs[np.arange(len(targets)), np.asarray(targets, dtype=np.int64)]
    return np.asarray(picked, dtype=np.float64)


def _shared_prefix(inputs: list[list[int]], targets: list[list[int]]) -> int:
    """Input positions every row reads alike and scores alike (at least one input position
    is left to each row's own pass)."""
    if len(inputs) < 2:
        return 0
    first_in, first_out = inputs[0], targets[0]
    limit = min(len(row) for row in inputs) - 1
    shared = 0
    while shared < limit and all(
        row_in[shared] == first_in[shared] and row_out[shared] == first_out[shared]
        for row_in, row_out in zip(inputs, targets, strict=True)
    ):
        shared += 1
    return shared
