"""A team's own ONNX file -> the served step and score graphs, by wrapping it, not re-exporting.

The team's graph goes in whole (its names prefixed with `team/`), with a few nodes around it:

    tokens [B, T] int64 --(Cast, Transpose if time-major)--> the graph's token input
    each served state (batch on axis 1) --(Transpose / Squeeze)--> the graph's state input
    the graph's scores --(Reshape if flattened, Transpose if time-major, LogSoftmax for logits)
        --> log_probs [B, T, V]                                   (step.onnx)
        --> GatherElements(targets) --> token_log_probs [B, T]    (score.onnx)
    each state output --(Transpose / Unsqueeze)--> <name>_out

Scoring gathers inside the graph: one float a position crosses into Python instead of V (the
same choice as the project's own score.onnx). Before wrapping, `inspect_graph` checks the file
against the contract (names, ranks, fixed axes, element types, the opset ONNX Runtime supports)
and says which input or output is wrong.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from lmserve.export.custom.checks import Array
from lmserve.export.custom.contract import BATCH, ContractError, ModelContract, StateSpec

PREFIX = "team/"
MIN_OPSET = 11  # GatherElements
_NUMPY_TYPES: dict[int, type[np.integer[Any]]] = {
    TensorProto.INT64: np.int64,
    TensorProto.INT32: np.int32,
}
_FLOATS = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16)


@functools.cache
def runtime_max_opset() -> int:
    """The newest ai.onnx opset this ONNX Runtime loads (probed on a one-node graph)."""
    import onnxruntime as ort  # type: ignore[import-untyped,unused-ignore]

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    best = MIN_OPSET
    for opset in range(MIN_OPSET, onnx.defs.onnx_opset_version() + 8):
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        model.ir_version = 8
        try:
            ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        except Exception:  # ORT refuses an opset it does not implement
            break
        best = opset
    return best


def _dims(value: onnx.ValueInfoProto) -> list[int | str]:
    """An input's or output's shape: ints where fixed, names (or '?') where free."""
    shape = value.type.tensor_type.shape
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in shape.dim]


def _elem(value: onnx.ValueInfoProto) -> int:
    return int(value.type.tensor_type.elem_type)


def _type_name(elem: int) -> str:
    return str(TensorProto.DataType.Name(elem)).lower()


@dataclass(frozen=True)
class GraphView:
    """What the wrapper needs to know of the team's graph."""

    model: onnx.ModelProto
    opset: int
    tokens: str
    tokens_type: int
    scores: str
    scores_rank: int


def load_graph(path: Path) -> onnx.ModelProto:
    if not path.is_file():
        raise ContractError("file", f"{path}: no such ONNX file")
    try:
        return onnx.load_model(str(path))  # external data from beside it, if any
    except Exception as exc:  # protobuf's DecodeError, a missing external file...
        raise ContractError("file", f"{path}: not a readable ONNX model ({exc})") from exc


def contract_from_graph(
    model: onnx.ModelProto,
    states: list[tuple[str, str, int, str | None]],
    *,
    tokens_input: str | None = None,
    scores_output: str | None = None,
    scores: str = "logits",
    normalize: bool = False,
    time_major: bool = False,
) -> ModelContract:
    """A contract from the command line's state pairs (input, output, batch axis, name): the
    states' shapes and dtypes are read from the graph's own inputs."""
    inputs = {i.name: i for i in model.graph.input}
    specs = []
    for graph_in, graph_out, batch_axis, name in states:
        value = inputs.get(graph_in)
        if value is None:
            raise ContractError(
                "states", f"the graph has no input {graph_in!r} (inputs: {', '.join(inputs)})"
            )
        dims = _dims(value)
        if not 0 <= batch_axis < len(dims):
            raise ContractError(
                "states",
                f"state input {graph_in!r} has rank {len(dims)} (shape {dims}): batch axis "
                f"{batch_axis} is outside it",
            )
        shape: list[int | str] = []
        for axis, d in enumerate(dims):
            if axis == batch_axis:
                shape.append(BATCH)
            elif isinstance(d, int) and d > 0:
                shape.append(d)
            else:
                raise ContractError(
                    "states",
                    f"state input {graph_in!r} has a free axis {axis} ({d!r}, shape {dims}): "
                    "only the batch axis may be free; give its size in a contract file",
                )
        dtype = "int64" if _elem(value) in _NUMPY_TYPES else "float32"
        safe = name or "".join(ch if ch.isalnum() else "_" for ch in graph_in).strip("_") or "s"
        specs.append(
            StateSpec(
                name=safe if not safe[0].isdigit() else f"s_{safe}",
                shape=tuple(shape),  # type: ignore[arg-type]
                dtype=dtype,  # type: ignore[arg-type]
                input=graph_in,
                output=graph_out,
            )
        )
    return ModelContract(
        states=tuple(specs),
        scores=scores,  # type: ignore[arg-type]
        normalize=normalize,
        time_major=time_major,
        tokens_input=tokens_input,
        scores_output=scores_output,
    )


