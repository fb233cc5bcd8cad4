"""ONNX Runtime's transformer optimizer on a graph in optimum's layout, in place.

    optimization = optimize_graph(folder / "model.onnx", config)  # None: nothing fused

`onnxruntime.transformers.optimizer.optimize_model` rewrites the subgraphs it recognises into
ONNX Runtime's fused operators (com.microsoft domain): GPT-2's LayerNorm + residual Add as
SkipLayerNormalization and its tanh GELU as FastGelu; Llama's RMSNorm as
SimplifiedLayerNormalization / SkipSimplifiedLayerNormalization. Its fusions are chosen by a
model type; ONNX Runtime fuses Llama-style decoders under "gpt2" too (its own Llama export does),
so every decoder but those it names itself is optimized as "gpt2". Attention and rotary fusions
run as well and fuse where their patterns match the graph (on the graphs transformers 5 traces
in this layout, with separate past key and value inputs, they find none: see
docs/models/transformers.md). Only the Python fusions run (`opt_level=0`): the graph stays
provider-independent, and the session applies ONNX Runtime's own graph optimizations at load as
for any graph.

The rewrite keeps the graph's inputs and outputs (names, types, dynamic axes): the served
backend feeds it exactly as before; a graph whose interface changed is refused
(`OptimizationError`). The caller checks parity on the written graph afterwards.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lmserve.server.manifest import GraphOptimization

# Model types ONNX Runtime's optimizer names for decoders of their own; any other decoder is
# optimized as "gpt2" (see the module doc).
_OWN_MODEL_TYPES = frozenset({"gpt2", "qwen3"})
_DEFAULT_MODEL_TYPE = "gpt2"


class OptimizationError(ValueError):
    """The optimizer failed on the graph, or changed what the backend feeds and reads."""


def optimizer_model_type(config: dict[str, Any]) -> str:
    """The `model_type` handed to `optimize_model` for a checkpoint's config.json."""
    own = str(config.get("model_type", ""))
    return own if own in _OWN_MODEL_TYPES else _DEFAULT_MODEL_TYPE


def _sizes(config: dict[str, Any]) -> tuple[int, int]:
    """Query heads and hidden size, by GPT-2's or Llama's key names (0: let ONNX Runtime read
    them from the graph)."""
    heads = config.get("num_attention_heads") or config.get("n_head") or 0
    hidden = config.get("hidden_size") or config.get("n_embd") or 0
    return int(heads), int(hidden)


def _interface(model: Any) -> list[tuple[str, str]]:
    """The graph's inputs and outputs as (name, type with its dimensions)."""
    return [(v.name, str(v.type)) for v in [*model.graph.input, *model.graph.output]]


def optimize_graph(path: Path, config: dict[str, Any]) -> GraphOptimization | None:
    """Rewrites the graph at `path` with ONNX Runtime's fusions; the fused operators and their
    node counts, or None (the file untouched) when nothing matched. Weights kept beside the
    graph (`<graph>_data`, optimum's external data) are written back there."""
    import onnx
    import onnxruntime as ort  # type: ignore[import-untyped,unused-ignore]
    from onnxruntime.transformers.fusion_options import (  # type: ignore[import-untyped,unused-ignore]
        FusionOptions,
    )
    from onnxruntime.transformers.optimizer import (  # type: ignore[import-untyped,unused-ignore]
        optimize_model,
    )

    model_type = optimizer_model_type(config)
    heads, hidden = _sizes(config)
    before = onnx.load_model(str(path), load_external_data=False)
    external = any(t.data_location == onnx.TensorProto.EXTERNAL for t in before.graph.initializer)
    try:
        optimized = optimize_model(
            str(path),
            model_type=model_type,
            num_heads=heads,
            hidden_size=hidden,
            optimization_options=FusionOptions(model_type),
            opt_level=0,
            use_gpu=False,
        )
        fused = {op: n for op, n in optimized.get_fused_operator_statistics().items() if n}
    except Exception as exc:  # ONNX Runtime's own errors on an unusual graph
        raise OptimizationError(f"{path.name}: ONNX Runtime's optimizer failed ({exc})") from exc
    if not fused:
        return None
    if _interface(optimized.model) != _interface(before):
        raise OptimizationError(
            f"{path.name}: ONNX Runtime's optimizer changed the graph's inputs or outputs; "
            "serve it as exported (--no-optimize)"
        )
    _import_contrib_domain(optimized.model)
    _declare_types(optimized.model)
    if external:  # onnx appends to an existing data file: the weights are in memory now
        (path.parent / f"{path.name}_data").unlink(missing_ok=True)
        onnx.save_model(
            optimized.model,
            str(path),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=f"{path.name}_data",
        )
    else:
        onnx.save_model(optimized.model, str(path))
    return GraphOptimization(
        model_type=model_type, fused_ops=fused, onnxruntime_version=ort.__version__
    )


def _import_contrib_domain(model: Any) -> None:
    """Declares the com.microsoft opset the fused operators belong to: the optimizer leaves it
    out (ONNX Runtime runs the graph regardless), and onnx's checker and shape inference, which
    `--quantize` runs on the graph, refuse a node of an undeclared domain."""
    from onnx import helper

    used = {node.domain for node in model.graph.node}
    declared = {entry.domain for entry in model.opset_import}
    if "com.microsoft" in used and "com.microsoft" not in declared:
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))


def _declare_types(model: Any) -> None:
    """Records each intermediate tensor's element type (no shape) in the graph's value_info.
    onnx's shape inference knows no com.microsoft operator, so without it nothing after a fused
    node has a type, and `--quantize` (ONNX Runtime's dynamic quantization, which asks onnx for
    the type of every MatMul's input) refuses the graph; ONNX Runtime's own symbolic inference
    knows them. Shapes are left out: the types are all the quantizer needs, and a recorded
    shape could only disagree with what the session infers."""
    from onnx import helper
    from onnxruntime.tools.symbolic_shape_infer import (  # type: ignore[import-untyped,unused-ignore]
        SymbolicShapeInference,
    )

    try:
        inferred = SymbolicShapeInference.infer_shapes(model, auto_merge=True)
    except Exception:  # an op it cannot follow: the graph serves as it is, untyped
        return
    outputs = {o.name for o in model.graph.output}
    produced = {name for node in model.graph.node for name in node.output}
    known = {v.name for v in model.graph.value_info}
    for value in inferred.graph.value_info:
        elem = value.type.tensor_type.elem_type
        if value.name in produced and value.name not in outputs | known and elem:
            model.graph.value_info.append(helper.make_tensor_value_info(value.name, elem, None))
