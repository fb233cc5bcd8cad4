"""A model repository built in tmp (good and broken models) and a real server on a free port."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import yaml
from integration_data import AUTH_TOKEN, KJV_PATTERN, MAX_TEXTS, MAX_TOKENS
from neural_folders import VOCAB, tiny_model, write_onnx_folder
from served import ServerFactory

from lmserve.server.backends.ngram.folder import write_model_folder
from lmserve.server.backends.ngram.model import NgramModel
from lmserve.server.front.process.app import BackgroundServer
from lmserve.server.manifest import (
    ModelManifest,
    Provenance,
    TokenizerSpec,
    sha256_of,
    write_manifest,
)
from lmserve.v1 import lm_service_pb2_grpc


def _import(arpa: Path, folder: Path, name: str, **tokenizer: object) -> ModelManifest:
    return write_model_folder(
        NgramModel.from_arpa(arpa),
        folder,
        name=name,
        tokenizer=TokenizerSpec.model_validate(tokenizer),
        provenance=Provenance(trained_by="tests", metrics={"test_perplexity": 12.5}),
        description=f"{name} for the integration tests",
    )


def _arpa_folder(folder: Path, name: str, arpa_text: bytes) -> None:
    """A model served straight from ARPA text (format arpa), compiled when loaded."""
    folder.mkdir(parents=True)
    (folder / "model.arpa").write_bytes(arpa_text)
    manifest = ModelManifest.model_validate(
        {
            "name": name,
            "kind": "ngram",
            "format": "arpa",
            "files": {"arpa": {"path": "model.arpa", "sha256": sha256_of(folder / "model.arpa")}},
            "ngram": {"order": 5},
        }
    )
    write_manifest(folder, manifest)


@pytest.fixture(scope="session")
def model_repository(tmp_path_factory: pytest.TempPathFactory, shared_data: Path) -> Path:
    root = tmp_path_factory.mktemp("models")
    kenlm = shared_data / "kenlm-tests"
    _import(kenlm / "test.arpa", root / "test", "test")
    _import(kenlm / "test_nounk.arpa", root / "test-nounk", "test-nounk")
    _import(
        shared_data / "kjv" / "kenlm" / "kjv.3gram.arpa",
        root / "kjv3",
        "kjv3",
        lowercase=True,
        pattern=KJV_PATTERN,
    )
    _arpa_folder(root / "test-arpa", "test-arpa", (kenlm / "test.arpa").read_bytes())

    # Broken folders: each must fail alone while the others serve.
    shutil.copytree(root / "test", root / "bad-checksum")
    manifest = yaml.safe_load((root / "bad-checksum" / "model.yaml").read_text())
    manifest["name"] = "bad-checksum"
    manifest["files"]["model"]["sha256"] = "0" * 64
    (root / "bad-checksum" / "model.yaml").write_text(yaml.safe_dump(manifest))

    shutil.copytree(root / "test", root / "missing-file")
    manifest = yaml.safe_load((root / "missing-file" / "model.yaml").read_text())
    manifest["name"] = "missing-file"
    (root / "missing-file" / "model.yaml").write_text(yaml.safe_dump(manifest))
    (root / "missing-file" / manifest["files"]["model"]["path"]).unlink()

    _arpa_folder(root / "malformed-arpa", "malformed-arpa", b"\\data\\\nngram 1=x\n\nnot arpa\n")

    (root / "invalid-manifest").mkdir()
    (root / "invalid-manifest" / "model.yaml").write_text(
        "name: invalid-manifest\nkind: mamba\nformat: ngram_binary\nfiles: {}\n"
    )

    (root / "neural").mkdir()
    (root / "neural" / "model.onnx").write_bytes(b"not really onnx")
    (root / "neural" / "model.yaml").write_text(
        "name: neural\nkind: lstm\nformat: onnx\nfiles: {model: {path: model.onnx}}\n"
    )
    return root


@pytest.fixture(scope="session")
def server(serve: ServerFactory, model_repository: Path) -> BackgroundServer:
    """The session's server on `model_repository`, with metrics on a port of its own."""
    return serve(
        model_repository,
        metrics_enabled=True,
        metrics_host="127.0.0.1",
        metrics_port=0,
        max_texts_per_request=MAX_TEXTS,
        max_tokens_per_text=MAX_TOKENS,
    )


