"""What a model family is: everything the server needs to know about one kind of model, in one
object, so nothing else tests kinds.

A family owns its manifest kinds and the formats it loads, its loaders (with the weights, in an
engine worker; the vocabulary alone, in a front), the tokenizers it takes, its stepper, its
positions, what its generation holds in memory, how Rerank runs on it, and what GetModel adds
for it. The built-in families are `ngram`, `recurrent`, `transformer` and `interpolated`;
another registers beside them (`families.catalog.register`, or the `model_families` setting)
with no other module changed:

    class UnigramFamily(ModelFamily):
        name = "unigram"
        kinds = {"unigram": pb.MODEL_KIND_UNSPECIFIED}
        formats = {"unigram_counts": pb.MODEL_FORMAT_UNSPECIFIED}

        def load(self, folder, manifest, context): ...
        def vocabulary(self, folder, manifest, context): ...
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Protocol, runtime_checkable

from lmserve.server.backends.base import LanguageModelBackend, Vocabulary
from lmserve.server.backends.onnx import OnnxOptions
from lmserve.server.backends.positions import Positions
from lmserve.server.backends.stepping import ContextStepper, HistoryKey, Stepper
from lmserve.server.errors import ModelLoadError
from lmserve.server.families.codecs import check_escaped_tokens, word_codec
from lmserve.server.manifest import ModelManifest, TokenizerKind
from lmserve.server.text.codec import TextCodec
from lmserve.v1 import lm_service_pb2 as pb


@dataclass(frozen=True)
class LoadedModel:
    """What a mixture needs of a model loaded before it: its backend (None where only its
    vocabulary was read), its manifest, its vocabulary and whether it computes without the
    GIL."""

    backend: LanguageModelBackend | None
    manifest: ModelManifest
    vocab: Vocabulary
    neural: bool = False


@dataclass(frozen=True)
class LoadContext:
    """Runtime options from the settings, and the models loaded so far (by name)."""

    onnx: OnnxOptions = field(default_factory=OnnxOptions)
    loaded: Mapping[str, LoadedModel] = field(default_factory=dict)
    # False refuses TorchScript models: loading one runs code from the model file.
    allow_torchscript: bool = True


@dataclass(frozen=True)
class ServingRules:
    """What serving one loaded model takes from its family, read once from its manifest:
    how long its sequences may grow, what its generation holds per token read, and how Rerank
    runs on it."""

    positions: Positions = Positions()
    cache_bytes_per_position: int = 0
    rerank_feeds_prefixes: bool = False
    reads_from_start: bool = True
    # Its weights are a memory map every process shares: a front scores small requests itself.
    scored_in_front: bool = False


@runtime_checkable
class AdoptsVocabulary(Protocol):
    """A backend that takes new strings for the same ids (recurrent and n-gram models)."""

    @property
    def vocab(self) -> Vocabulary: ...

    def adopt_vocabulary(self, vocab: Vocabulary) -> None: ...


# The stepper of any loaded backend, whatever its family (a mixture steps its components).
StepperOf = Callable[[LanguageModelBackend], Stepper]


class ModelFamily:
    """One kind of model (see the module doc). Subclasses set the class attributes and
    implement `load` and `vocabulary`; every other rule has the default most families share."""

    name: ClassVar[str]
    # Manifest kinds this family serves, each with the ModelKind GetModel reports for it.
    kinds: ClassVar[Mapping[str, pb.ModelKind]]
    # Formats it loads, each with the ModelFormat GetModel reports for it.
    formats: ClassVar[Mapping[str, pb.ModelFormat]]
    # The tokenizers its models may name.
    tokenizers: ClassVar[frozenset[TokenizerKind]] = frozenset({TokenizerKind.WORD})
    # Whether its compute runs outside the GIL (ONNX Runtime, torch): a worker then runs a
    # short scoring pass beside a long one, and is niced like other heavy compute.
    neural: ClassVar[bool] = False
    # Whether every text is read from `<s>`, the start the model is conditioned on (a first
    # token is scored given it), rather than from the ids alone (a transformer: a first token
    # with nothing before it has no log-prob, and `bos: false` makes it the context).
    reads_from_start: ClassVar[bool] = True
    # The backend classes it loads (what `stepper_of` recognises a loaded backend by).
    backend_types: ClassVar[tuple[type, ...]] = ()

    # -- loading ---------------------------------------------------------------------------

    def manifest_file(self, folder: Path) -> Path | None:
        """The file that stands for the manifest of a folder this family serves without one
        (a layout another tool writes), or None."""
        return None

    def folder_manifest(self, folder: Path) -> ModelManifest:
        """The manifest of a folder `manifest_file` recognised, read from its own layout."""
        raise NotImplementedError

    def load(
        self, folder: Path, manifest: ModelManifest, context: LoadContext
    ) -> LanguageModelBackend:
        """The model with its weights; the backend's own errors are wrapped by the caller."""
        raise NotImplementedError

    def vocabulary(self, folder: Path, manifest: ModelManifest, context: LoadContext) -> Vocabulary:
        """The model's vocabulary without its weights (a front that tokenizes but does not
        compute): the very ids `load` gives."""
        raise NotImplementedError

    def read_codec(self, folder: Path, manifest: ModelManifest) -> TextCodec | None:
        """The codec a model's own files define (characters, BPE, a checkpoint's tokenizer),
        or None when it splits words over its vocabulary."""
        return None

    def codec(
        self, folder: Path, manifest: ModelManifest, vocab: Vocabulary, read: TextCodec | None
    ) -> TextCodec:
        """The model's codec: the one its files define (`read_codec`), else words over its
        vocabulary."""
        return read if read is not None else word_codec(folder, manifest, vocab)

    def token_lines(self, folder: Path, manifest: ModelManifest) -> Path | None:
        """The file whose lines a character or BPE model's backend reads as its tokens,
        escaped (`vocab.txt`, an n-gram model's ARPA), or None when the backend takes its
        tokens from the codec itself."""
        return None

    def adopt_codec_tokens(
        self,
        folder: Path,
        manifest: ModelManifest,
        backend: LanguageModelBackend,
        vocab: Vocabulary,
    ) -> None:
        """Gives a backend that read escaped tokens from its files (`token_lines`) the codec's
        own strings, after checking the file lists exactly them."""
        path = self.token_lines(folder, manifest)
        if path is None:
            return
        if not isinstance(backend, AdoptsVocabulary):
            raise ModelLoadError(str(path), "this backend cannot take its codec's tokens")
        check_escaped_tokens(backend.vocab.words, vocab, path)
        backend.adopt_vocabulary(vocab)

    def maps_weights(self, manifest: ModelManifest) -> bool:
        """Whether the model's weights are a memory map whose pages every process shares (an
        n-gram binary): a front that only tokenizes then loads them too, nothing copied, and
        scores a small request where it arrives instead of paying a hop to the worker."""
        return False

    def components(self, folder: Path, manifest: ModelManifest) -> list[str]:
        """The models this one is built from (loaded before it, in its worker too)."""
        return []

    def is_neural(self, manifest: ModelManifest, loaded: Mapping[str, LoadedModel]) -> bool:
        """Whether this model computes outside the GIL (a mixture: whether a component does)."""
        return self.neural

    # -- serving ---------------------------------------------------------------------------

    def stepper(self, backend: LanguageModelBackend, stepper_of: StepperOf) -> Stepper:
        """One token at a time over the backend (generation, beams, sessions)."""
        return ContextStepper(backend)

    def history_key(self, backend: LanguageModelBackend) -> HistoryKey | None:
        """What the model's distributions depend on, for merging histories exactly in lattice
        rescoring (`backends.stepping.HistoryKey`); None (the default): its whole history, so
        histories are merged at the request's `max_history` tokens, an approximation."""
        return None

    def positions(self, manifest: ModelManifest) -> Positions:
        """How long one sequence may grow (`backends.positions`); unbounded by default."""
        return Positions()

    def cache_bytes_per_position(self, manifest: ModelManifest) -> int:
        """Memory one generated sequence holds per token it has read (a key/value cache), what
        generation is admitted by; 0: a state of fixed size, admitted by slots alone."""
        return 0

    def rerank_feeds_prefixes(self, neural: bool) -> bool:
        """Whether Rerank feeds each distinct prefix of the hypotheses once (recurrent models:
        a step costs more than sharing), rather than scoring them as Score does."""
        return neural

    def rules(self, manifest: ModelManifest, neural: bool) -> ServingRules:
        """This model's serving rules, from the three above."""
        return ServingRules(
            self.positions(manifest),
            self.cache_bytes_per_position(manifest),
            self.rerank_feeds_prefixes(neural),
            self.reads_from_start,
            self.maps_weights(manifest),
        )

    def describe(self, manifest: ModelManifest, info: pb.ModelInfo) -> None:
        """Adds what GetModel reports of this family only (a transformer's cache...)."""
