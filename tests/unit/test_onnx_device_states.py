"""Generation states left on ONNX Runtime's device between steps (I/O binding, `DeviceState`).

On the CPU provider (`device_states="on"`) the bound path must give exactly the unbound one's
log-probs, keep the states where they are while the rows stay the same (no copy to the host),
and still split, merge and select rows as numpy. The same parity runs on the CUDA provider
wherever onnxruntime-gpu sees a GPU.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from lmserve.server.backends.onnx import DeviceState, OnnxBackend, OnnxOptions
from lmserve.server.backends.stepping import RecurrentStepper
from lmserve.server.manifest import read_manifest

MODELS = Path(__file__).resolve().parents[2] / "models"


def _stepper(name: str, device_states: str, use_gpu: bool = False) -> RecurrentStepper:
    folder = MODELS / name
    options = OnnxOptions(intra_op_threads=1, use_gpu=use_gpu, device_states=device_states)
    return RecurrentStepper(OnnxBackend.load(folder, read_manifest(folder), options))


def _run(stepper: RecurrentStepper) -> tuple[list[np.ndarray], list[object]]:
    """Prefill, steps with the same rows, a reorder, more steps: every step's log-probs."""
    outs: list[np.ndarray] = []
    kinds: list[object] = []
    lp, state = stepper.prefill([[5, 6, 7], [8, 9, 10]])
    outs.append(lp)
    for t in range(4):
        lp, state = stepper.step(np.array([11 + t, 40 + t]), state)
        outs.append(lp)
        kinds.append(type(state[0]))
    state = stepper.select(state, [1, 0, 0])  # beams reordered and duplicated
    for t in range(3):
        lp, state = stepper.step(np.array([3, 4, 5 + t]), state)
        outs.append(lp)
    a, b, c = stepper.split(state)
    lp, state = stepper.step(np.array([7, 7]), stepper.merge([c, a]))
    outs.append(lp)
    return outs, kinds


@pytest.mark.parametrize("name", ["kjv-lstm", "kjv-gru", "kjv-ffnn"])
def test_bound_steps_equal_unbound_ones(name: str) -> None:
    plain, bound = _stepper(name, "off"), _stepper(name, "on")
    assert not plain.backend.binds_states and bound.backend.binds_states  # type: ignore[attr-defined]
    want, _ = _run(plain)
    got, kinds = _run(bound)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)
    assert kinds == [DeviceState] * 4  # the steps' states stayed where they were computed


def test_steady_steps_never_copy_states_to_the_host() -> None:
    stepper = _stepper("kjv-lstm", "on")
    _, state = stepper.prefill([[5, 6], [7, 8]])
    for t in range(3):
        _, new_state = stepper.step(np.array([9 + t, 9 + t]), state)
        assert all(s._host is None for s in state if isinstance(s, DeviceState))
        state = new_state
    host = np.asarray(state[0])  # read as numpy: one copy, then kept
    assert host.shape == state[0].shape and host.dtype == state[0].dtype == np.float32
    assert np.asarray(state[0]) is host


def test_auto_binds_on_cuda_only() -> None:
    stepper = _stepper("kjv-lstm", "auto")
    on_cuda = stepper.backend.providers[0] == "CUDAExecutionProvider"  # type: ignore[attr-defined]
    assert stepper.backend.binds_states == on_cuda  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="device_states"):
        _stepper("kjv-lstm", "sometimes")


def _cuda_available() -> bool:
    import onnxruntime as ort  # type: ignore[import-untyped]

    return "CUDAExecutionProvider" in ort.get_available_providers()


@pytest.mark.skipif(not _cuda_available(), reason="needs onnxruntime-gpu and a GPU")
def test_cuda_parity_with_the_cpu_provider() -> None:
    """Where a GPU is present: the CUDA provider with device states gives the CPU provider's
    log-probs to float32 tolerance, step for step."""
    cpu = _stepper("kjv-lstm", "off", use_gpu=False)
    gpu = _stepper("kjv-lstm", "auto", use_gpu=True)
    assert gpu.backend.providers[0] == "CUDAExecutionProvider"  # type: ignore[attr-defined]
    assert gpu.backend.binds_states  # type: ignore[attr-defined]
    want, _ = _run(cpu)
    got, kinds = _run(gpu)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-4)
    assert kinds == [DeviceState] * 4
