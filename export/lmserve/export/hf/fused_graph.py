"""A GPT-2 or Llama checkpoint -> one decoder graph on ONNX Runtime's fused CPU ops, its
key/value cache one preallocated buffer that the graph appends to in place.

    model_proto = fused_decoder(model)          # a transformers GPT2LMHeadModel/LlamaForCausalLM
    onnx.save_model(model_proto, path, save_as_external_data=True, location="model.onnx.data")

Written node by node from the model's own weights (no tracing): attention is
`com.microsoft.GroupQueryAttention` (grouped-query Llama included, its rotary embedding done
inside the op from cos/sin tables), layer norms are `LayerNormalization` /
`SkipLayerNormalization` (GPT-2) and `SimplifiedLayerNormalization` /
`SkipSimplifiedLayerNormalization` (Llama's RMSNorm), GPT-2's MLP activation `FastGelu` (its
`gelu_new`, the tanh form) and Llama's `QuickGelu` with alpha 1 (x * sigmoid(x), SiLU).

The graph (`SHARED_CACHE_INPUTS`):

    input_ids [B, T] int64, position_ids [B, T] int64 (GPT-2's learned positions only),
    seqlens_k [B] int32 (each row's length after these T tokens, minus one),
    total_sequence_length [] int32 (the longest row's length after them),
    past_key_values.N.key / .value [B, kv_heads, C, head_dim]
      -> logits [B, T, V], present.N.key / .value [B, kv_heads, C, head_dim]

Bound with I/O binding to the same memory as its past, present is the past with each row's T
new positions written after that row's own length (rows are right-aligned nowhere: row b's
positions are 0..seqlens_k[b] of its buffer row). ONNX Runtime's contract for the op, checked
by this package's parity reading and the stepper's tests: in one call either every row starts
from nothing (T equals total_sequence_length; shorter rows right-padded, their padding never
read) or every row reads exactly T new tokens after its own past.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
from onnx import TensorProto, helper, numpy_helper

from lmserve.server.backends.transformer import CacheShape, past_names, present_names

__all__ = ["FusedGraphError", "fused_decoder", "supports_fused"]

OPSET = 17
MS = "com.microsoft"
# Rotary scalings whose tables do not depend on the sequence read (computed once here).
STATIC_ROPE = ("default", "linear", "llama3")


class FusedGraphError(ValueError):
    """The checkpoint uses something this graph does not write; the optimum layout serves it."""


def supports_fused(model: Any) -> str | None:
    """None when `model` can be written as a fused graph, else why not (one line)."""
    config = model.config
    kind = type(model).__name__
    if kind == "GPT2LMHeadModel":
        if getattr(config, "scale_attn_by_inverse_layer_idx", False):
            return "GPT-2 with scale_attn_by_inverse_layer_idx"
        if not getattr(config, "scale_attn_weights", True):
            return "GPT-2 without scale_attn_weights"
        if config.activation_function not in ("gelu_new", "gelu_pytorch_tanh"):
            return f"GPT-2 activation {config.activation_function}"
        return None
    if kind == "LlamaForCausalLM":
        if config.hidden_act != "silu":
            return f"Llama activation {config.hidden_act}"
        if getattr(config, "mlp_bias", False):
            return "Llama with mlp_bias"
        rope = _rope_type(config)
        if rope not in STATIC_ROPE:
            return f"rotary scaling {rope}"
        return None
    return f"architecture {kind}"


def _rope_type(config: Any) -> str:
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    if isinstance(params, dict):
        return str(params.get("rope_type") or params.get("type") or "default")
    return "default"


class _Graph:
    """Nodes and initializers as they are added."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.weights: list[onnx.TensorProto] = []
        self._count = 0

    def weight(self, name: str, array: npt.NDArray[Any]) -> str:
        self.weights.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def node(
        self,
        op: str,
        inputs: list[str],
        outputs: int | list[str] = 1,
        domain: str = "",
        **attrs: Any,
    ) -> list[str]:
        self._count += 1
        if isinstance(outputs, int):
            outputs = [f"{op}_{self._count}_{k}" for k in range(outputs)]
        self.nodes.append(
            helper.make_node(
                op, inputs, outputs, name=f"{op}_{self._count}", domain=domain, **attrs
            )
        )
        return outputs