def inspect_graph(model: onnx.ModelProto, contract: ModelContract, vocab_size: int) -> GraphView:
    """Checks the graph against the contract; every refusal names the input or output."""
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    supported = runtime_max_opset()
    if opset > supported:
        raise ContractError(
            "opset",
            f"the graph uses opset {opset}; this ONNX Runtime runs up to opset {supported}: "
            f"re-export with opset_version={supported} (or an older one)",
        )
    if opset < MIN_OPSET:
        raise ContractError(
            "opset", f"the graph uses opset {opset}: re-export with opset_version {MIN_OPSET}+"
        )
    inputs = {i.name: i for i in model.graph.input}
    outputs = {o.name: o for o in model.graph.output}
    state_inputs = {s.graph_input for s in contract.states}
    state_outputs = {s.graph_output for s in contract.states}
    others = [n for n in inputs if n not in state_inputs]
    tokens = contract.tokens_input or (others[0] if others else None)
    if tokens is None or tokens not in inputs:
        raise ContractError(
            "tokens",
            f"the graph has no token input {tokens!r} (inputs: {', '.join(inputs)})"
            if tokens
            else f"every input of the graph is a state: which is the tokens? ({', '.join(inputs)})",
        )
    _check_tokens(inputs[tokens], contract.time_major)
    for spec in contract.states:
        if spec.graph_input not in inputs:
            raise ContractError(
                "states",
                f"state {spec.name!r}: the graph has no input {spec.graph_input!r} "
                f"(inputs: {', '.join(inputs)})",
            )
        if spec.graph_output not in outputs:
            raise ContractError(
                "states",
                f"state {spec.name!r}: the graph has no output {spec.graph_output!r} "
                f"(outputs: {', '.join(outputs)})",
            )
        _check_state_input(inputs[spec.graph_input], spec)
    extra = [n for n in others if n != tokens]
    if extra:
        raise ContractError(
            "states",
            f"graph input {extra[0]!r} is neither the tokens ({tokens!r}) nor a listed state: "
            f"list it as a state (its output too), or export the graph without it",
        )
    free_outputs = [n for n in outputs if n not in state_outputs]
    scores = contract.scores_output or (free_outputs[0] if free_outputs else None)
    if scores is None or scores not in outputs:
        raise ContractError(
            "scores",
            f"the graph has no scores output {scores!r} (outputs: {', '.join(outputs)})"
            if scores
            else f"every output is a state: which holds the scores? ({', '.join(outputs)})",
        )
    value = outputs[scores]
    dims = _dims(value)
    if len(dims) not in (2, 3):
        raise ContractError(
            "scores",
            f"output {scores!r} has shape {dims}: expected [batch, time, V] or [batch * time, V]",
        )
    if _elem(value) not in _FLOATS:
        raise ContractError("scores", f"output {scores!r} is {_type_name(_elem(value))}, not float")
    if isinstance(dims[-1], int) and dims[-1] > 0 and dims[-1] != vocab_size:
        raise ContractError(
            "vocabulary",
            f"output {scores!r} scores {dims[-1]} tokens a position (shape {dims}), the "
            f"vocabulary has {vocab_size}: give the vocabulary the model was trained with",
        )
    return GraphView(model, opset, tokens, _elem(inputs[tokens]), scores, len(dims))


def _check_tokens(value: onnx.ValueInfoProto, time_major: bool) -> None:
    dims = _dims(value)
    if _elem(value) not in _NUMPY_TYPES:
        raise ContractError(
            "tokens",
            f"token input {value.name!r} is {_type_name(_elem(value))}: expected int64 or "
            "int32 ids",
        )
    if len(dims) != 2:
        raise ContractError(
            "tokens",
            f"token input {value.name!r} has shape {dims}: expected "
            + ("[time, batch]" if time_major else "[batch, time]"),
        )
    axes = ("time", "batch") if time_major else ("batch", "time")
    for axis, d in zip(axes, dims, strict=True):
        if isinstance(d, int) and d > 0:
            raise ContractError(
                "fixed axis",
                f"token input {value.name!r} has a fixed {axis} axis of {d} (shape {dims}): "
                "re-export with that axis dynamic (torch.onnx.export dynamic_axes)",
            )


