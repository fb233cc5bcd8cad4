"""A transformers causal LM -> a served model folder: the graph with past key values, the
model's config and tokens, and the manifest with its parity figures.

    parity = write_transformer_folder(model, out, name="my-gpt2", tokenizer_json=path, ...)

The folder is written as every export writes one (`lmserve.export.served_folder`): staged
beside `out` and moved into place only after the graph passed its parity check against the
model (`lmserve.export.parity.ParityError` otherwise), so a failed export never leaves a
half-written model where a server would load it.

By default the graph is rewritten by ONNX Runtime's transformer optimizer (`hf.optimize`: fused
layer norms, GELU, ...) before that check, so the parity recorded is the optimized graph's, and
the manifest's `optimization` says what was fused; `optimize=False` keeps the graph as exported.

GPT-2 and Llama checkpoints (`fused_graph.supports_fused`) get the shared-buffer graph instead
(`shared_cache`, the default): written from the weights on ONNX Runtime's fused ops, its cache
appended in place (`architecture.kv_cache: shared_buffer` in the manifest), checked the way
the server reads it (`fused_parity`). `shared_cache=False` keeps optimum's layout.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lmserve.export.hf.fused_graph import fused_decoder, supports_fused
from lmserve.export.hf.fused_parity import check_fused_parity
from lmserve.export.hf.graph import export_with_past
from lmserve.export.hf.optimize import optimize_graph
from lmserve.export.hf.parity import Parity, check_parity
from lmserve.export.parity import ParityError
from lmserve.export.quantize import Quantize
from lmserve.export.served_folder import Files, write_served_folder
from lmserve.server.backends.fused_transformer import SHARED_BUFFER
from lmserve.server.backends.transformer import CacheShape
from lmserve.server.families.hf_folder import (
    CONFIG,
    GRAPH,
    TOKENIZER,
    architecture,
    pretrained_manifest,
)
from lmserve.server.manifest import (
    FileEntry,
    GraphOptimization,
    ModelFormat,
    ModelKind,
    ModelManifest,
    Provenance,
    SpecialTokensSpec,
    TokenizerSpec,
)

VOCAB = "vocab.txt"


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
    overwrite: bool = False,
    quantize: Quantize | None = None,
    optimize: bool = True,
    shared_cache: bool = True,
) -> Parity:
    """Writes the folder for `model` (a transformers causal LM) into `out`
    (`write_served_folder`: `overwrite` replaces a model folder there, nothing else); with
    `optimize`, the graph as ONNX Runtime's transformer optimizer rewrites it (see the module
    doc), checked after the rewrite.

    Its tokens are either a Hugging Face `tokenizer_json` (served as it is) or, for a model
    trained here on words, `vocab_words` with the word `tokenizer` and `special_tokens`.
    """
    import onnxruntime as ort  # type: ignore[import-untyped,unused-ignore]

    if (tokenizer_json is None) == (vocab_words is None):
        raise ValueError("give a tokenizer.json or a word vocabulary, not both")
    model = model.eval()
    config = model.config.to_dict()
    cache = CacheShape.from_config(config, "config.json")
    optimized: list[GraphOptimization] = []  # what write() fused, for manifest()
    # float16 (`--quantize float16`) keeps optimum's layout: this graph's cache is float32.
    half = quantize is not None and quantize.method == "float16"
    shared = shared_cache and not half and supports_fused(model) is None

    def write(staging: Path) -> Files:
        if shared:
            import onnx

            onnx.save_model(fused_decoder(model), str(staging / GRAPH))
        else:
            export_with_past(model, cache, staging / GRAPH)
        fused = optimize_graph(staging / GRAPH, config) if optimize and not shared else None
        optimized[:] = [fused] if fused is not None else []
        (staging / CONFIG).write_text(json.dumps(config, indent=2), encoding="utf-8")
        if tokenizer_json is not None:
            shutil.copyfile(tokenizer_json, staging / TOKENIZER)
            return {"graph": GRAPH, "config": CONFIG, "tokenizer": TOKENIZER}
        assert vocab_words is not None
        (staging / VOCAB).write_text("".join(f"{w}\n" for w in vocab_words), "utf-8")
        return {"graph": GRAPH, "config": CONFIG, "vocab": VOCAB}

    def check(staging: Path) -> Parity:
        if shared:
            return check_fused_parity(model, staging / GRAPH, cache, sample_ids).require()
        session = ort.InferenceSession(str(staging / GRAPH), providers=["CPUExecutionProvider"])
        try:
            return check_parity(model, session, cache, sample_ids).require()
        except ParityError as exc:
            if not optimized:
                raise
            raise ParityError(
                f"{exc} (after ONNX Runtime's fusions; --no-optimize writes the graph as exported)"
            ) from exc

    def marked(arch: dict[str, Any]) -> dict[str, Any]:
        return {**arch, "kv_cache": SHARED_BUFFER} if shared else arch

    def manifest(staging: Path, files: Files, parity: Parity) -> ModelManifest:
        stamped = provenance.model_copy(update={"parity": parity.as_provenance()})
        if tokenizer_json is not None:
            described = pretrained_manifest(
                staging, name=name, provenance=stamped, description=description
            )
            return described.model_copy(
                update={
                    "optimization": next(iter(optimized), None),
                    "architecture": marked(described.architecture),
                }
            )
        fields = _word_manifest_fields(staging, name, config)
        fields["architecture"] = marked(fields["architecture"])
        return ModelManifest(
            **fields,
            description=description,
            tokenizer=tokenizer or TokenizerSpec(),
            special_tokens=special_tokens or SpecialTokensSpec(),
            provenance=stamped,
            optimization=next(iter(optimized), None),
        )

    written = write_served_folder(
        out, write=write, check=check, manifest=manifest, overwrite=overwrite, quantize=quantize
    )
    return written.parity


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
