"""`--quantize int8` on every ONNX export (`export-rnn`, `import-hf`, `import-onnx`,
`export_module`): the folder holds int8 weights, serves through the same backends, records its
measured cost, and GetModel reports it; TorchScript is refused in one line.

Each model is exported twice, float and int8, into one repository served by one server; the
recorded `max_token_error` is recomputed here from the two folders' Score per-token log-probs
on the same held-out text. Models are tiny (each export well under a few seconds)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from brought_models import LSTM_CONTRACT, export_gru_onnx, gru_lm, save_gru_script, tiny_lstm
from brought_models import VOCAB as BROUGHT_VOCAB
from hf_models import CORPUS, checkpoint
from neural_folders import VOCAB as RNN_VOCAB
from neural_folders import tiny_model
from quantized import served_client, token_log_probs
from served import ServerFactory

from lmserve.client import LmServeClient
from lmserve.export.custom.contract import ContractError
from lmserve.export.custom.folder import export_module
from lmserve.export.quantize import Quantize
from lmserve.export.trainers.loop import save_checkpoint
from lmserve.server.cli import main
from lmserve.server.manifest import read_manifest

# Held-out texts the word models know most of (an unknown word is scored as <unk> all the same).
WORD_TEXTS = [
    "the cat sat on the mat",
    "a big red dog ran to the house",
    "the small cat ran in the big house and sat",
]
# (int8 folder, float folder, held-out texts)
PAIRS = {
    "rnn-lstm": ("rnn-lstm", WORD_TEXTS),
    "hf-gpt2": ("hf-gpt2", CORPUS),
    "onnx-gru": ("onnx-gru", WORD_TEXTS),
    "module-lstm": ("module-lstm", WORD_TEXTS),
}


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("int8")
    repo = root / "models"
    words = root / "words.txt"
    words.write_text("\n".join(WORD_TEXTS) + "\n", encoding="utf-8")
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(CORPUS) + "\n", encoding="utf-8")
    int8 = ["--quantize", "int8"]

    # export-rnn: a train-rnn checkpoint of a 2-layer LSTM.
    ckpt = root / "lstm.pt"
    data = {"vocab": RNN_VOCAB, "tokenizer": {"kind": "word"}, "valid_ppl": 9.0, "epoch": 1}
    save_checkpoint(ckpt, tiny_model("lstm"), data)
    for name, extra in (("rnn-lstm", []), ("rnn-lstm-int8", [*int8, "--held-out", str(words)])):
        assert main(["export-rnn", str(ckpt), str(repo / name), *extra]) == 0

    # import-hf: a tiny GPT-2 (its projections are Gemm nodes, rewritten as MatMul).
    hf = checkpoint(root / "gpt2", "gpt2")
    for name, extra in (("hf-gpt2", []), ("hf-gpt2-int8", [*int8, "--held-out", str(corpus)])):
        assert main(["import-hf", str(hf), str(repo / name), *extra]) == 0

    # import-onnx: a team's GRU graph (ONNX Runtime has no int8 GRU: its MatMul only).
    export_gru_onnx(gru_lm(), root / "gru.onnx")
    vocab = root / "vocab.txt"
    vocab.write_text("\n".join(BROUGHT_VOCAB) + "\n", encoding="utf-8")
    common = ["--vocab", str(vocab), "--kind", "gru", "--state", "hidden_in:hidden_out:1:h"]
    for name, extra in (("onnx-gru", []), ("onnx-gru-int8", [*int8, "--held-out", str(words)])):
        assert main(["import-onnx", str(root / "gru.onnx"), str(repo / name), *common, *extra]) == 0

    # export_module: a team's torch LSTM, from Python.
    lstm = tiny_lstm()
    for name, quantize in (
        ("module-lstm", None),
        ("module-lstm-int8", Quantize(held_out=WORD_TEXTS, held_out_name="words")),
    ):
        export_module(
            lstm,
            repo / name,
            vocab=BROUGHT_VOCAB,
            contract=LSTM_CONTRACT,
            kind="lstm",
            quantize=quantize,
        )
    return repo


@pytest.fixture(scope="module")
def client(serve: ServerFactory, repository: Path) -> Iterator[LmServeClient]:
    yield from served_client(serve, repository)


@pytest.mark.parametrize("model", sorted(PAIRS))
def test_the_recorded_error_is_the_served_difference(
    client: LmServeClient, repository: Path, model: str
) -> None:
    float_name, texts = PAIRS[model]
    recorded = read_manifest(repository / f"{model}-int8").quantization
    assert recorded is not None
    floats = token_log_probs(client, float_name, list(texts))
    int8s = token_log_probs(client, f"{model}-int8", list(texts))
    measured = float(np.max(np.abs(int8s - floats)))
    assert 0 < measured <= recorded.max_token_error_bound
    assert measured == pytest.approx(recorded.max_token_error, rel=1e-3, abs=2e-6)
    assert recorded.held_out_tokens == floats.size
    perplexity = float(np.exp(-int8s.mean()))
    assert perplexity == pytest.approx(recorded.perplexity, rel=1e-5)
    float_perplexity = float(np.exp(-floats.mean()))
    assert recorded.perplexity_change == pytest.approx(perplexity / float_perplexity - 1, abs=1e-5)


@pytest.mark.parametrize(
    ("model", "ops"),
    [
        ("rnn-lstm", ["Gather", "LSTM", "MatMul"]),
        ("hf-gpt2", ["Gather", "MatMul"]),
        ("onnx-gru", ["Gather", "MatMul"]),
        ("module-lstm", ["Gather", "LSTM", "MatMul"]),
    ],
)
def test_the_graphs_hold_int8_weights_and_float_inputs(
    repository: Path, model: str, ops: list[str]
) -> None:
    folder = repository / f"{model}-int8"
    manifest = read_manifest(folder)
    assert manifest.quantization is not None
    assert manifest.quantization.ops == ops
    assert manifest.quantization.nodes > 0
    for entry in manifest.files.values():
        if not entry.path.endswith(".onnx"):
            continue
        graph = onnx.load_model(str(folder / entry.path))  # external weights included
        int8 = [t for t in graph.graph.initializer if t.data_type == onnx.TensorProto.INT8]
        assert int8, f"{entry.path} has no int8 initializer"
        # Inputs and outputs keep their float32 (a transformer's cache) and integer types
        # (int32: the shared-buffer graph's row lengths, GroupQueryAttention's seqlens_k).
        kinds = {v.type.tensor_type.elem_type for v in [*graph.graph.input, *graph.graph.output]}
        assert kinds <= {onnx.TensorProto.FLOAT, onnx.TensorProto.INT64, onnx.TensorProto.INT32}
    if model == "hf-gpt2":
        graph = onnx.load_model(str(folder / "model.onnx"))
        cache = [v for v in graph.graph.input if v.name.startswith("past_key_values")]
        assert cache and all(v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT for v in cache)


@pytest.mark.parametrize("model", sorted(PAIRS))
def test_get_model_reports_the_quantization(client: LmServeClient, model: str) -> None:
    info = client.get_model(f"{model}-int8")
    assert info.ready
    q = info.quantization
    assert q is not None
    assert (q.method, q.weights) == ("dynamic-int8", "int8")
    assert 0 < q.max_token_error <= q.max_token_error_bound == 0.1
    assert q.float_perplexity > 0 and q.perplexity > 0 and q.held_out_tokens > 0
    assert client.get_model(model).quantization is None


def test_the_int8_folders_generate(client: LmServeClient) -> None:
    for model in ("rnn-lstm-int8", "hf-gpt2-int8", "onnx-gru-int8", "module-lstm-int8"):
        events = list(client.generate(model, "the", max_new_tokens=4, seed=1))
        assert events


def _one_line_refusal(capsys: pytest.CaptureFixture[str], *words: str) -> None:
    """The refusal is one line (export-rnn logs its progress on stderr before it)."""
    lines = capsys.readouterr().err.strip().splitlines()
    refusals = [line for line in lines if line.startswith("lmserve ")]
    assert len(refusals) == 1 and refusals[0] == lines[-1], lines
    for word in words:
        assert word in refusals[0]


def test_torchscript_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    save_gru_script(gru_lm(), tmp_path / "gru.pt")
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(BROUGHT_VOCAB) + "\n", encoding="utf-8")
    args = ["--vocab", str(vocab), "--kind", "gru", "--state", "h:2,batch,16"]
    out = tmp_path / "m"
    assert main(["import-torchscript", str(tmp_path / "gru.pt"), str(out), *args,
                 "--quantize", "int8"]) == 1  # fmt: skip
    _one_line_refusal(capsys, "TorchScript", "ONNX")
    assert not out.exists()

    ckpt = tmp_path / "lstm.pt"
    data = {"vocab": RNN_VOCAB, "tokenizer": {"kind": "word"}}
    save_checkpoint(ckpt, tiny_model("lstm"), data)
    assert main(["export-rnn", str(ckpt), str(out), "--format", "torchscript",
                 "--quantize", "int8"]) == 2  # fmt: skip
    _one_line_refusal(capsys, "TorchScript")
    assert not out.exists()

    with pytest.raises(ContractError, match="TorchScript"):
        export_module(
            tiny_lstm(), out, vocab=BROUGHT_VOCAB, contract=LSTM_CONTRACT, kind="lstm",
            format="torchscript", quantize="int8",
        )  # fmt: skip
    assert not out.exists()


def test_an_error_over_the_bound_is_refused_and_nothing_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = tmp_path / "lstm.pt"
    data = {"vocab": RNN_VOCAB, "tokenizer": {"kind": "word"}}
    save_checkpoint(ckpt, tiny_model("lstm"), data)
    out = tmp_path / "m"
    assert main(["export-rnn", str(ckpt), str(out), "--quantize", "int8",
                 "--max-quantization-error", "1e-9"]) == 1  # fmt: skip
    _one_line_refusal(capsys, "--max-quantization-error", "nats")
    assert not out.exists()
    assert not list(tmp_path.glob(".m.partial-*"))


def test_the_quantize_command_gives_a_written_folder_the_exports_int8(
    repository: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    words = tmp_path / "words.txt"
    words.write_text("\n".join(WORD_TEXTS) + "\n", encoding="utf-8")
    out = tmp_path / "copy-int8"
    assert main(["quantize", str(repository / "rnn-lstm"), str(out), "--held-out", str(words)]) == 0
    got, exported = (read_manifest(f).quantization for f in (out, repository / "rnn-lstm-int8"))
    assert got is not None and exported is not None
    assert got.model_dump() == exported.model_dump()  # the same graphs, quantized the same way
    assert read_manifest(out).name == "copy-int8"
    capsys.readouterr()
    assert main(["quantize", str(out), str(tmp_path / "again")]) == 1
    _one_line_refusal(capsys, "quantized already")
