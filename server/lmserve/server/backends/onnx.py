"""Recurrent (and feed-forward) models exported to ONNX, run by ONNX Runtime (CPU or CUDA).

    backend = OnnxBackend.load(folder, manifest, OnnxOptions(intra_op_threads=2))
    backend.score(batch, per_token=True)      # natural logs

The folder holds `score.onnx` (gathered log-prob per position: what scoring needs) and
`step.onnx` (full distributions: generation), both sharing `weights.bin`. Each graph gets one
`InferenceSession` for the model's lifetime. Both graphs are checked at load: every expected
input and output present, and the vocabulary dimension equal to `vocab.txt`'s size.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from lmserve.server.backends.recurrent import (
    RecurrentBackend,
    RecurrentSpec,
    RecurrentState,
    TokenArray,
    read_vocab,
)
from lmserve.server.errors import ModelLoadError
from lmserve.server.manifest import ModelManifest


@dataclass(frozen=True)
class OnnxOptions:
    """Session settings (from `Settings.onnx_*`): threads, spinning, chunk length, GPU use."""

    intra_op_threads: int = 2
    inter_op_threads: int = 1
    allow_spinning: bool = False
    max_chunk_tokens: int = 256
    use_gpu: bool = True
    # Generation's states stay on the session's device (`DeviceState`): "auto" on CUDA only.
    device_states: str = "auto"


def providers(use_gpu: bool = True) -> list[str]:
    """CUDA first when onnxruntime-gpu sees a GPU, then the CPU provider (always last)."""
    import onnxruntime as ort  # type: ignore[import-untyped]

    available = ort.get_available_providers()
    chosen = ["CUDAExecutionProvider"] if use_gpu and "CUDAExecutionProvider" in available else []
    return [*chosen, "CPUExecutionProvider"]


# ONNX Runtime's element types of the state tensors, as numpy's.
_ORT_DTYPES: dict[str, np.dtype[Any]] = {
    "tensor(float)": np.dtype(np.float32),
    "tensor(float16)": np.dtype(np.float16),
    "tensor(int64)": np.dtype(np.int64),
}


def state_binding(session: Any, device_states: str) -> tuple[bool, str]:
    """Whether a session's steps keep their states on its device between calls (I/O binding),
    and which device that is: `device_states` "auto" binds on the CUDA provider only, "on"
    on the CPU too (the same path, testable without a GPU), "off" never."""
    if device_states not in ("auto", "on", "off"):
        raise ValueError(f"device_states must be auto, on or off, not {device_states!r}")
    on_cuda = session.get_providers()[0] == "CUDAExecutionProvider"
    binds = device_states == "on" or (device_states == "auto" and on_cuda)
    return binds, "cuda" if on_cuda else "cpu"


class DeviceState:
    """One state array left where ONNX Runtime computed it (an `OrtValue`: in GPU memory on the
    CUDA provider). The next step binds it as it is, so a generation step's states never travel
    to the host and back. Anything else reads it as numpy, copied to the host once (`__array__`,
    indexing, `shape`), which is how the steppers' split/merge/select of rows see it."""

    __slots__ = ("value", "_host")

    def __init__(self, value: Any) -> None:
        self.value = value
        self._host: npt.NDArray[Any] | None = None

    def host(self) -> npt.NDArray[Any]:
        if self._host is None:
            self._host = self.value.numpy()
        return self._host

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> npt.NDArray[Any]:
        host = self.host()
        return host if dtype is None else host.astype(dtype)

    def __getitem__(self, key: Any) -> Any:
        return self.host()[key]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.value.shape())

    @property
    def dtype(self) -> np.dtype[Any]:
        return _ORT_DTYPES[self.value.data_type()]

    @property
    def nbytes(self) -> int:
        """The bytes it holds on its device (what a cache's size is reckoned in)."""
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


