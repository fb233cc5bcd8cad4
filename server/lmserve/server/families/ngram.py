"""The n-gram family: back-off models from ARPA files or our memory-mapped binary, scored as
KenLM scores them, over words, characters or BPE pieces."""

from __future__ import annotations

from pathlib import Path

from lmserve.server.backends.base import LanguageModelBackend, Vocabulary
from lmserve.server.backends.ngram.folder import load_model_folder_binary, ngram_vocabulary
from lmserve.server.backends.ngram.model import NgramModel
from lmserve.server.backends.stepping import ContextStepper, HistoryKey, Stepper
from lmserve.server.families.codecs import subword_codec
from lmserve.server.families.family import LoadContext, ModelFamily, StepperOf
from lmserve.server.manifest import ModelFormat, ModelKind, ModelManifest, TokenizerKind
from lmserve.server.text.codec import TextCodec
from lmserve.v1 import lm_service_pb2 as pb


class NgramFamily(ModelFamily):
    """Back-off n-grams: their state is the last order-1 ids, so a step is a lookup (in C, under
    the GIL: too short to drop it), and Rerank scores every position (lookups cost less than
    sharing prefixes)."""

    name = "ngram"
    kinds = {ModelKind.NGRAM: pb.MODEL_KIND_NGRAM}
    formats = {
        ModelFormat.NGRAM_BINARY: pb.MODEL_FORMAT_NGRAM_BINARY,
        ModelFormat.ARPA: pb.MODEL_FORMAT_ARPA,
    }
    tokenizers = frozenset({TokenizerKind.WORD, TokenizerKind.CHARACTER, TokenizerKind.BPE})
    backend_types = (NgramModel,)

    def load(
        self, folder: Path, manifest: ModelManifest, context: LoadContext
    ) -> LanguageModelBackend:
        if manifest.format == ModelFormat.NGRAM_BINARY:
            # An out-of-date binary falls back to the folder's ARPA copy (with a warning).
            return load_model_folder_binary(folder, manifest)
        return NgramModel.from_arpa(_arpa_path(folder, manifest))

    def maps_weights(self, manifest: ModelManifest) -> bool:
        """A binary is memory-mapped (an ARPA folder's model is read into memory)."""
        return manifest.format == ModelFormat.NGRAM_BINARY

    def vocabulary(self, folder: Path, manifest: ModelManifest, context: LoadContext) -> Vocabulary:
        return ngram_vocabulary(folder, manifest)

    def read_codec(self, folder: Path, manifest: ModelManifest) -> TextCodec | None:
        return subword_codec(folder, manifest)

    def token_lines(self, folder: Path, manifest: ModelManifest) -> Path | None:
        """A character or BPE model's ARPA words are its codec's tokens, escaped (a space
        cannot be an ARPA word), unigrams in the codec's id order."""
        return _arpa_path(folder, manifest)

    def stepper(self, backend: LanguageModelBackend, stepper_of: StepperOf) -> Stepper:
        assert isinstance(backend, NgramModel)
        # Its word lookups: lattice arcs and Fuse's token log-probs need no distribution.
        return ContextStepper(backend, max_context=backend.order - 1, lookup=backend)

    def history_key(self, backend: LanguageModelBackend) -> HistoryKey | None:
        """KenLM's minimised state: of the last order-1 tokens, the longest suffix that is an
        entry of the model (`NgramModel.context_slots` finds one entry per order ending at the
        last token). A longer history gives the same distributions, since an n-gram the model
        holds has every prefix in the model too."""
        assert isinstance(backend, NgramModel)
        window = backend.order - 1

        def key(recent: tuple[int, ...]) -> tuple[int, ...]:
            kept = len(backend.context_slots(recent[-window:], bos=False)) if window else 0
            return recent[len(recent) - kept :] if kept else ()

        return HistoryKey(window, key)

    def rerank_feeds_prefixes(self, neural: bool) -> bool:
        return False

    def describe(self, manifest: ModelManifest, info: pb.ModelInfo) -> None:
        """The order and how the binary stores the model (`import-arpa --quantize`)."""
        spec = manifest.ngram
        if spec is None:
            return
        info.order = spec.order
        storage = spec.storage
        if storage is not None:
            info.ngram_storage.CopyFrom(
                pb.NgramStorage(
                    layout=storage.layout,
                    ngram_counts=storage.counts,
                    bytes=storage.bytes,
                    bytes_per_ngram=storage.bytes_per_ngram,
                    max_prob_error=storage.max_prob_error,
                    max_backoff_error=storage.max_backoff_error,
                    max_token_error=storage.max_token_error,
                )
            )


def _arpa_path(folder: Path, manifest: ModelManifest) -> Path:
    """The ARPA file: the `arpa` entry of a binary's folder, or an ARPA folder's `model`."""
    return manifest.file_path(folder, "arpa" if "arpa" in manifest.files else "model")
