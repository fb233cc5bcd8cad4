"""The transformer family: decoder-only transformers with a key/value cache, one ONNX graph in
optimum's layout (a folder optimum wrote, read without a manifest: `hf_folder`, or
`lmserve import-hf --optimum-layout`) or the shared-buffer graph `lmserve import-hf` writes
for GPT-2 and Llama (manifest `architecture.kv_cache: shared_buffer`: its cache appended in
place, `SharedKvStepper`), over a checkpoint's own tokenizer or a word vocabulary."""

from __future__ import annotations

from pathlib import Path

from lmserve.server.backends.base import LanguageModelBackend, Vocabulary
from lmserve.server.backends.fused_transformer import SHARED_BUFFER, FusedTransformerBackend
from lmserve.server.backends.kv_stepping import KvStepper
from lmserve.server.backends.positions import Positions
from lmserve.server.backends.shared_kv_stepping import SharedKvStepper
from lmserve.server.backends.stepping import Stepper
from lmserve.server.backends.transformer import TransformerBackend
from lmserve.server.families.codecs import pretrained_codec, vocab_file
from lmserve.server.families.family import LoadContext, ModelFamily, StepperOf
from lmserve.server.families.hf_folder import CONFIG, is_optimum_folder, optimum_manifest
from lmserve.server.manifest import ModelFormat, ModelKind, ModelManifest, TokenizerKind
from lmserve.server.text.codec import TextCodec
from lmserve.v1 import lm_service_pb2 as pb


class TransformerFamily(ModelFamily):
    """State is a cache that grows with the context: sequences are bounded by the model's
    positions, generation is admitted by the cache bytes it can reach, and Rerank reads the
    hypotheses in one pass (a prefix they all share read once through the cache)."""

    name = "transformer"
    kinds = {ModelKind.TRANSFORMER: pb.MODEL_KIND_TRANSFORMER}
    formats = {ModelFormat.ONNX: pb.MODEL_FORMAT_ONNX}
    tokenizers = frozenset({TokenizerKind.WORD, TokenizerKind.HUGGINGFACE})
    neural = True
    reads_from_start = False
    backend_types = (TransformerBackend,)

    def manifest_file(self, folder: Path) -> Path | None:
        return folder / CONFIG if is_optimum_folder(folder) else None

    def folder_manifest(self, folder: Path) -> ModelManifest:
        return optimum_manifest(folder)

    def load(
        self, folder: Path, manifest: ModelManifest, context: LoadContext
    ) -> LanguageModelBackend:
        vocab = self.vocabulary(folder, manifest, context)
        if manifest.architecture.get("kv_cache") == SHARED_BUFFER:
            return FusedTransformerBackend.load(folder, manifest, context.onnx, vocab)
        return TransformerBackend.load(folder, manifest, context.onnx, vocab)

    def vocabulary(self, folder: Path, manifest: ModelManifest, context: LoadContext) -> Vocabulary:
        """Its tokenizer.json's tokens (padded to the model's output size), or a word model's
        `vocab.txt`."""
        codec = self.read_codec(folder, manifest)
        return codec.vocab if codec is not None else vocab_file(folder, manifest, escape=False)

    def read_codec(self, folder: Path, manifest: ModelManifest) -> TextCodec | None:
        if manifest.tokenizer.kind is TokenizerKind.HUGGINGFACE:
            return pretrained_codec(folder, manifest)
        return None

    def stepper(self, backend: LanguageModelBackend, stepper_of: StepperOf) -> Stepper:
        if isinstance(backend, FusedTransformerBackend):
            return SharedKvStepper(backend)
        assert isinstance(backend, TransformerBackend)
        return KvStepper(backend)

    def positions(self, manifest: ModelManifest) -> Positions:
        limit = manifest.architecture.get("max_positions")
        return Positions(int(limit) if limit else None)

    def cache_bytes_per_position(self, manifest: ModelManifest) -> int:
        return int(manifest.architecture.get("cache_bytes_per_position", 0))

    def rerank_feeds_prefixes(self, neural: bool) -> bool:
        return False

    def describe(self, manifest: ModelManifest, info: pb.ModelInfo) -> None:
        """The decoder and its cache: what a caller sizes its requests by."""
        arch = manifest.architecture
        info.num_layers = int(arch.get("num_layers", 0))
        info.hidden_size = int(arch.get("hidden_size", 0))
        info.transformer.CopyFrom(
            pb.TransformerInfo(
                architecture=str(arch.get("architecture", "")),
                max_positions=int(arch.get("max_positions", 0)),
                num_layers=int(arch.get("num_layers", 0)),
                kv_heads=int(arch.get("kv_heads", 0)),
                head_dim=int(arch.get("head_dim", 0)),
                cache_bytes_per_position=int(arch.get("cache_bytes_per_position", 0)),
            )
        )
        optimized = manifest.optimization
        if optimized is not None:
            info.transformer.optimization.CopyFrom(
                pb.GraphOptimization(
                    optimizer=optimized.optimizer,
                    model_type=optimized.model_type,
                    fused_ops=optimized.fused_ops,
                    onnxruntime_version=optimized.onnxruntime_version,
                )
            )