def _np(tensor: Any) -> npt.NDArray[np.float32]:
    return np.asarray(tensor.detach().to("cpu").float().numpy(), dtype=np.float32)


def fused_decoder(model: Any) -> onnx.ModelProto:
    """The fused graph of `model` (a transformers GPT-2 or Llama causal LM, eval mode);
    FusedGraphError when `supports_fused` says no."""
    why = supports_fused(model)
    if why is not None:
        raise FusedGraphError(f"no fused graph for {why}")
    config = model.config.to_dict()
    cache = CacheShape.from_config(config, "config.json")
    g = _Graph()
    if type(model).__name__ == "GPT2LMHeadModel":
        logits = _gpt2(g, model, cache)
        positions = True
    else:
        logits = _llama(g, model, cache)
        positions = not fused_rotary(cache.head_dim)
    return _model(g, cache, logits, vocab=int(model.config.vocab_size), positions=positions)


def fused_rotary(head_dim: int) -> bool:
    """Whether GroupQueryAttention turns the rotary embedding itself: its CPU kernel does so
    only for head sizes that are multiples of 16; others get `RotaryEmbedding` nodes before it
    (then the graph reads `position_ids`)."""
    return head_dim % 16 == 0


def _attention(g: _Graph, qkv: str, layer: int, cache: CacheShape, heads: int, rotary: bool) -> str:
    """GroupQueryAttention on a packed [q | k | v] projection (rotary embedding applied to q
    and k when `rotary`)."""
    present = present_names(cache.layers)[2 * layer : 2 * layer + 2]
    past = past_names(cache.layers)[2 * layer : 2 * layer + 2]
    inside = rotary and fused_rotary(cache.head_dim)
    if rotary and not inside:
        d = cache.head_dim
        widths = f"split_{heads * d}_{cache.kv_heads * d}"
        if widths not in {w.name for w in g.weights}:
            g.weight(widths, np.array([heads * d, cache.kv_heads * d, cache.kv_heads * d]))
        q, k, v = g.node("Split", [qkv, widths], 3, axis=-1)
        tables = ["position_ids", "cos_cache", "sin_cache"]
        q = g.node("RotaryEmbedding", [q, *tables], domain=MS, num_heads=heads)[0]
        k = g.node("RotaryEmbedding", [k, *tables], domain=MS, num_heads=cache.kv_heads)[0]
        inputs = [q, k, v]
    else:
        inputs = [qkv, "", ""]
    inputs += [*past, "seqlens_k", "total_sequence_length"]
    if inside:
        inputs += ["cos_cache", "sin_cache"]
    out = g.node(
        "GroupQueryAttention",
        inputs,
        [f"attn_{layer}", *present],
        domain=MS,
        num_heads=heads,
        kv_num_heads=cache.kv_heads,
        do_rotary=1 if inside else 0,
        rotary_interleaved=0,
    )
    return out[0]


