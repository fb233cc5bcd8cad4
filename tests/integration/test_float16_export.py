"""`--quantize float16` on `import-hf`: the transformer's graph and key/value cache in float16
(the GPU's precision), its cost measured and recorded like int8's, served through the same
backend on the CPU here (ONNX Runtime computes the float16 nodes it has no kernel for in
float32) and on the CUDA provider with the cache kept on the device where one is present.

A GPT-2 and a Llama (grouped-query attention) are imported twice, float and float16, into one
repository served by one server; the recorded `max_token_error` is recomputed from the two
folders' Score per-token log-probs on the same held-out text."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from hf_models import CORPUS, checkpoint
from quantized import served_client, token_log_probs
from served import ServerFactory

from lmserve.client import GeneratedToken, LmServeClient
from lmserve.server.cli import main
from lmserve.server.families.catalog import make_stepper
from lmserve.server.families.family import LoadContext
from lmserve.server.families.loading import load_model
from lmserve.server.manifest import read_manifest
from lmserve.server.text.vocab import EncodedBatch

ARCHITECTURES = ("gpt2", "llama")


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("float16")
    repo = root / "models"
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(CORPUS) + "\n", encoding="utf-8")
    for arch in ARCHITECTURES:
        source = checkpoint(root / arch, arch)
        assert main(["import-hf", str(source), str(repo / arch)]) == 0
        half = ["--quantize", "float16", "--held-out", str(corpus)]
        assert main(["import-hf", str(source), str(repo / f"{arch}-float16"), *half]) == 0
    return repo


@pytest.fixture(scope="module")
def client(serve: ServerFactory, repository: Path) -> Iterator[LmServeClient]:
    yield from served_client(serve, repository)


def _loaded(folder: Path) -> Any:
    parts = load_model(folder, read_manifest(folder), LoadContext())
    assert parts.backend is not None
    return parts.backend


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_the_recorded_error_is_the_served_difference(
    client: LmServeClient, repository: Path, arch: str
) -> None:
    recorded = read_manifest(repository / f"{arch}-float16").quantization
    assert recorded is not None
    assert (recorded.method, recorded.weights) == ("float16", "float16")
    floats = token_log_probs(client, arch, CORPUS)
    halves = token_log_probs(client, f"{arch}-float16", CORPUS)
    measured = float(np.max(np.abs(halves - floats)))
    assert 0 < measured <= recorded.max_token_error_bound  # float16 moves something, in bound
    assert measured == pytest.approx(recorded.max_token_error, rel=1e-3, abs=2e-6)
    assert recorded.held_out_tokens == floats.size
    assert float(np.exp(-halves.mean())) == pytest.approx(recorded.perplexity, rel=1e-5)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_the_graph_and_its_cache_are_float16(repository: Path, arch: str) -> None:
    folder = repository / f"{arch}-float16"
    graph = onnx.load(str(folder / read_manifest(folder).files["graph"].path))
    kinds = {i.name: i.type.tensor_type.elem_type for i in graph.graph.input}
    past = [name for name in kinds if name.startswith("past_key_values.")]
    assert past and all(kinds[name] == onnx.TensorProto.FLOAT16 for name in past)
    floats = [t.name for t in graph.graph.initializer if t.data_type == onnx.TensorProto.FLOAT]
    assert not floats  # every float weight converted
    half, full = _loaded(folder), _loaded(repository / arch)
    assert half.cache.dtype == np.float16
    assert 2 * half.cache.bytes_per_position() == full.cache.bytes_per_position()


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_get_model_reports_float16(client: LmServeClient, arch: str) -> None:
    q = client.get_model(f"{arch}-float16").quantization
    assert q is not None
    assert (q.method, q.weights) == ("float16", "float16")
    assert "MatMul" in q.ops and q.bytes < q.float_bytes


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_stepping_through_the_float16_cache_equals_one_pass(repository: Path, arch: str) -> None:
    """Log-probs read a token at a time through the float16 cache (prefill, then steps) equal
    one scoring pass over the same ids, up to float16's rounding of the cache."""
    backend = _loaded(repository / f"{arch}-float16")
    stepper = make_stepper(backend)
    ids = [5, 9, 17, 3, 40, 41, 7, 12]
    log_probs, state = stepper.prefill([ids[:2]])
    stepped = [float(log_probs[0, ids[2]])]
    for previous, token in zip(ids[2:-1], ids[3:], strict=True):
        log_probs, state = stepper.step(np.asarray([previous]), state)
        stepped.append(float(log_probs[0, token]))
    batch = EncodedBatch.of_ids([ids], backend.vocab.unk_id)
    scores = backend.score(batch, eos=False, per_token=True)
    assert scores.token_log_probs is not None
    one_pass = scores.token_log_probs[2:]
    assert np.abs(np.asarray(stepped) - one_pass).max() < 5e-3


