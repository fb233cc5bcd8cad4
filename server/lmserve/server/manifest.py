"""The model manifest (`model.yaml` or `model.json`): what a model folder holds, validated.

A model folder is self-describing: the manifest names the model, its kind and format, every file
with its sha256, the tokenizer and special tokens, and where the model came from.

    name: kjv-5gram
    version: "1"
    kind: ngram
    format: ngram_binary
    files:
      model: {path: model.lmbin, sha256: 3f2a...}
    tokenizer: {kind: word, lowercase: true, pattern: "[a-z]+(?:'[a-z]+)*"}
    ngram: {order: 5, smoothing: modified-kneser-ney}
"""

from __future__ import annotations

import hashlib
import json
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from lmserve.server.errors import ChecksumMismatch, ManifestError, clip_repr

MANIFEST_NAMES = ("model.yaml", "model.yml", "model.json")
# What a kind or format is called: lowercase words joined by `_` or `-`.
_NAME = r"^[a-z][a-z0-9]*(?:[_-][a-z0-9]+)*$"


class ModelKind(StrEnum):
    """The kinds of model the built-in families serve (`lmserve.server.families`); a family
    added beside them brings kinds of its own, so a manifest's `kind` is any such name."""

    NGRAM = "ngram"
    RNN = "rnn"
    LSTM = "lstm"
    GRU = "gru"
    # Feed-forward (Bengio) neural LM over a fixed window of previous tokens.
    FFNN = "ffnn"
    INTERPOLATED = "interpolated"
    # A decoder-only transformer whose state is a key/value cache (one ONNX graph with past
    # key values, optimum's layout).
    TRANSFORMER = "transformer"


class ModelFormat(StrEnum):
    """The file formats the built-in families load (a manifest's `format`, like its `kind`,
    may name one a family added beside them loads)."""

    ARPA = "arpa"
    NGRAM_BINARY = "ngram_binary"
    ONNX = "onnx"
    TORCHSCRIPT = "torchscript"
    INTERPOLATION = "interpolation"


class TokenizerKind(StrEnum):
    WORD = "word"
    CHARACTER = "character"
    BPE = "bpe"
    # A Hugging Face `tokenizer.json` taken as it is (byte-level BPE, SentencePiece-style BPE,
    # WordPiece...): the checkpoint's own tokens, words being what whitespace separates.
    HUGGINGFACE = "huggingface"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FileEntry(_Strict):
    """One file of the model folder, relative to it."""

    path: str
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")


class TokenizerSpec(_Strict):
    kind: TokenizerKind = TokenizerKind.WORD
    lowercase: bool = False
    # Words are the matches of this regex; absent means a whitespace split (KenLM's rule).
    pattern: str | None = None
    # A tokenizer file in the folder (BPE models), a key of `files`.
    file: str | None = None


class SpecialTokensSpec(_Strict):
    bos: str = "<s>"
    eos: str = "</s>"
    unk: str = "<unk>"
    pad: str | None = None


class NgramStorage(_Strict):
    """How an n-gram binary stores its model (what GetModel reports as `ngram_storage`)."""

    # "probing": exact float32 values; "probing-q8": 8-bit values (`import-arpa --quantize`).
    layout: Literal["probing", "probing-q8"] = "probing"
    counts: list[int] = Field(default_factory=list)  # per order, as the ARPA declared them
    bytes: int = Field(default=0, ge=0)  # the tables' bytes
    bytes_per_ngram: float = Field(default=0.0, ge=0)
    # Quantization's largest error on any log-prob and backoff, and its bound on any token's
    # log-prob, in nats (0 when exact).
    max_prob_error: float = Field(default=0.0, ge=0)
    max_backoff_error: float = Field(default=0.0, ge=0)
    max_token_error: float = Field(default=0.0, ge=0)


class NgramSpec(_Strict):
    order: int = Field(ge=1)
    smoothing: str | None = None
    storage: NgramStorage | None = None


class Provenance(_Strict):
    training_corpus: str | None = None
    trained_by: str | None = None
    created: str | None = None
    # Measured figures, e.g. test_perplexity (natural log, </s> counted).
    metrics: dict[str, float] = Field(default_factory=dict)
    # A model brought from outside: what it was written from, and how closely the folder's
    # graphs reproduce it (lmserve.export.custom measures both).
    source: str | None = None
    parity: dict[str, float] = Field(default_factory=dict)


class Quantization(_Strict):
    """How a neural model's graphs were quantized, and what it cost (`--quantize int8`).

    The cost is measured by scoring held-out text through the served backend twice, the float
    folder and the quantized one, the same tokens: the largest per-token difference (nats) and
    the relative change in perplexity. The export refuses a folder whose `max_token_error` is
    over `max_token_error_bound`."""

    # dynamic-int8: weights of `ops` stored as int8 (symmetric, per output channel),
    # activations quantized to uint8 at every call (ONNX Runtime's dynamic quantization),
    # inputs, outputs and states float32. float16: every float weight and activation in
    # float16 (ONNX Runtime's float16 converter), a transformer's key/value cache included:
    # the GPU's precision (a CPU computes the nodes it has no float16 kernel for in float32).
    method: Literal["dynamic-int8", "float16"] = "dynamic-int8"
    weights: Literal["int8", "float16"] = "int8"
    # The op types whose weights became 8-bit (MatMul, LSTM: int8; Gather, an embedding table:
    # uint8 with a zero point), and how many nodes.
    ops: list[str] = Field(default_factory=list)
    nodes: int = Field(default=0, ge=0)
    # Largest |log p_quantized - log p_float| over the held-out tokens, and the bound it passed.
    max_token_error: float = Field(ge=0)
    max_token_error_bound: float = Field(gt=0)
    # Perplexities on the held-out text (natural log, </s> counted) and int8 / float - 1.
    float_perplexity: float = Field(gt=0)
    perplexity: float = Field(gt=0)
    perplexity_change: float
    # Which text, and how many tokens were compared.
    held_out: str = ""
    held_out_tokens: int = Field(default=0, ge=0)
    # The graph files' bytes before and after.
    float_bytes: int = Field(default=0, ge=0)
    bytes: int = Field(default=0, ge=0)


