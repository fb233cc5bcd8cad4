"""The recurrent family: RNN, LSTM, GRU and feed-forward (Bengio) models over a state passed in
and out of a graph, ours or brought (`lmserve.export.custom`), run by ONNX Runtime or
TorchScript."""

from __future__ import annotations

from pathlib import Path

from lmserve.server.backends.base import LanguageModelBackend, Vocabulary
from lmserve.server.backends.onnx import OnnxBackend
from lmserve.server.backends.recurrent import RecurrentBackend, RecurrentSpec, read_vocab
from lmserve.server.backends.stepping import RecurrentStepper, Stepper
from lmserve.server.backends.torchscript import TorchScriptBackend
from lmserve.server.errors import ModelLoadError
from lmserve.server.families.codecs import manifest_path, subword_codec
from lmserve.server.families.family import LoadContext, ModelFamily, StepperOf
from lmserve.server.manifest import ModelFormat, ModelKind, ModelManifest, TokenizerKind
from lmserve.server.text.codec import TextCodec
from lmserve.v1 import lm_service_pb2 as pb


class RecurrentFamily(ModelFamily):
    """State in, state out: a step is one batched graph call, every prompt token costs a
    graph step, and Rerank feeds each distinct prefix of the hypotheses once."""

    name = "recurrent"
    kinds = {
        ModelKind.RNN: pb.MODEL_KIND_RNN,
        ModelKind.LSTM: pb.MODEL_KIND_LSTM,
        ModelKind.GRU: pb.MODEL_KIND_GRU,
        # The feed-forward model's state is its window of previous ids.
        ModelKind.FFNN: pb.MODEL_KIND_FFNN,
    }
    formats = {
        ModelFormat.ONNX: pb.MODEL_FORMAT_ONNX,
        ModelFormat.TORCHSCRIPT: pb.MODEL_FORMAT_TORCHSCRIPT,
    }
    tokenizers = frozenset({TokenizerKind.WORD, TokenizerKind.CHARACTER, TokenizerKind.BPE})
    neural = True
    backend_types = (RecurrentBackend,)

    def load(
        self, folder: Path, manifest: ModelManifest, context: LoadContext
    ) -> LanguageModelBackend:
        _check_cell(folder, manifest)
        if manifest.format == ModelFormat.ONNX:
            return OnnxBackend.load(folder, manifest, context.onnx)
        if not context.allow_torchscript:
            raise ModelLoadError(
                manifest_path(folder),
                "TorchScript models are refused by this server (allow_torchscript is false): "
                "loading one runs code from the model file; export the model to ONNX",
            )
        return TorchScriptBackend.load(
            folder, manifest, max_chunk_tokens=context.onnx.max_chunk_tokens
        )

    def vocabulary(self, folder: Path, manifest: ModelManifest, context: LoadContext) -> Vocabulary:
        spec = RecurrentSpec.from_architecture(manifest.architecture, manifest_path(folder))
        return read_vocab(manifest.file_path(folder, "vocab"), spec, manifest.special_tokens)

    def read_codec(self, folder: Path, manifest: ModelManifest) -> TextCodec | None:
        return subword_codec(folder, manifest)

    def token_lines(self, folder: Path, manifest: ModelManifest) -> Path | None:
        """`vocab.txt` lists a character or BPE model's tokens escaped, same ids."""
        return manifest.file_path(folder, "vocab")

    def stepper(self, backend: LanguageModelBackend, stepper_of: StepperOf) -> Stepper:
        assert isinstance(backend, RecurrentBackend)
        return RecurrentStepper(backend)

    def describe(self, manifest: ModelManifest, info: pb.ModelInfo) -> None:
        """The network's sizes (and a feed-forward model's order)."""
        arch = manifest.architecture
        info.order = int(arch.get("order", 0))
        info.num_layers = int(arch.get("num_layers", 0))
        info.hidden_size = int(arch.get("hidden_size", 0))
        info.embedding_size = int(arch.get("embedding_size", 0))


def _check_cell(folder: Path, manifest: ModelManifest) -> None:
    cell = manifest.architecture.get("cell", manifest.kind)
    if cell != manifest.kind:
        raise ModelLoadError(
            manifest_path(folder), f"kind is {manifest.kind!r} but architecture.cell is {cell!r}"
        )
