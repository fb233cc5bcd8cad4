"""`--quantize int8`: a served folder's ONNX graphs with int8 weights, and the measured cost.

    write_served_folder(model_dir, write=..., check=..., manifest=..., quantize=Quantize())

Every export that writes ONNX graphs (`export-rnn`, `export_module`, `import-onnx`, `import-hf`)
takes it. The float folder is written and checked against its source first (within
`parity.PARITY_NATS`), then each graph goes through ONNX Runtime's dynamic quantization
(`onnxruntime.quantization.quantize_dynamic`): the weights of MatMul and LSTM nodes are stored as
int8 (symmetric, one scale per output channel) and their activations quantized to uint8 at
every call; an embedding table (Gather) is stored 8-bit too (uint8 with a zero point, ONNX
Runtime's layout) and dequantized after the lookup. A Gemm whose weight is a constant is
rewritten first as MatMul + Add (ONNX Runtime's dynamic quantization has no Gemm; GPT-2's
projections and torch's 2-D linears export as Gemm). GRU and plain RNN cells have no quantized
kernel in ONNX Runtime and stay float32, as do layer norms and every input, output and state: a
transformer's key/value cache is float32 as before (only MatMuls with a constant weight are
quantized), and the served backends run the graphs unchanged.

The cost is measured, not assumed: held-out text (given, or `default_held_out()`) is scored by the
server's own loader and scorer through the float folder and through the quantized one; the
largest per-token difference (nats) must stay within `max_token_error` (default
`DEFAULT_MAX_TOKEN_ERROR`), else `QuantizationError`; that figure, the two perplexities and the
graphs' sizes go into the manifest's `quantization` block (and GetModel's `quantization`).
"""

from __future__ import annotations

import hashlib
import logging
import math
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from lmserve.server.manifest import ModelManifest, Quantization

QuantizeMethod = Literal["int8", "float16"]
QUANTIZE_METHODS: tuple[QuantizeMethod, ...] = ("int8", "float16")
DEFAULT_MAX_TOKEN_ERROR = 0.1
"""The largest per-token log-prob difference (nats) an int8 folder may show against its float
graphs on the held-out text, unless the command states another (`--max-quantization-error`)."""

TORCHSCRIPT_NOT_QUANTIZED = (
    "--quantize needs ONNX graphs: a TorchScript model has none to quantize "
    "(export it to ONNX, or bring it as ONNX, to serve it in int8)"
)
DEFAULT_HELD_OUT_LINES = 200
_BATCH = 256  # held-out texts per scoring call
# The op types handed to quantize_dynamic: ONNX Runtime quantizes MatMul and LSTM dynamically
# (Gemm is rewritten as MatMul + Add before; GRU and RNN have no dynamic int8 kernel), and an
# embedding table read by Gather (stored 8-bit, dequantized after the lookup: without it a
# tied LSTM's table stays float beside its int8 copy and the folder does not shrink).
OP_TYPES = ("MatMul", "Gemm", "LSTM", "GRU", "Gather")
# What a quantized node becomes, by the op type it was.
_QUANTIZED = {
    "MatMulInteger": "MatMul",
    "DynamicQuantizeMatMul": "MatMul",
    "DynamicQuantizeLSTM": "LSTM",
}


class QuantizationError(ValueError):
    """The quantized graphs differ from the float ones beyond the stated bound (or could not be
    quantized); says by how much."""


@dataclass(frozen=True)
class Quantize:
    """What `--quantize` asks: the method, the bound on the per-token difference (nats), and
    the held-out texts (None: `DEFAULT_HELD_OUT`) with a name for the manifest."""

    method: QuantizeMethod = "int8"
    max_token_error: float = DEFAULT_MAX_TOKEN_ERROR
    held_out: Sequence[str] | None = None
    held_out_name: str = ""

    def __post_init__(self) -> None:
        if self.method not in QUANTIZE_METHODS:
            raise ValueError(f"--quantize {self.method!r}: int8 or float16")
        if not self.max_token_error > 0:
            raise ValueError(
                f"the quantization error bound must be > 0, not {self.max_token_error}"
            )

    @classmethod
    def from_flags(
        cls, method: str | None, max_error: float, held_out: Path | None
    ) -> Quantize | None:
        """The commands' `--quantize`, `--max-quantization-error`, `--held-out`; None without
        `--quantize`."""
        if method is None:
            if held_out is not None:
                raise ValueError("--held-out measures a quantization: give --quantize int8 too")
            return None
        if method not in QUANTIZE_METHODS:
            raise ValueError(f"--quantize {method!r}: int8 or float16")
        chosen: QuantizeMethod = "float16" if method == "float16" else "int8"
        if held_out is None:
            return cls(method=chosen, max_token_error=max_error)
        try:
            lines = held_out.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"--held-out {held_out}: unreadable ({exc})") from exc
        texts = [line for line in lines if line.strip()]
        if not texts:
            raise ValueError(f"--held-out {held_out}: no text in it")
        return cls(
            method=chosen, max_token_error=max_error, held_out=texts, held_out_name=held_out.name
        )