@pytest.mark.parametrize("name", ["gpt2-float16", "llama-float16"])
def test_the_cache_bound_between_calls_gives_the_same_log_probs(
    repository: Path, name: str
) -> None:
    """The I/O-binding path the CUDA provider takes (the cache left where ONNX Runtime wrote
    it, bound as the next call's past), forced on the CPU: the same log-probs as plain runs,
    through prefill, steps, a reorder of rows and a Score pass."""
    from lmserve.server.backends.onnx import DeviceState, OnnxOptions

    folder = repository / name
    plain = _loaded(folder)
    bound_parts = load_model(
        folder, read_manifest(folder), LoadContext(onnx=OnnxOptions(device_states="on"))
    )
    bound = bound_parts.backend
    assert bound is not None and bound.binds_cache and not plain.binds_cache  # type: ignore[attr-defined]
    results = []
    for backend in (plain, bound):
        stepper = make_stepper(backend)
        first, state = stepper.prefill([[5, 6, 7], [9]])
        second, state = stepper.step(np.asarray([8, 10]), state)
        state = stepper.select(state, [1, 0, 0])
        third, state = stepper.step(np.asarray([11, 12, 13]), state)
        if backend is bound:
            assert all(isinstance(p, DeviceState) for p in state.past)
        batch = EncodedBatch.of_ids([[5, 6, 7, 8], [9, 10]], backend.vocab.unk_id)
        scores = backend.score(batch, per_token=True).token_log_probs
        results.append((first, second, third, scores))
    for ours, theirs in zip(*results, strict=True):
        assert np.allclose(ours, theirs, atol=1e-6)


def test_the_float16_folders_generate(client: LmServeClient) -> None:
    for arch in ARCHITECTURES:
        events = list(client.generate(f"{arch}-float16", "And God", max_new_tokens=4, seed=1))
        assert [e for e in events if isinstance(e, GeneratedToken)]


@pytest.mark.skipif(
    "CUDAExecutionProvider" not in __import__("onnxruntime").get_available_providers(),
    reason="needs onnxruntime-gpu and a CUDA device (bench/bench_gpu.py measures it there)",
)
def test_on_cuda_the_cache_stays_on_the_device_and_scores_agree(repository: Path) -> None:
    from lmserve.server.backends.onnx import DeviceState, OnnxOptions

    folder = repository / "gpt2-float16"
    parts = load_model(folder, read_manifest(folder), LoadContext())
    backend = parts.backend
    assert backend is not None and backend.binds_cache  # type: ignore[attr-defined]
    stepper = make_stepper(backend)
    _, state = stepper.prefill([[5, 6, 7]])
    assert all(isinstance(p, DeviceState) for p in state.past)
    on_device, _ = stepper.step(np.asarray([8]), state)
    cpu = load_model(folder, read_manifest(folder), LoadContext(onnx=OnnxOptions(use_gpu=False)))
    assert cpu.backend is not None
    cpu_stepper = make_stepper(cpu.backend)
    _, cpu_state = cpu_stepper.prefill([[5, 6, 7]])
    on_cpu, _ = cpu_stepper.step(np.asarray([8]), cpu_state)
    assert np.abs(on_device - on_cpu).max() < 2e-2
