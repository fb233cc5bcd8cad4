"""Every way a brought model can break its contract is refused, naming the part, and no folder
appears; the contract's accepted variations (batch axis 0 or 1, time-major, flattened
log-probs, states as one tuple, normalisation by flag) write folders equal to the model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from brought_models import (
    DIM,
    LAYERS,
    LSTM_CONTRACT,
    SEQ_FIRST_CONTRACT,
    VOCAB,
    eager_log_probs,
    export_gru_onnx,
    gru_lm,
    save_gru_script,
    seq_first_lm,
    tiny_lstm,
)
from torch import Tensor, nn

from lmserve.export.custom import (
    ContractError,
    ModelContract,
    StateSpec,
    export_module,
    import_onnx,
    import_torchscript,
)
from lmserve.export.custom.onnx_graphs import contract_from_graph, load_graph, runtime_max_opset
from lmserve.server.cli import main

GRU_STATE = (
    StateSpec(name="h", shape=(LAYERS, "batch", DIM), input="hidden_in", output="hidden_out"),
)
GRU_CONTRACT = ModelContract(states=GRU_STATE)


def _refused(part: str, call, *needles: str) -> ContractError:  # type: ignore[no-untyped-def]
    with pytest.raises(ContractError) as caught:
        call()
    assert caught.value.part == part, str(caught.value)
    for needle in needles:
        assert needle in str(caught.value), str(caught.value)
    return caught.value


@pytest.fixture(scope="module")
def gru_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gru") / "gru.onnx"
    export_gru_onnx(gru_lm(), path)
    return path


def _served_log_probs(folder: Path, ids: list[int], names: list[str]) -> np.ndarray:
    """The written step.onnx run from the initial (zero) state over <s> ids."""
    import onnxruntime as ort
    import yaml

    arch = yaml.safe_load((folder / "model.yaml").read_text())["architecture"]
    session = ort.InferenceSession(str(folder / "step.onnx"), providers=["CPUExecutionProvider"])
    feeds: dict[str, np.ndarray] = {"tokens": np.array([[1, *ids]], dtype=np.int64)}
    for state in arch["states"]:
        shape = [1 if d == "batch" else d for d in state["shape"]]
        feeds[state["name"]] = np.zeros(shape, dtype=state["dtype"])
    assert [s["name"] for s in arch["states"]] == names
    return session.run(["log_probs"], feeds)[0][0]


# -- what is accepted --------------------------------------------------------------------------


def test_seq_first_flattened_log_probs_with_tuple_states_equal_the_module(tmp_path: Path) -> None:
    model = seq_first_lm()
    result = export_module(model, tmp_path / "m", vocab=VOCAB, contract=SEQ_FIRST_CONTRACT)
    assert result.parity.positions > 0  # the parity check read the module (above 1e-4 it refuses)
    ids = [5, 6, 7, 3]
    got = _served_log_probs(tmp_path / "m", ids, ["h", "c"])
    np.testing.assert_allclose(got, eager_log_probs(model, [1, *ids]), atol=1e-4)


def test_onnx_states_with_the_batch_on_axis_0_are_served_on_axis_1(tmp_path: Path) -> None:
    path = tmp_path / "gru-bf.onnx"
    model = gru_lm()
    export_gru_onnx(model, path, batch_first_state=True)
    contract = contract_from_graph(load_graph(path), [("hidden_in", "hidden_out", 0, "h")])
    assert contract.states[0].shape == ("batch", LAYERS, DIM)
    result = import_onnx(path, tmp_path / "m", vocab=VOCAB, contract=contract, kind="gru")
    assert result.manifest.architecture["states"][0]["shape"] == [LAYERS, "batch", DIM]
    ids = [4, 9, 3]
    got = _served_log_probs(tmp_path / "m", ids, ["h"])
    np.testing.assert_allclose(got, eager_log_probs(model, [1, *ids]), atol=1e-4)


def test_unnormalised_log_probs_are_normalised_on_request(tmp_path: Path, gru_file: Path) -> None:
    declared = GRU_CONTRACT.model_copy(update={"scores": "log_probs"})
    _refused(
        "normalised",
        lambda: import_onnx(gru_file, tmp_path / "m", vocab=VOCAB, contract=declared),
        "log-sum-exp",
        "normalize",
    )
    assert not (tmp_path / "m").exists()
    fixed = declared.model_copy(update={"normalize": True})
    import_onnx(gru_file, tmp_path / "m", vocab=VOCAB, contract=fixed)
    got = _served_log_probs(tmp_path / "m", [5, 6], ["h"])
    np.testing.assert_allclose(np.exp(got).sum(axis=-1), 1.0, atol=1e-5)


# -- what is refused ---------------------------------------------------------------------------


def test_a_missing_state_is_named(tmp_path: Path, gru_file: Path) -> None:
    only_h = ModelContract(states=(LSTM_CONTRACT.states[0],))
    _refused(
        "call",
        lambda: export_module(tiny_lstm(), tmp_path / "m", vocab=VOCAB, contract=only_h),
        "'c'",
    )
    # An ONNX graph with a state input the contract does not list.
    other = ModelContract(states=(StateSpec(name="x", shape=(1, "batch"), input="hidden_out"),))
    _refused(
        "states",
        lambda: import_onnx(gru_file, tmp_path / "m", vocab=VOCAB, contract=other),
        "no input 'hidden_out'",
    )
    assert not (tmp_path / "m").exists()


class _ExtraState(nn.Module):
    """Takes one state, returns two."""

    def __init__(self) -> None:
        super().__init__()
        self.gru = gru_lm()

    def forward(self, ids: Tensor, h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        logits, h = self.gru(ids, h)
        return logits, h, h * 2


def test_an_extra_state_is_named(tmp_path: Path, gru_file: Path) -> None:
    contract = ModelContract(states=(StateSpec(name="h", shape=(LAYERS, "batch", DIM)),))
    _refused(
        "states",
        lambda: export_module(_ExtraState(), tmp_path / "m", vocab=VOCAB, contract=contract),
        "returns 2 state(s)",
        "an extra state",
    )
    extra = ModelContract(states=(*GRU_STATE, StateSpec(name="c", shape=(1, "batch"))))
    _refused(
        "states",
        lambda: import_onnx(gru_file, tmp_path / "m", vocab=VOCAB, contract=extra),
        "no input 'c'",
    )


def test_a_vocabulary_of_another_size_is_refused(tmp_path: Path, gru_file: Path) -> None:
    short = VOCAB[:-2]
    _refused(
        "vocabulary",
        lambda: export_module(tiny_lstm(), tmp_path / "m", vocab=short, contract=LSTM_CONTRACT),
        f"scores {len(VOCAB)} tokens a position, the vocabulary has {len(short)}",
    )
    _refused(
        "vocabulary",
        lambda: import_onnx(gru_file, tmp_path / "m", vocab=short, contract=GRU_CONTRACT),
        "'next_logits'",
        f"the vocabulary has {len(short)}",
    )
    _refused(
        "vocabulary",
        lambda: export_module(
            tiny_lstm(),
            tmp_path / "m",
            vocab=[*VOCAB[:2], "eos", *VOCAB[3:]],
            contract=LSTM_CONTRACT,
        ),
        "no '</s>'",
    )


def test_a_fixed_batch_or_time_axis_is_refused(tmp_path: Path) -> None:
    fixed = tmp_path / "fixed.onnx"
    export_gru_onnx(gru_lm(), fixed, dynamic_axes={})
    _refused(
        "fixed axis",
        lambda: import_onnx(fixed, tmp_path / "m", vocab=VOCAB, contract=GRU_CONTRACT),
        "'input_ids' has a fixed batch axis of 1",
    )
    time_fixed = tmp_path / "time-fixed.onnx"
    axes = {"input_ids": {0: "b"}, "hidden_in": {1: "b"}, "next_logits": {0: "b"}}
    export_gru_onnx(gru_lm(), time_fixed, dynamic_axes=axes | {"hidden_out": {1: "b"}})
    _refused(
        "fixed axis",
        lambda: import_onnx(time_fixed, tmp_path / "m", vocab=VOCAB, contract=GRU_CONTRACT),
        "fixed time axis of 4",
    )

    class BatchOfThree(nn.Module):  # a module that bakes its batch size in
        def __init__(self) -> None:
            super().__init__()
            self.lm = gru_lm()

        def forward(self, ids: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
            logits, h = self.lm(ids, h)
            return logits.reshape(3, -1, len(VOCAB)), h

    contract = ModelContract(states=(StateSpec(name="h", shape=(LAYERS, "batch", DIM)),))
    _refused(
        "fixed axis",
        lambda: export_module(BatchOfThree(), tmp_path / "m", vocab=VOCAB, contract=contract),
        "batch 5",
    )


def test_an_opset_the_runtime_lacks_is_refused(tmp_path: Path, gru_file: Path) -> None:
    model = onnx.load_model(str(gru_file))
    newest = runtime_max_opset()
    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx"):
            opset.version = newest + 1
    path = tmp_path / "future.onnx"
    onnx.save_model(model, str(path))
    _refused(
        "opset",
        lambda: import_onnx(path, tmp_path / "m", vocab=VOCAB, contract=GRU_CONTRACT),
        f"opset {newest + 1}",
        f"up to opset {newest}",
    )


class _Forgetful(nn.Module):
    """Ignores the state it is given: chunks do not carry."""

    def __init__(self) -> None:
        super().__init__()
        self.lm = gru_lm()

    def forward(self, ids: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        return self.lm(ids, torch.zeros_like(h))


def test_a_state_that_does_not_carry_is_refused(tmp_path: Path) -> None:
    contract = ModelContract(states=(StateSpec(name="h", shape=(LAYERS, "batch", DIM)),))
    _refused(
        "state carry",
        lambda: export_module(_Forgetful(), tmp_path / "m", vocab=VOCAB, contract=contract),
        "5 + 7",
    )


def test_a_state_of_the_wrong_shape_is_refused(tmp_path: Path) -> None:
    wrong = ModelContract(states=(StateSpec(name="h", shape=("batch", LAYERS, DIM)),))
    _refused(
        "call",
        lambda: export_module(gru_lm(), tmp_path / "m", vocab=VOCAB, contract=wrong),
        f"h [3, {LAYERS}, {DIM}]",
    )


def test_the_commands_refuse_in_one_line(
    tmp_path: Path, gru_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    short = tmp_path / "short.txt"
    short.write_text("\n".join(VOCAB[:-1]) + "\n")
    args = ["import-onnx", str(gru_file), str(tmp_path / "m"), "--vocab", str(short)]
    assert main([*args, "--state", "hidden_in:hidden_out"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("lmserve import-onnx: output 'next_logits'")
    assert main([*args, "--state", "hidden:hidden_out"]) == 1
    assert "the graph has no input 'hidden'" in capsys.readouterr().err
    script = tmp_path / "gru.pt"
    save_gru_script(gru_lm(), script)
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(VOCAB) + "\n")
    ts = ["import-torchscript", str(script), str(tmp_path / "t"), "--vocab", str(vocab)]
    assert main([*ts, "--state", "h:batch,2"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("lmserve import-torchscript: the model fails on a first call"), err
    assert not (tmp_path / "t").exists() and not (tmp_path / "m").exists()


def test_a_contract_file_is_validated(tmp_path: Path) -> None:
    bad = tmp_path / "contract.yaml"
    bad.write_text("states:\n  - {name: h, shape: [2, 16]}\nscores: probabilities\n")
    error = _refused("contract", lambda: ModelContract.from_yaml(bad), "needs one 'batch'")
    assert "scores" in str(error)
    good = tmp_path / "good.yaml"
    good.write_text(
        "states:\n  - {name: h, shape: [2, batch, 16], input: hidden_in, output: hidden_out}\n"
    )
    assert ModelContract.from_yaml(good).states[0].batch_axis == 1


def test_import_torchscript_equals_the_scripted_module(tmp_path: Path) -> None:
    model = gru_lm()
    script = tmp_path / "gru.pt"
    save_gru_script(model, script)
    contract = ModelContract(states=(StateSpec(name="h", shape=(LAYERS, "batch", DIM)),))
    result = import_torchscript(script, tmp_path / "m", vocab=VOCAB, contract=contract)
    assert result.manifest.provenance.source.startswith("torchscript gru.pt sha256:")
    loaded = torch.jit.load(str(tmp_path / "m" / "model.ts"))
    ids = torch.tensor([[1, 5, 6, 7]])
    with torch.no_grad():
        lp, h = loaded.step(ids, torch.zeros(LAYERS, 1, DIM))
    np.testing.assert_allclose(lp[0].numpy(), eager_log_probs(model, [1, 5, 6, 7]), atol=1e-4)
    assert tuple(h.shape) == (LAYERS, 1, DIM)