def add_quantize_flags(parser: Any) -> None:
    """`--quantize int8`, `--max-quantization-error`, `--held-out` on an export command."""
    parser.add_argument(
        "--quantize",
        choices=list(QUANTIZE_METHODS),
        help="int8: store the graphs' MatMul (and LSTM) weights as int8 (ONNX Runtime's dynamic "
        "quantization, for CPUs); float16: every float in float16, a transformer's cache too "
        "(for GPUs); the measured cost is recorded in the manifest",
    )
    parser.add_argument(
        "--max-quantization-error",
        type=float,
        default=DEFAULT_MAX_TOKEN_ERROR,
        metavar="NATS",
        help="refuse the quantized folder if a held-out token's log-prob moves by more "
        f"(default {DEFAULT_MAX_TOKEN_ERROR})",
    )
    parser.add_argument(
        "--held-out",
        type=Path,
        metavar="FILE",
        help="text (one per line) the quantization's cost is measured on "
        f"(default: the first {DEFAULT_HELD_OUT_LINES} lines of the KJV test set)",
    )


def quantize_from_args(args: Any) -> Quantize | None:
    return Quantize.from_flags(args.quantize, args.max_quantization_error, args.held_out)


def default_held_out() -> tuple[list[str], str]:
    """The default held-out text: the KJV test set's first lines (shipped with the project)."""
    from lmserve.export.corpora import kjv_split

    path = kjv_split("test")
    with path.open(encoding="utf-8") as f:
        lines = [line.strip() for _, line in zip(range(DEFAULT_HELD_OUT_LINES), f, strict=False)]
    return [t for t in lines if t], f"kjv test.txt, first {DEFAULT_HELD_OUT_LINES} lines"


@dataclass
class _Measured:
    token_log_probs: np.ndarray
    perplexity: float
    texts: list[str] = field(default_factory=list)


def quantize_folder(folder: Path, manifest: ModelManifest, request: Quantize) -> Quantization:
    """Quantizes the ONNX graphs of the (checked, float) folder in place and measures the cost;
    the folder's manifest must describe the float files, with checksums (it is read to load
    them). Returns the manifest's block; raises QuantizationError over the bound."""
    graphs = [key for key, entry in manifest.files.items() if entry.path.endswith(".onnx")]
    if manifest.format != "onnx" or not graphs:
        raise QuantizationError(
            f"--quantize needs ONNX graphs; this folder's format is {manifest.format}"
        )
    texts, name = (
        (list(request.held_out), request.held_out_name or "given text")
        if request.held_out is not None
        else default_held_out()
    )
    before = _measure(folder, manifest, texts)
    float_bytes = _graph_bytes(folder, manifest)
    if request.method == "float16":
        ops, nodes = _float16_graphs(folder, manifest, graphs)
    else:
        ops, nodes = _quantize_graphs(folder, manifest, graphs)
    if not nodes:
        raise QuantizationError("no MatMul, Gemm or LSTM weights to quantize in these graphs")
    after = _measure(folder, _rechecked(folder, manifest), before.texts)
    diff = np.abs(after.token_log_probs - before.token_log_probs)
    worst = float(diff.max()) if diff.size else 0.0
    if not worst <= request.max_token_error:  # NaN too
        raise QuantizationError(
            f"{request.method} log-probs differ from the float model's by {worst:.3g} nats on a "
            "held-out "
            f"token > the bound {request.max_token_error:g} (--max-quantization-error); "
            "nothing was written"
        )
    return Quantization(
        method="float16" if request.method == "float16" else "dynamic-int8",
        weights=request.method,
        ops=ops,
        nodes=nodes,
        max_token_error=worst,
        max_token_error_bound=request.max_token_error,
        float_perplexity=before.perplexity,
        perplexity=after.perplexity,
        perplexity_change=after.perplexity / before.perplexity - 1.0,
        held_out=name,
        held_out_tokens=int(before.token_log_probs.size),
        float_bytes=float_bytes,
        bytes=_graph_bytes(folder, manifest),
    )


