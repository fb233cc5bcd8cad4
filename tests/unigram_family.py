"""A model family of the tests' own: add-one smoothed unigrams read from a counts file.

It proves that a kind of model is one family module: nothing in the server names it, and the
server loads it from the `model_families` setting (`unigram_family:FAMILY`) in the front and in
every engine worker. Its folder:

    model.yaml   kind: unigram, format: unigram_counts, files: {counts: {path: counts.tsv}}
    counts.tsv   one `word<TAB>count` line per word (`</s>` counted, as sentences end)

P(w) = (count(w) + 1) / (N + V) for every token w of the vocabulary (its words, `<s>`, `</s>`,
`<unk>`), whatever came before: natural logs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import yaml

from lmserve.server.backends.base import BatchScores, EncodedBatch, FloatArray, Vocabulary
from lmserve.server.backends.base import LanguageModelBackend as Backend
from lmserve.server.backends.stepping import ContextStepper, Stepper
from lmserve.server.errors import ModelLoadError
from lmserve.server.families.family import LoadContext, ModelFamily, StepperOf
from lmserve.server.manifest import ModelManifest
from lmserve.v1 import lm_service_pb2 as pb

SPECIALS = ("<unk>", "<s>", "</s>")


def read_counts(path: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        word, _, count = line.partition("\t")
        if not word or not count.isdigit():
            raise ModelLoadError(str(path), f"line {number} is not `word<TAB>count`")
        counts[word] = int(count)
    return counts


def vocabulary_of(counts: Mapping[str, int]) -> Vocabulary:
    words = [*SPECIALS, *(w for w in counts if w not in SPECIALS)]
    return Vocabulary.from_words(words)


def log_probs_of(counts: Mapping[str, int], vocab: Vocabulary) -> FloatArray:
    """log P(w) for every id: add-one smoothing over the whole vocabulary."""
    total = sum(counts.values()) + len(vocab)
    return np.array([math.log((counts.get(w, 0) + 1) / total) for w in vocab.words])


class UnigramBackend:
    """Every token's probability ignores its context."""

    def __init__(self, counts: Mapping[str, int]) -> None:
        self._vocab = vocabulary_of(counts)
        self.log_probs = log_probs_of(counts, self._vocab)

    @property
    def vocab(self) -> Vocabulary:
        return self._vocab

    def score(
        self, batch: EncodedBatch, *, bos: bool = True, eos: bool = True, per_token: bool = False
    ) -> BatchScores:
        rows = [
            [*batch.ids[batch.offsets[i] : batch.offsets[i + 1]].tolist()]
            + ([self._vocab.eos_id] if eos else [])
            for i in range(batch.batch_size)
        ]
        scores = [self.log_probs[row] for row in rows]
        totals = np.array([float(s.sum()) for s in scores])
        if not per_token:
            return BatchScores(totals=totals)
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum([len(r) for r in rows], out=offsets[1:])
        flat = np.concatenate(scores) if scores else np.zeros(0)
        return BatchScores(totals=totals, token_log_probs=flat, token_offsets=offsets)

    def next_token_log_probs(self, context: Sequence[int], *, bos: bool = True) -> FloatArray:
        return self.log_probs.copy()


class UnigramFamily(ModelFamily):
    """Unigrams: a context-free distribution, so a step keeps no history at all."""

    name = "unigram"
    kinds = {"unigram": pb.MODEL_KIND_UNSPECIFIED}
    formats = {"unigram_counts": pb.MODEL_FORMAT_UNSPECIFIED}
    backend_types = (UnigramBackend,)

    def load(self, folder: Path, manifest: ModelManifest, context: LoadContext) -> Backend:
        return UnigramBackend(read_counts(manifest.file_path(folder, "counts")))

    def vocabulary(self, folder: Path, manifest: ModelManifest, context: LoadContext) -> Vocabulary:
        return vocabulary_of(read_counts(manifest.file_path(folder, "counts")))

    def stepper(self, backend: Backend, stepper_of: StepperOf) -> Stepper:
        return ContextStepper(backend, max_context=0)

    def describe(self, manifest: ModelManifest, info: pb.ModelInfo) -> None:
        info.order = 1


FAMILY = UnigramFamily()


def write_unigram_folder(folder: Path, counts: Mapping[str, int], name: str) -> None:
    """A unigram model folder (see the module doc)."""
    folder.mkdir(parents=True)
    (folder / "counts.tsv").write_text("".join(f"{w}\t{c}\n" for w, c in counts.items()))
    manifest = {
        "name": name,
        "kind": "unigram",
        "format": "unigram_counts",
        "files": {"counts": {"path": "counts.tsv"}},
        "tokenizer": {"kind": "word", "lowercase": True},
    }
    (folder / "model.yaml").write_text(yaml.safe_dump(manifest))