def _check_state_input(value: onnx.ValueInfoProto, spec: StateSpec) -> None:
    dims = _dims(value)
    if len(dims) != len(spec.shape):
        raise ContractError(
            "states",
            f"state input {value.name!r} has rank {len(dims)} (shape {dims}), the contract's "
            f"{spec.name!r} rank {len(spec.shape)} ({list(spec.shape)})",
        )
    for axis, (d, want) in enumerate(zip(dims, spec.shape, strict=True)):
        if want == BATCH and isinstance(d, int) and d > 0:
            raise ContractError(
                "fixed axis",
                f"state input {value.name!r} has a fixed batch axis {axis} of {d} (shape "
                f"{dims}): re-export with that axis dynamic (torch.onnx.export dynamic_axes)",
            )
        if want != BATCH and isinstance(d, int) and d > 0 and d != want:
            raise ContractError(
                "states",
                f"state input {value.name!r} has size {d} on axis {axis} (shape {dims}), the "
                f"contract says {list(spec.shape)}",
            )
    if spec.dtype == "int64" and _elem(value) not in _NUMPY_TYPES:
        raise ContractError("states", f"state input {value.name!r} is not an integer tensor")
    if spec.dtype == "float32" and _elem(value) != TensorProto.FLOAT:
        raise ContractError(
            "states",
            f"state input {value.name!r} is {_type_name(_elem(value))}: lmserve carries float32 "
            "(or int64) states; export the graph with float32 states",
        )


class _Nodes:
    """Builds the wrapper's nodes, squeeze/unsqueeze in the form of the graph's opset."""

    def __init__(self, opset: int) -> None:
        self.opset = opset
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._count = 0

    def name(self, hint: str) -> str:
        self._count += 1
        return f"served/{hint}_{self._count}"

    def add(self, op: str, inputs: list[str], hint: str, **attrs: Any) -> str:
        out = self.name(hint)
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def const(self, values: list[int], hint: str) -> str:
        name = self.name(hint)
        self.initializers.append(helper.make_tensor(name, TensorProto.INT64, [len(values)], values))
        return name

    def squeeze(self, x: str, axis: int) -> str:
        if self.opset >= 13:
            return self.add("Squeeze", [x, self.const([axis], "axes")], "squeeze")
        return self.add("Squeeze", [x], "squeeze", axes=[axis])

    def unsqueeze(self, x: str, axis: int) -> str:
        if self.opset >= 13:
            return self.add("Unsqueeze", [x, self.const([axis], "axes")], "unsqueeze")
        return self.add("Unsqueeze", [x], "unsqueeze", axes=[axis])

    def move_axis(self, x: str, rank: int, source: int, dest: int) -> str:
        if source == dest:
            return x
        perm = list(range(rank))
        perm.insert(dest, perm.pop(source))
        return self.add("Transpose", [x], "transpose", perm=perm)


def _served_value(name: str, elem: int, dims: list[int | str]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, dims)


