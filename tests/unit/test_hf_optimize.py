"""ONNX Runtime's transformer optimizer at import: the fused operators counted in the written
graph (and recorded in the manifest), parity against transformers' forward after the fusions,
the graph's inputs and outputs unchanged, `--no-optimize`, `--quantize int8` after the
fusions, and `lmserve optimize` on the folders optimum wrote (tests/data/optimum)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import onnx
import onnxruntime as ort
import pytest
from hf_models import checkpoint, load

from lmserve.export.hf.checkpoint import read_checkpoint
from lmserve.export.hf.importer import export_checkpoint, sample_ids
from lmserve.export.hf.parity import check_parity
from lmserve.export.parity import PARITY_NATS
from lmserve.server.backends.transformer import CacheShape, past_names, present_names
from lmserve.server.cli import main
from lmserve.server.manifest import read_manifest

OPTIMUM = Path(__file__).resolve().parents[1] / "data" / "optimum"
# What ONNX Runtime 1.32's optimizer fuses in each tiny decoder: GPT-2's residual + LayerNorm
# (the last one has no residual) and tanh GELU; Llama's RMSNorm likewise.
FUSED = {
    "gpt2": {"SkipLayerNormalization": 4, "LayerNormalization": 1, "FastGelu": 2},
    "llama": {"SkipSimplifiedLayerNormalization": 4, "SimplifiedLayerNormalization": 1},
}


def _ops(graph: Path) -> Counter[str]:
    return Counter(node.op_type for node in onnx.load_model(str(graph)).graph.node)


def _io(graph: Path) -> tuple[list[str], list[str]]:
    model = onnx.load_model(str(graph))
    return [i.name for i in model.graph.input], [o.name for o in model.graph.output]


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each tiny checkpoint, and its folders in optimum's layout (import-hf --optimum-layout;
    GPT-2 and Llama otherwise get the shared-buffer graph) with and without fusions."""
    root = tmp_path_factory.mktemp("optimized")
    out: dict[str, Path] = {}
    for build in FUSED:
        out[f"ck-{build}"] = checkpoint(root / f"ck-{build}", build)
        out[build] = root / build
        export_checkpoint(out[f"ck-{build}"], out[build], shared_cache=False)
        out[f"plain-{build}"] = root / f"plain-{build}"
        export_checkpoint(
            out[f"ck-{build}"], out[f"plain-{build}"], optimize=False, shared_cache=False
        )
    return out


@pytest.mark.parametrize("build", sorted(FUSED))
def test_import_writes_the_fused_graph_and_records_its_fusions(
    imported: dict[str, Path], build: str
) -> None:
    folder = imported[build]
    ops = _ops(folder / "model.onnx")
    assert {op: ops[op] for op in FUSED[build]} == FUSED[build]
    assert ops["ReduceMean"] == 0  # no layer norm left unfused
    manifest = read_manifest(folder)
    assert manifest.optimization is not None
    assert manifest.optimization.fused_ops == FUSED[build]
    assert manifest.optimization.model_type == "gpt2"
    assert manifest.optimization.onnxruntime_version == ort.__version__
    parity = manifest.provenance.parity
    assert parity and all(0 <= v <= PARITY_NATS for v in parity.values())


@pytest.mark.parametrize("build", sorted(FUSED))
def test_the_fused_graph_keeps_the_backends_inputs_and_outputs(
    imported: dict[str, Path], build: str
) -> None:
    layers = 2
    want = (
        ["input_ids", "attention_mask", "position_ids", *past_names(layers)],
        ["logits", *present_names(layers)],
    )
    assert _io(imported[build] / "model.onnx") == want
    assert _io(imported[f"plain-{build}"] / "model.onnx") == want


@pytest.mark.parametrize("build", sorted(FUSED))
def test_the_fused_graph_equals_transformers_read_every_way(
    imported: dict[str, Path], build: str
) -> None:
    """Measured here again, independently of the import's own check: one pass, two chunks
    through the cache, left-padded with a cached last step."""
    ck = imported[f"ck-{build}"]
    cache = CacheShape.from_config(json.loads((ck / "config.json").read_text()), "config.json")
    session = ort.InferenceSession(
        str(imported[build] / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    parity = check_parity(load(ck), session, cache, sample_ids(read_checkpoint(ck)))
    assert parity.worst <= PARITY_NATS, parity


def test_no_optimize_writes_the_graph_as_exported(imported: dict[str, Path]) -> None:
    for build in FUSED:
        folder = imported[f"plain-{build}"]
        assert read_manifest(folder).optimization is None
        ops = _ops(folder / "model.onnx")
        contrib = {op for fused in FUSED.values() for op in fused} - {"LayerNormalization"}
        assert not set(ops) & contrib  # (torch exports GPT-2's LayerNorm as ONNX's own op)


def test_int8_quantizes_the_fused_graph(
    imported: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "llama-int8"
    args = [str(imported["ck-llama"]), str(out), "--optimum-layout", "--quantize", "int8"]
    assert main(["import-hf", *args]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["optimization"]["fused_ops"] == FUSED["llama"]
    manifest = read_manifest(out)
    assert manifest.optimization is not None and manifest.quantization is not None
    assert manifest.quantization.max_token_error <= manifest.quantization.max_token_error_bound
    ops = _ops(out / "model.onnx")
    assert ops["SkipSimplifiedLayerNormalization"] == 4  # fused, then quantized
    assert ops["DynamicQuantizeMatMul"] + ops["MatMulInteger"] == manifest.quantization.nodes - 1
    assert ops["MatMul"] == 0 or ops["MatMul"] < _ops(imported["llama"] / "model.onnx")["MatMul"]


@pytest.mark.parametrize(
    ("build", "fused"),
    [
        ("gpt2", FUSED["gpt2"]),
        # optimum's older trace of Llama's rotary embedding is one ONNX Runtime recognises
        ("llama", FUSED["llama"] | {"RotaryEmbedding": 4}),
    ],
)
def test_optimize_fuses_an_optimum_folder_and_equals_transformers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], build: str, fused: dict[str, int]
) -> None:
    out = tmp_path / f"optimum-{build}-fused"
    assert main(["optimize", str(OPTIMUM / build), str(out)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["optimization"]["fused_ops"] == fused
    assert {op: _ops(out / "model.onnx")[op] for op in fused} == fused
    manifest = read_manifest(out)
    assert manifest.name == out.name and manifest.optimization is not None
    assert all(v <= PARITY_NATS for v in manifest.provenance.parity.values())
    # Against transformers, not only against the source graph the command compared with.
    ck = OPTIMUM / f"{build}-checkpoint"
    cache = CacheShape.from_config(json.loads((ck / "config.json").read_text()), "config.json")
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    parity = check_parity(load(ck), session, cache, sample_ids(read_checkpoint(ck)))
    assert parity.worst <= PARITY_NATS, parity


def test_optimize_refuses_in_one_line(
    imported: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = {
        str(imported["gpt2"]): "optimized already",
        str(tmp_path): "neither a model folder nor an optimum export",
    }
    for source, message in cases.items():
        assert main(["optimize", source, str(tmp_path / "out")]) == 1
        err = capsys.readouterr().err.strip()
        assert message in err and "\n" not in err, err