def _gpt2(g: _Graph, model: Any, cache: CacheShape) -> str:
    c = model.config
    eps = float(c.layer_norm_epsilon)
    t = model.transformer
    wte = _np(t.wte.weight)
    g.weight("wte", wte)
    g.weight("wpe", _np(t.wpe.weight))
    tokens = g.node("Gather", ["wte", "input_ids"])[0]
    places = g.node("Gather", ["wpe", "position_ids"])[0]
    hidden = g.node("Add", [tokens, places])[0]
    normed: str | None = None
    for i, block in enumerate(t.h):
        p = f"h{i}."
        if normed is None:
            g.weight(p + "ln_1.g", _np(block.ln_1.weight))
            g.weight(p + "ln_1.b", _np(block.ln_1.bias))
            normed = g.node(
                "LayerNormalization", [hidden, p + "ln_1.g", p + "ln_1.b"], epsilon=eps, axis=-1
            )[0]
        g.weight(p + "c_attn.w", _np(block.attn.c_attn.weight))
        g.weight(p + "c_attn.b", _np(block.attn.c_attn.bias))
        qkv = g.node("MatMul", [normed, p + "c_attn.w"])[0]
        qkv = g.node("Add", [qkv, p + "c_attn.b"])[0]
        attn = _attention(g, qkv, i, cache, int(c.n_head), rotary=False)
        g.weight(p + "attn.c_proj.w", _np(block.attn.c_proj.weight))
        g.weight(p + "attn.c_proj.b", _np(block.attn.c_proj.bias))
        g.weight(p + "ln_2.g", _np(block.ln_2.weight))
        g.weight(p + "ln_2.b", _np(block.ln_2.bias))
        projected = g.node("MatMul", [attn, p + "attn.c_proj.w"])[0]
        normed2, _, _, hidden = g.node(
            "SkipLayerNormalization",
            [projected, hidden, p + "ln_2.g", p + "ln_2.b", p + "attn.c_proj.b"],
            4,
            domain=MS,
            epsilon=eps,
        )
        g.weight(p + "c_fc.w", _np(block.mlp.c_fc.weight))
        g.weight(p + "c_fc.b", _np(block.mlp.c_fc.bias))
        g.weight(p + "mlp.c_proj.w", _np(block.mlp.c_proj.weight))
        g.weight(p + "mlp.c_proj.b", _np(block.mlp.c_proj.bias))
        up = g.node("MatMul", [normed2, p + "c_fc.w"])[0]
        act = g.node("FastGelu", [up, p + "c_fc.b"], domain=MS)[0]
        down = g.node("MatMul", [act, p + "mlp.c_proj.w"])[0]
        last = i == len(t.h) - 1
        n = f"h{i + 1}." if not last else "ln_f."
        norm = t.h[i + 1].ln_1 if not last else t.ln_f
        g.weight(n + "g", _np(norm.weight))
        g.weight(n + "b", _np(norm.bias))
        normed, _, _, hidden = g.node(
            "SkipLayerNormalization",
            [down, hidden, n + "g", n + "b", p + "mlp.c_proj.b"],
            4,
            domain=MS,
            epsilon=eps,
        )
    assert normed is not None
    g.weight("lm_head.w", np.ascontiguousarray(_np(model.lm_head.weight).T))
    return g.node("MatMul", [normed, "lm_head.w"], ["logits"])[0]