class GraphOptimization(_Strict):
    """What ONNX Runtime's transformer optimizer fused in a transformer's graph at import
    (`lmserve import-hf`, `lmserve optimize`): the folder's parity was measured after it."""

    optimizer: Literal["onnxruntime.transformers"] = "onnxruntime.transformers"
    # The model type its fusions were chosen by (`optimize_model(model_type=...)`).
    model_type: str
    # Fused operator -> its nodes in the written graph (`get_fused_operator_statistics`), the
    # ones the graph holds.
    fused_ops: dict[str, int] = Field(default_factory=dict)
    onnxruntime_version: str = ""


class ModelManifest(_Strict):
    """The validated contents of a model folder's manifest."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", max_length=128)
    version: str = "1"
    # Which family serves the model, and what it loads (`families.family_of`): ModelKind's
    # and ModelFormat's names, or those of a family added beside the built-in ones.
    kind: str = Field(pattern=_NAME)
    format: str = Field(pattern=_NAME)
    description: str = ""
    files: dict[str, FileEntry]
    tokenizer: TokenizerSpec = Field(default_factory=TokenizerSpec)
    special_tokens: SpecialTokensSpec = Field(default_factory=SpecialTokensSpec)
    ngram: NgramSpec | None = None
    # Backend-specific settings (neural sizes, state names...), validated by that backend.
    architecture: dict[str, Any] = Field(default_factory=dict)
    provenance: Provenance = Field(default_factory=Provenance)
    # Present when the graphs were quantized at export (`--quantize int8`).
    quantization: Quantization | None = None
    # Present when ONNX Runtime's transformer optimizer rewrote the graph at import.
    optimization: GraphOptimization | None = None

    def file_path(self, folder: Path, key: str) -> Path:
        """The file's path, checked to lie inside `folder` (`confined_path`)."""
        if key not in self.files:
            raise ManifestError(str(folder), f"manifest lists no file {key!r}")
        return confined_path(folder, key, self.files[key].path)


def confined_path(folder: Path, key: str, path: str) -> Path:
    """`folder / path`, refused unless it resolves inside `folder`: a manifest must not make the
    server read (and checksum, and report on) files elsewhere, by `..`, an absolute path or a
    symbolic link that points out of the folder."""
    relative = Path(path)
    where = str(find_manifest(folder) or folder / MANIFEST_NAMES[0])
    leaves = ManifestError(where, f"files.{key}.path {clip_repr(path)} leaves the model folder")
    if not path or relative.is_absolute() or relative.drive or ".." in relative.parts:
        raise leaves
    full = folder / relative
    try:
        inside = full.resolve().is_relative_to(folder.resolve())
    except (OSError, RuntimeError):  # a symlink loop
        inside = False
    if not inside:
        raise leaves
    return full


def find_manifest(folder: Path) -> Path | None:
    """The folder's manifest file (`model.yaml`, `model.yml` or `model.json`), if it has one.
    A folder some family reads without one (an optimum export) is `families`' to find."""
    for name in MANIFEST_NAMES:
        candidate = folder / name
        if candidate.is_file():
            return candidate
    return None


def read_manifest(folder: Path) -> ModelManifest:
    """Reads and validates the manifest file of a model folder."""
    path = find_manifest(folder)
    if path is None:
        raise ManifestError(str(folder), f"no manifest ({' or '.join(MANIFEST_NAMES)})")
    try:
        text = path.read_text(encoding="utf-8")
        raw = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise ManifestError(str(path), "unreadable", f"{exc}") from exc
    try:
        return ModelManifest.model_validate(raw)
    except ValidationError as exc:
        raise ManifestError(str(path), f"invalid manifest: {validation_problems(exc)}") from exc


def validation_problems(exc: ValidationError) -> str:
    """pydantic's errors in one line: `field.path: message; ...`."""
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}" for e in exc.errors()
    )


def read_json_object(path: Path) -> dict[str, Any]:
    """A JSON file holding an object (config.json, tokenizer.json...), or ManifestError."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ManifestError(str(path), "unreadable JSON", f"{exc}") from exc
    if not isinstance(data, dict):
        raise ManifestError(str(path), "is not a JSON object")
    return data


def write_manifest(folder: Path, manifest: ModelManifest) -> Path:
    """Writes `model.yaml` into the folder (the files' checksums must already be filled in)."""
    path = folder / "model.yaml"
    data = manifest.model_dump(mode="json", exclude_none=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), encoding="utf-8")
    return path


def sha256_of(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def verify_files(folder: Path, manifest: ModelManifest) -> None:
    """Checks that every listed file lies in the folder, exists and matches its sha256."""
    for key, entry in manifest.files.items():
        path = confined_path(folder, key, entry.path)
        if not path.is_file():
            raise ManifestError(str(path), f"file {key!r} listed in the manifest is missing")
        if entry.sha256 is not None:
            actual = sha256_of(path)
            if actual != entry.sha256:
                raise ChecksumMismatch(
                    str(path), f"sha256 is {actual}, the manifest says {entry.sha256}"
                )