def _rechecked(folder: Path, manifest: ModelManifest) -> ModelManifest:
    """The manifest with the quantized files' checksums (the loader verifies them)."""
    from lmserve.server.manifest import FileEntry, sha256_of, write_manifest

    files = {
        key: FileEntry(path=entry.path, sha256=sha256_of(folder / entry.path))
        for key, entry in manifest.files.items()
    }
    updated = manifest.model_copy(update={"files": files})
    write_manifest(folder, updated)
    return updated


def _graph_bytes(folder: Path, manifest: ModelManifest) -> int:
    return sum(
        (folder / e.path).stat().st_size
        for key, e in manifest.files.items()
        if e.path.endswith(".onnx") or key == "weights"
    )


def _measure(folder: Path, manifest: ModelManifest, texts: Sequence[str]) -> _Measured:
    """Every held-out token's log-prob through the server's loader and scorer (what Score
    gives), and the perplexity; texts longer than the model's positions are left out."""
    from lmserve.server.decoding.scoring import ScoreOptions, Scorer
    from lmserve.server.families.family import LoadContext
    from lmserve.server.families.loading import load_model

    parts = load_model(folder, manifest, LoadContext())
    assert parts.backend is not None
    scorer = Scorer(parts.backend, parts.codec)
    kept = list(texts)
    limit = parts.rules.positions.limit
    if limit is not None:  # <s> and </s> read besides the text's tokens
        lengths = np.diff(parts.codec.encode_texts(kept).offsets)
        kept = [t for t, n in zip(kept, lengths, strict=True) if n + 2 <= limit]
    if not kept:
        raise QuantizationError("no held-out text fits the model's positions")
    kept.sort(key=len)  # batches of about one length pad little; the order is the same twice
    pieces: list[np.ndarray] = []
    for start in range(0, len(kept), _BATCH):
        scored = scorer.score_texts(kept[start : start + _BATCH], ScoreOptions(), details=True)
        assert scored.details is not None
        pieces.extend(d.log_probs for d in scored.details)
    lps = np.concatenate(pieces).astype(np.float64)
    total, count = float(lps.sum()), int(lps.size)
    return _Measured(lps, math.exp(-total / count) if count else 1.0, list(kept))


def _quantize_graphs(
    folder: Path, manifest: ModelManifest, keys: Sequence[str]
) -> tuple[list[str], int]:
    """Rewrites each graph with int8 weights; weights a folder's graphs shared in `weights.bin`
    are shared again. Returns the op types quantized and the count of quantized nodes."""
    import onnx
    from onnxruntime.quantization import (  # type: ignore[import-untyped,unused-ignore]
        QuantType,
        quantize_dynamic,
    )

    quantized: list[onnx.ModelProto] = []
    ops: set[str] = set()
    nodes = 0
    with tempfile.TemporaryDirectory(prefix="lmserve-int8-") as tmp:
        for key in keys:
            source = folder / manifest.files[key].path
            model = onnx.load_model(str(source))  # external data from beside it
            _gemm_as_matmul(model)
            out = Path(tmp) / f"{key}.onnx"
            try:
                with _quiet_root_warnings():
                    quantize_dynamic(
                        model,
                        out,
                        op_types_to_quantize=list(OP_TYPES),
                        weight_type=QuantType.QInt8,
                        per_channel=True,  # 1/8 of per-tensor's error on the tiny LSTMs tried
                        extra_options={"MatMulConstBOnly": True},
                    )
            except Exception as exc:  # ONNX Runtime's own errors on an unusual graph
                raise QuantizationError(f"{source.name}: cannot be quantized ({exc})") from exc
            result = onnx.load_model(str(out))
            eight_bit = {
                t.name
                for t in result.graph.initializer
                if t.data_type in (onnx.TensorProto.INT8, onnx.TensorProto.UINT8)
            }
            for node in result.graph.node:
                if node.op_type in _QUANTIZED:
                    ops.add(_QUANTIZED[node.op_type])
                    nodes += 1
                elif node.op_type == "Gather" and node.input[0] in eight_bit:
                    ops.add("Gather")
                    nodes += 1
            quantized.append(result)
    shared = manifest.files.get("weights")
    if shared is not None:
        from lmserve.export.onnx_weights import WEIGHTS_FILE, write_shared_weights

        if shared.path != WEIGHTS_FILE:
            raise QuantizationError(f"shared weights in {shared.path}, expected {WEIGHTS_FILE}")
        write_shared_weights(quantized, folder / WEIGHTS_FILE)
    for key, model in zip(keys, quantized, strict=True):
        _write_checked(model, folder / manifest.files[key].path)
    return sorted(ops), nodes