@pytest.fixture(scope="session")
def auth_server(serve: ServerFactory, model_repository: Path) -> BackgroundServer:
    """The session's server on `model_repository` that asks for `AUTH_TOKEN`, shared by the
    fronts' auth tests (Connect, the WebSocket, /v1, the page); it also takes at most two
    hypotheses in a Rerank list, for the Connect front's answer to a request over a limit."""
    return serve(model_repository, auth_token=AUTH_TOKEN, max_rerank_hypotheses=2)


@pytest.fixture(scope="session")
def channel(server: BackgroundServer) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.address) as channel:
        yield channel


@pytest.fixture(scope="session")
def stub(channel: grpc.Channel) -> lm_service_pb2_grpc.LanguageModelServiceStub:
    return lm_service_pb2_grpc.LanguageModelServiceStub(channel)


@pytest.fixture(scope="session")
def tiny_lstm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny word LSTM exported to ONNX (neural_folders' VOCAB, seed 3) as a folder named `lstm`,
    written once per session: repositories link it (`(root / "lstm").symlink_to(tiny_lstm)`)."""
    folder = tmp_path_factory.mktemp("tiny-lstm") / "lstm"
    write_onnx_folder(tiny_model("lstm", seed=3), VOCAB, folder, name="lstm")
    return folder


@pytest.fixture(scope="session")
def kjv_repository(tmp_path_factory: pytest.TempPathFactory, model_repository: Path) -> Path:
    """KenLM's KJV 3-gram (`kjv3`, as in `model_repository`) and the committed `kjv-lstm`: the
    autocomplete modules' models."""
    root = tmp_path_factory.mktemp("kjv-models")
    (root / "kjv3").symlink_to(model_repository / "kjv3", target_is_directory=True)
    lstm = Path(__file__).resolve().parents[2] / "models" / "kjv-lstm"
    (root / "kjv-lstm").symlink_to(lstm, target_is_directory=True)
    return root


# -- models several modules serve, each built once per session --------------------------------
# Built where first asked for (torch and transformers are imported only then); a module's
# repository links the folders it serves (`(repo / "tiny-gpt2").symlink_to(folder)`), under
# the names given here, which are the models' names.


@pytest.fixture(scope="session")
def hf_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny Hugging Face checkpoints (hf_models: seeded random weights, a BPE tokenizer
    trained here), `gpt2` and `llama`."""
    from hf_models import checkpoint

    root = tmp_path_factory.mktemp("hf-checkpoints")
    return {build: checkpoint(root / build, build) for build in ("gpt2", "llama")}


@pytest.fixture(scope="session")
def hf_folders(
    tmp_path_factory: pytest.TempPathFactory, hf_checkpoints: dict[str, Path]
) -> dict[str, Path]:
    """Those checkpoints imported as model folders: `tiny-gpt2` by `lmserve import-hf`,
    `tiny-llama` through the library (`export_checkpoint`); keyed by build."""
    from lmserve.export.hf.importer import export_checkpoint
    from lmserve.server.cli import main

    root = tmp_path_factory.mktemp("hf-folders")
    assert main(["import-hf", str(hf_checkpoints["gpt2"]), str(root / "tiny-gpt2")]) == 0
    export_checkpoint(hf_checkpoints["llama"], root / "tiny-llama")
    return {"gpt2": root / "tiny-gpt2", "llama": root / "tiny-llama"}


@pytest.fixture(scope="session")
def brought_folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two neural LMs written outside the project (brought_models), brought in: `gru-onnx`, the
    GRU (`gru_lm()`) exported to ONNX and imported by `lmserve import-onnx`, and
    `tiny-lstm-ts`, the LSTM (`tiny_lstm()`) through `export_module` as TorchScript."""
    from brought_models import LSTM_CONTRACT, VOCAB, export_gru_onnx, gru_lm, tiny_lstm

    from lmserve.export.custom import export_module
    from lmserve.server.cli import main

    root = tmp_path_factory.mktemp("brought-folders")
    vocab = root / "vocab.txt"
    vocab.write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    export_gru_onnx(gru_lm(), root / "gru.onnx")
    assert main(["import-onnx", str(root / "gru.onnx"), str(root / "gru-onnx"),
                 "--vocab", str(vocab), "--kind", "gru",
                 "--tokens", "input_ids", "--scores", "next_logits",
                 "--state", "hidden_in:hidden_out:1:h"]) == 0  # fmt: skip
    export_module(tiny_lstm(), root / "tiny-lstm-ts", vocab=VOCAB, contract=LSTM_CONTRACT,
                  kind="lstm", format="torchscript")  # fmt: skip
    return {"gru-onnx": root / "gru-onnx", "tiny-lstm-ts": root / "tiny-lstm-ts"}