def _llama(g: _Graph, model: Any, cache: CacheShape) -> str:
    c = model.config
    eps = float(c.rms_norm_eps)
    inner = model.model
    g.weight("embed", _np(inner.embed_tokens.weight))
    hidden = g.node("Gather", ["embed", "input_ids"])[0]
    # The rotary tables as the model computes them (scaling included), halves of head_dim.
    import torch

    with torch.no_grad():
        where = torch.arange(cache.max_positions, dtype=torch.long)[None, :]
        probe = torch.zeros((1, cache.max_positions, cache.head_dim), dtype=torch.float32)
        cos, sin = inner.rotary_emb(probe, where)
    half = cache.head_dim // 2
    g.weight("cos_cache", _np(cos[0, :, :half]))
    g.weight("sin_cache", _np(sin[0, :, :half]))
    layers = inner.layers
    g.weight("norm0.w", _np(layers[0].input_layernorm.weight))
    normed = g.node("SimplifiedLayerNormalization", [hidden, "norm0.w"], epsilon=eps, axis=-1)[0]
    for i, layer in enumerate(layers):
        p = f"l{i}."
        a = layer.self_attn
        qkv_w = np.concatenate(
            [_np(a.q_proj.weight).T, _np(a.k_proj.weight).T, _np(a.v_proj.weight).T], axis=1
        )
        g.weight(p + "qkv.w", qkv_w)
        qkv = g.node("MatMul", [normed, p + "qkv.w"])[0]
        if a.q_proj.bias is not None:
            bias = np.concatenate([_np(a.q_proj.bias), _np(a.k_proj.bias), _np(a.v_proj.bias)])
            g.weight(p + "qkv.b", bias)
            qkv = g.node("Add", [qkv, p + "qkv.b"])[0]
        attn = _attention(g, qkv, i, cache, int(c.num_attention_heads), rotary=True)
        g.weight(p + "o.w", np.ascontiguousarray(_np(a.o_proj.weight).T))
        projected = g.node("MatMul", [attn, p + "o.w"])[0]
        skip_inputs = [projected, hidden, p + "post.w"]
        g.weight(p + "post.w", _np(layer.post_attention_layernorm.weight))
        if a.o_proj.bias is not None:
            g.weight(p + "o.b", _np(a.o_proj.bias))
            skip_inputs += ["", p + "o.b"]
        normed2, _, _, hidden = g.node(
            "SkipSimplifiedLayerNormalization", skip_inputs, 4, domain=MS, epsilon=eps
        )
        m = layer.mlp
        g.weight(p + "gate.w", np.ascontiguousarray(_np(m.gate_proj.weight).T))
        g.weight(p + "up.w", np.ascontiguousarray(_np(m.up_proj.weight).T))
        g.weight(p + "down.w", np.ascontiguousarray(_np(m.down_proj.weight).T))
        gate = g.node("MatMul", [normed2, p + "gate.w"])[0]
        up = g.node("MatMul", [normed2, p + "up.w"])[0]
        act = g.node("QuickGelu", [gate], domain=MS, alpha=1.0)[0]
        down = g.node("MatMul", [g.node("Mul", [act, up])[0], p + "down.w"])[0]
        last = i == len(layers) - 1
        n = f"l{i + 1}.input_norm.w" if not last else "norm.w"
        norm = layers[i + 1].input_layernorm if not last else inner.norm
        g.weight(n, _np(norm.weight))
        normed, _, _, hidden = g.node(
            "SkipSimplifiedLayerNormalization", [down, hidden, n], 4, domain=MS, epsilon=eps
        )
    g.weight("lm_head.w", np.ascontiguousarray(_np(model.lm_head.weight).T))
    return g.node("MatMul", [normed, "lm_head.w"], ["logits"])[0]


def _model(
    g: _Graph, cache: CacheShape, logits: str, *, vocab: int, positions: bool
) -> onnx.ModelProto:
    kv = [cache.kv_heads, cache.head_dim]
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "time"])]
    if positions:
        inputs.append(
            helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch", "time"])
        )
    inputs += [
        helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["batch"]),
        helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, []),
    ]
    inputs += [
        helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", kv[0], "capacity", kv[1]])
        for name in past_names(cache.layers)
    ]
    outputs = [
        helper.make_tensor_value_info(logits, TensorProto.FLOAT, ["batch", "time", vocab])
    ] + [
        helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", kv[0], "capacity", kv[1]])
        for name in present_names(cache.layers)
    ]
    # Every intermediate tensor is float32: declared, so tools that infer types from the ONNX
    # domain only (dynamic quantization) know the contrib ops' outputs too.
    declared = {v.name for v in outputs}
    typed = [
        helper.make_tensor_value_info(name, TensorProto.FLOAT, None)
        for node in g.nodes
        for name in node.output
        if name and name not in declared
    ]
    graph = helper.make_graph(
        g.nodes, "decoder", inputs, outputs, initializer=g.weights, value_info=typed
    )
    return helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(MS, 1)],
        producer_name="lmserve",
    )
