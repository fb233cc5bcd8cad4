"""A transformers causal LM -> a served model folder: the graph with past key values, the
model's config and tokens, and the manifest with its parity figures.

    parity = write_transformer_folder(model, out, name="my-gpt2", tokenizer_json=path, ...)

The folder is written in a staging folder beside `out` and moved into place only after the
graph passed its parity check against the model (ParityError otherwise), so a failed export
never leaves a half-written model where a server would load it.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lmserve.export.hf.graph import export_with_past
from lmserve.export.hf.parity import PARITY_NATS, Parity, check_parity
from lmserve.server.backends.transformer import CacheShape
from lmserve.server.manifest import (
    FileEntry,
    ModelFormat,
    ModelKind,
    ModelManifest,
    Provenance,
    SpecialTokensSpec,
    TokenizerSpec,
    sha256_of,
    write_manifest,
)
from lmserve.server.pretrained_manifest import (
    CONFIG,
    GRAPH,
    TOKENIZER,
    architecture,
    pretrained_manifest,
)

VOCAB = "vocab.txt"


class ParityError(ValueError):
    """The exported graph disagrees with transformers' forward beyond PARITY_NATS."""


def write_transformer_folder(
    model: Any,
    out: Path,
    *,
    name: str,
    sample_ids: Sequence[Sequence[int]],
    provenance: Provenance,
    description: str = "",
    tokenizer_json: Path | None = None,
    vocab_words: Sequence[str] | None = None,
    tokenizer: TokenizerSpec | None = None,
    special_tokens: SpecialTokensSpec | None = None,
) -> Parity:
    """Writes the folder for `model` (a transformers causal LM) into `out` (replaced).

    Its tokens are either a Hugging Face `tokenizer_json` (served as it is) or, for a model
    trained here on words, `vocab_words` with the word `tokenizer` and `special_tokens`.
    """
    import onnxruntime as ort  # type: ignore[import-untyped,unused-ignore]

    if (tokenizer_json is None) == (vocab_words is None):
        raise ValueError("give a tokenizer.json or a word vocabulary, not both")
    model = model.eval()
    config = model.config.to_dict()
    cache = CacheShape.from_config(config, "config.json")
    out = out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        export_with_past(model, cache, staging / GRAPH)
        session = ort.InferenceSession(str(staging / GRAPH), providers=["CPUExecutionProvider"])
        parity = check_parity(model, session, cache, sample_ids)
        if parity.worst > PARITY_NATS:
            raise ParityError(
                f"the exported graph is {parity.worst:.2e} nats a token from transformers' "
                f"forward (allowed {PARITY_NATS:g}): {parity}"
            )
        (staging / CONFIG).write_text(json.dumps(config, indent=2), encoding="utf-8")
        figures = {
            "one_pass_max_abs_diff_nats": parity.one_pass,
            "two_chunks_max_abs_diff_nats": parity.two_chunks,
            "left_padded_max_abs_diff_nats": parity.left_padded,
        }
        stamped = provenance.model_copy(update={"parity": figures})
        if tokenizer_json is not None:
            shutil.copyfile(tokenizer_json, staging / TOKENIZER)
            manifest = pretrained_manifest(
                staging, name=name, provenance=stamped, description=description
            )
        else:
            assert vocab_words is not None
            (staging / VOCAB).write_text("".join(f"{w}\n" for w in vocab_words), "utf-8")
            base = _word_manifest_fields(staging, name, config)
            manifest = ModelManifest(
                **base,
                description=description,
                tokenizer=tokenizer or TokenizerSpec(),
                special_tokens=special_tokens or SpecialTokensSpec(),
                provenance=stamped,
            )
        write_manifest(staging, _with_checksums(staging, manifest))
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return parity


def _word_manifest_fields(folder: Path, name: str, config: dict[str, Any]) -> dict[str, Any]:
    """A word-vocabulary transformer's manifest fields besides tokenizer and provenance."""
    return {
        "name": name,
        "kind": ModelKind.TRANSFORMER,
        "format": ModelFormat.ONNX,
        "files": {
            "graph": FileEntry(path=GRAPH),
            "config": FileEntry(path=CONFIG),
            "vocab": FileEntry(path=VOCAB),
        },
        "architecture": architecture(config, str(folder / CONFIG)),
    }


def _with_checksums(folder: Path, manifest: ModelManifest) -> ModelManifest:
    files = {
        key: FileEntry(path=entry.path, sha256=sha256_of(folder / entry.path))
        for key, entry in manifest.files.items()
    }
    return manifest.model_copy(update={"files": files})