def _write_checked(model: Any, path: Path) -> None:
    """Writes a rewritten graph and runs ONNX's checker on it. ONNX Runtime's
    SimplifiedLayerNormalization (an optimized Llama's RMSNorm, `hf.optimize`) is in ONNX's own
    domain but not ONNX's: the checker refuses it, so a graph holding one is not checked here;
    the measurement after this loads every graph in ONNX Runtime, the check that matters."""
    import onnx

    path.write_bytes(model.SerializeToString())
    if all(onnx.defs.has(n.op_type, n.domain) for n in model.graph.node if not n.domain):
        onnx.checker.check_model(str(path), full_check=True)


def _float16_graphs(
    folder: Path, manifest: ModelManifest, keys: Sequence[str]
) -> tuple[list[str], int]:
    """Rewrites each graph in float16 (ONNX Runtime's converter). A transformer's inputs and
    outputs become float16 too, so its key/value cache is half the bytes and stays float16
    on the device; a recurrent graph keeps float32 inputs, outputs and states (the recurrent
    backends feed float32 states). Returns the op types whose weights became float16 and
    how many nodes read them."""
    import onnx
    from onnxruntime.transformers.float16 import (  # type: ignore[import-untyped,unused-ignore]
        convert_float_to_float16,
    )

    if manifest.files.get("weights") is not None:
        raise QuantizationError(
            "float16 is offered for graphs that hold their own weights (a transformer folder); "
            "this folder's graphs share weights.bin"
        )
    ops: set[str] = set()
    nodes = 0
    for key in keys:
        path = folder / manifest.files[key].path
        model = onnx.load_model(str(path))
        float_weights = {
            t.name for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT
        }
        for node in model.graph.node:
            if any(name in float_weights for name in node.input):
                ops.add(node.op_type)
                nodes += 1
        try:
            with _quiet_root_warnings():
                converted = convert_float_to_float16(
                    model, keep_io_types=manifest.kind != "transformer", disable_shape_infer=True
                )
        except Exception as exc:  # the converter's own errors on an unusual graph
            raise QuantizationError(f"{path.name}: cannot be converted ({exc})") from exc
        _write_checked(converted, path)
    return sorted(ops), nodes


@contextmanager
def _quiet_root_warnings() -> Iterator[None]:
    """quantize_dynamic logs advice on the root logger ("consider pre-processing"); an export's
    output is its summary, so the root logger is raised to ERROR while it runs."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)


def _gemm_as_matmul(model: Any) -> None:
    """Each Gemm(A, W[, C]) with a constant W, alpha = beta = 1 and A not transposed becomes
    MatMul(A, W or W^T) + C, which ONNX Runtime quantizes dynamically (it has no int8 Gemm)."""
    from onnx import helper, numpy_helper

    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    out_nodes = []
    replaced: set[str] = set()
    for node in graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if (
            node.op_type != "Gemm"
            or node.input[1] not in inits
            or attrs.get("alpha", 1.0) != 1.0
            or attrs.get("beta", 1.0) != 1.0
            or attrs.get("transA", 0)
        ):
            out_nodes.append(node)
            continue
        replaced.add(node.input[1])
        weight = numpy_helper.to_array(inits[node.input[1]])
        if attrs.get("transB", 0):
            weight = np.ascontiguousarray(weight.T)
        digest = hashlib.sha256(node.name.encode() + node.output[0].encode()).hexdigest()[:8]
        w_name = f"{node.input[1]}_matmul_{digest}"
        graph.initializer.append(numpy_helper.from_array(weight, w_name))
        has_bias = len(node.input) > 2 and node.input[2]
        product = f"{node.output[0]}_matmul" if has_bias else node.output[0]
        out_nodes.append(
            helper.make_node("MatMul", [node.input[0], w_name], [product], name=f"{node.name}_mm")
        )
        if has_bias:
            out_nodes.append(
                helper.make_node(
                    "Add", [product, node.input[2]], [node.output[0]], name=f"{node.name}_add"
                )
            )
    del graph.node[:]
    graph.node.extend(out_nodes)
    _drop_unused(graph, replaced)


def _drop_unused(graph: Any, names: set[str]) -> None:
    """Drops the initializers `names` no node or output reads any more (none, if the graph has
    subgraphs, which may read them from outside)."""
    if any(a.type in (5, 10) for node in graph.node for a in node.attribute):  # GRAPH(S)
        return
    used = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
    keep = [t for t in graph.initializer if t.name not in names or t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(keep)