class OnnxBackend(RecurrentBackend):
    """A recurrent LM served by ONNX Runtime; no state of its own between calls."""

    def __init__(
        self,
        spec: RecurrentSpec,
        vocab: Any,
        step: Any,
        score: Any,
        max_chunk_tokens: int,
        device_states: str = "off",
    ) -> None:
        super().__init__(spec, vocab, max_chunk_tokens=max_chunk_tokens)
        self._step = step
        self._score = score
        self._state_outputs = [f"{name}_out" for name in spec.state_names]
        self._step_outputs = ["log_probs", *self._state_outputs]
        self._score_outputs = ["token_log_probs", *self._state_outputs]
        self.binds_states, self._state_device = state_binding(step, device_states)

    @classmethod
    def load(cls, folder: Path, manifest: ModelManifest, options: OnnxOptions) -> OnnxBackend:
        spec = RecurrentSpec.from_architecture(manifest.architecture, str(folder / "model.yaml"))
        vocab = read_vocab(manifest.file_path(folder, "vocab"), spec, manifest.special_tokens)
        state_inputs = list(spec.state_names)
        # Each state output's last axis, checked where it is not the batch (a [1, batch] state).
        state_outputs = {
            f"{s.name}_out": s.shape[-1] if s.shape[-1] > 0 else None for s in spec.layouts
        }
        score = open_session(
            manifest.file_path(folder, "score"),
            options,
            ["tokens", "targets", *state_inputs],
            {"token_log_probs": None, **state_outputs},
        )
        step = open_session(
            manifest.file_path(folder, "step"),
            options,
            ["tokens", *state_inputs],
            {"log_probs": spec.vocab_size, **state_outputs},
        )
        return cls(spec, vocab, step, score, options.max_chunk_tokens, options.device_states)

    @property
    def providers(self) -> list[str]:
        return list(self._score.get_providers())

    def _feeds(self, state: RecurrentState) -> dict[str, npt.NDArray[Any]]:
        return {name: np.asarray(s) for name, s in zip(self.spec.state_names, state, strict=True)}

    def _run_step(
        self, tokens: TokenArray, state: RecurrentState
    ) -> tuple[npt.NDArray[np.float32], RecurrentState]:
        if self.binds_states:
            return self._run_step_bound(tokens, state)
        out = self._step.run(self._step_outputs, {"tokens": tokens, **self._feeds(state)})
        return out[0], tuple(out[1:])

    def _run_step_bound(
        self, tokens: TokenArray, state: RecurrentState
    ) -> tuple[npt.NDArray[np.float32], RecurrentState]:
        """The step with I/O binding: states that are `DeviceState`s go in as they are, numpy
        ones are copied in; the log-probs come to the host (sampling reads them there), the new
        states stay on the device."""
        return run_bound(
            self._step,
            {"tokens": tokens},
            dict(zip(self.spec.state_names, state, strict=True)),
            "log_probs",
            self._state_outputs,
            self._state_device,
        )

    def _run_score(
        self, tokens: TokenArray, targets: TokenArray, state: RecurrentState
    ) -> tuple[npt.NDArray[np.float32], RecurrentState]:
        feeds = {"tokens": tokens, "targets": targets, **self._feeds(state)}
        out = self._score.run(self._score_outputs, feeds)
        return out[0], tuple(out[1:])


def run_bound(
    session: Any,
    host_inputs: dict[str, npt.NDArray[Any]],
    states: dict[str, npt.NDArray[Any]],
    host_output: str,
    state_outputs: list[str],
    device: str,
) -> tuple[npt.NDArray[Any], tuple[npt.NDArray[Any], ...]]:
    """One call with I/O binding, the way a step keeps its states on the session's device:
    states that are `DeviceState`s (the last call's outputs) are bound where they lie, numpy
    ones are copied in; `host_output` comes to the host, the `state_outputs` stay on `device`
    and come back as `DeviceState`s (duck-typed arrays: numpy readers see them as numpy)."""
    binding = session.io_binding()
    for name, array in host_inputs.items():
        binding.bind_cpu_input(name, np.ascontiguousarray(array))
    for name, state in states.items():
        if isinstance(state, DeviceState):
            binding.bind_ortvalue_input(name, state.value)
        else:
            binding.bind_cpu_input(name, np.ascontiguousarray(state))
    binding.bind_output(host_output, "cpu")
    for name in state_outputs:
        binding.bind_output(name, device)
    session.run_with_iobinding(binding)
    first, *rest = binding.get_outputs()
    return first.numpy(), tuple(cast(npt.NDArray[Any], DeviceState(v)) for v in rest)


def open_session(
    path: Path, options: OnnxOptions, inputs: list[str], outputs: dict[str, int | None]
) -> Any:
    """One session for one graph, refused with the file's name when it does not fit."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = options.intra_op_threads
    so.inter_op_num_threads = options.inter_op_threads
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.add_session_config_entry(
        "session.intra_op.allow_spinning", "1" if options.allow_spinning else "0"
    )
    try:
        session = ort.InferenceSession(
            str(path), sess_options=so, providers=providers(options.use_gpu)
        )
    except Exception as exc:  # ORT raises its own Fail/InvalidGraph/... types
        raise ModelLoadError(str(path), "ONNX Runtime cannot load it", f"{exc}") from exc
    have_inputs = [i.name for i in session.get_inputs()]
    missing = [name for name in inputs if name not in have_inputs]
    if missing:
        raise ModelLoadError(
            str(path), f"graph has no input {missing[0]!r} (inputs: {', '.join(have_inputs)})"
        )
    have_outputs = {o.name: o.shape for o in session.get_outputs()}
    for name, last_dim in outputs.items():
        if name not in have_outputs:
            raise ModelLoadError(
                str(path), f"graph has no output {name!r} (outputs: {', '.join(have_outputs)})"
            )
        shape = have_outputs[name]
        if last_dim is not None and shape and isinstance(shape[-1], int):
            if shape[-1] != last_dim:
                raise ModelLoadError(
                    str(path), f"output {name!r} has size {shape[-1]}, the manifest says {last_dim}"
                )
    return session