def wrap_graph(view: GraphView, contract: ModelContract, kind: str) -> onnx.ModelProto:
    """The served `step` or `score` graph around the team's (see the module docstring)."""
    team = onnx.compose.add_prefix(view.model, PREFIX)
    b = _Nodes(view.opset)
    inputs = [_served_value("tokens", TensorProto.INT64, [BATCH, "time"])]
    if kind == "score":
        inputs.append(_served_value("targets", TensorProto.INT64, [BATCH, "time"]))
    # tokens -> the team's token input
    x = "tokens"
    if view.tokens_type != TensorProto.INT64:
        x = b.add("Cast", [x], "cast_tokens", to=view.tokens_type)
    if contract.time_major:
        x = b.add("Transpose", [x], "time_major", perm=[1, 0])
    b.nodes.append(helper.make_node("Identity", [x], [PREFIX + view.tokens], name="served/tokens"))
    team_tokens = x
    outputs = []
    state_outs = []
    for spec in contract.states:
        rank = len(spec.shape)
        elem = TensorProto.INT64 if spec.dtype == "int64" else TensorProto.FLOAT
        inputs.append(_served_value(spec.name, elem, spec.served_shape()))
        if rank == 1:
            into = b.squeeze(spec.name, 0)
        else:
            into = b.move_axis(spec.name, rank, 1, spec.batch_axis)
        b.nodes.append(
            helper.make_node("Identity", [into], [PREFIX + spec.graph_input], name=b.name("in"))
        )
        out = PREFIX + spec.graph_output
        served_out = (
            b.unsqueeze(out, 0) if rank == 1 else b.move_axis(out, rank, spec.batch_axis, 1)
        )
        b.nodes.append(helper.make_node("Identity", [served_out], [f"{spec.name}_out"]))
        state_outs.append(_served_value(f"{spec.name}_out", elem, spec.served_shape()))
    # scores -> log-probs [B, T, V]
    s = PREFIX + view.scores
    if view.scores_rank == 2:
        shape = b.add("Shape", [team_tokens], "token_shape")
        target = b.add("Concat", [shape, b.const([-1], "minus_one")], "scores_shape", axis=0)
        s = b.add("Reshape", [s, target], "unflatten")
    if contract.time_major:
        s = b.add("Transpose", [s], "batch_major", perm=[1, 0, 2])
    s = b.add("Cast", [s], "float", to=TensorProto.FLOAT)
    if contract.scores == "logits" or contract.normalize:
        s = b.add("LogSoftmax", [s], "log_softmax", axis=-1)
    if kind == "step":
        b.nodes.append(helper.make_node("Identity", [s], ["log_probs"], name="served/log_probs"))
        outputs.append(_served_value("log_probs", TensorProto.FLOAT, [BATCH, "time", "vocab"]))
    else:
        index = b.unsqueeze("targets", 2)
        picked = b.add("GatherElements", [s, index], "gather", axis=2)
        b.nodes.append(
            helper.make_node("Identity", [b.squeeze(picked, 2)], ["token_log_probs"], name="out")
        )
        outputs.append(_served_value("token_log_probs", TensorProto.FLOAT, [BATCH, "time"]))
    graph = helper.make_graph(
        [*b.nodes[:1], *b.nodes[1:], *team.graph.node],
        f"lmserve-{kind}",
        inputs,
        [*outputs, *state_outs],
        initializer=[*team.graph.initializer, *b.initializers],
        value_info=list(team.graph.value_info),
    )
    model = helper.make_model(
        graph, opset_imports=list(view.model.opset_import), producer_name="lmserve import-onnx"
    )
    model.ir_version = view.model.ir_version
    for fn in team.functions:
        model.functions.append(fn)
    # Topological order: the wrapper's nodes feed the team's and read its outputs.
    return _sorted(model)


def _sorted(model: onnx.ModelProto) -> onnx.ModelProto:
    """Nodes in an order where every input is produced before it is read (ONNX requires it)."""
    graph = model.graph
    known = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    pending = list(graph.node)
    ordered: list[onnx.NodeProto] = []
    while pending:
        ready = [n for n in pending if all(i in known for i in n.input)]
        if not ready:
            missing = {i for n in pending for i in n.input if i not in known}
            raise ContractError("graph", f"the graph reads values nothing produces: {missing}")
        for n in ready:
            ordered.append(n)
            known.update(n.output)
        ids = {id(n) for n in ready}
        pending = [n for n in pending if id(n) not in ids]
    del graph.node[:]
    graph.node.extend(ordered)
    return model


class OnnxTeamModel:
    """The team's graph as it is, in ONNX Runtime: the reference the folder is checked against."""

    def __init__(self, view: GraphView, contract: ModelContract) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        try:
            self.session = ort.InferenceSession(
                view.model.SerializeToString(), options, providers=["CPUExecutionProvider"]
            )
        except Exception as exc:  # ORT's own error types
            raise ContractError("file", f"ONNX Runtime cannot load the graph: {exc}") from exc
        self.view = view
        self.contract = contract
        self.outputs = [view.scores, *[s.graph_output for s in contract.states]]
        self.token_type = _NUMPY_TYPES[view.tokens_type]
        self.state_types: dict[str, type[np.generic]] = {
            i.name: _NUMPY_TYPES.get(_elem(i), np.float32) for i in view.model.graph.input
        }

    def __call__(self, tokens: Array, states: list[Array]) -> tuple[Array, list[Array]]:
        x = tokens.T if self.contract.time_major else tokens
        feeds = {self.view.tokens: np.ascontiguousarray(x, dtype=self.token_type)}
        for spec, state in zip(self.contract.states, states, strict=True):
            feeds[spec.graph_input] = state.astype(self.state_types[spec.graph_input])
        scores, *new = self.session.run(self.outputs, feeds)
        return scores, [
            n.astype(np.int64) if s.dtype == "int64" else n
            for s, n in zip(self.contract.states, new, strict=True)
        ]
