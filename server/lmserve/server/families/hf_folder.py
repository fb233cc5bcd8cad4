"""The manifest of a transformer folder in Hugging Face's layout: what `lmserve import-hf`
writes, and what a folder `optimum-cli export onnx --task text-generation-with-past` wrote
is read as (it has no model.yaml: `config.json`, `tokenizer.json` and `model.onnx` say it all).

The special tokens come from config.json's `bos_token_id` / `eos_token_id` (a GPT-2 uses one
token for both), else from `tokenizer_config.json`; the unknown token from the tokenizer model
(byte-level tokenizers have none: every text encodes).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from lmserve.server.backends.transformer import CacheShape
from lmserve.server.errors import ManifestError
from lmserve.server.manifest import (
    FileEntry,
    ModelFormat,
    ModelKind,
    ModelManifest,
    Provenance,
    SpecialTokensSpec,
    TokenizerKind,
    TokenizerSpec,
    read_json_object,
    validation_problems,
)

GRAPH = "model.onnx"
CONFIG = "config.json"
TOKENIZER = "tokenizer.json"


def is_optimum_folder(folder: Path) -> bool:
    """A folder an ONNX export of a causal LM left: a graph, its config and its tokenizer."""
    return all((folder / name).is_file() for name in (GRAPH, CONFIG, TOKENIZER))


def _token_name(entry: Any) -> str | None:
    """tokenizer_config.json writes a token as a string or as {"content": ...}."""
    if isinstance(entry, dict):
        entry = entry.get("content")
    return entry if isinstance(entry, str) else None


def special_tokens(folder: Path, config: dict[str, Any]) -> SpecialTokensSpec:
    """bos/eos/unk as token strings (see the module doc); refused when the folder names none."""
    tokenizer = read_json_object(folder / TOKENIZER)
    by_id: dict[int, str] = {}
    model = tokenizer.get("model") or {}
    vocab = model.get("vocab") if isinstance(model, dict) else None
    if isinstance(vocab, dict):
        by_id.update({int(i): str(t) for t, i in vocab.items() if isinstance(i, int)})
    for added in tokenizer.get("added_tokens") or []:
        if isinstance(added, dict) and isinstance(added.get("id"), int):
            by_id[added["id"]] = str(added.get("content"))
    extra_path = folder / "tokenizer_config.json"
    extra = read_json_object(extra_path) if extra_path.is_file() else {}

    def named(role: str) -> str | None:
        token_id = config.get(f"{role}_token_id")
        if isinstance(token_id, list) and token_id:
            token_id = token_id[0]
        if isinstance(token_id, int) and token_id in by_id:
            return by_id[token_id]
        return _token_name(extra.get(f"{role}_token"))

    bos, eos = named("bos"), named("eos")
    if bos is None and eos is None:
        raise ManifestError(
            str(folder / CONFIG),
            "names no bos_token_id or eos_token_id (nor does tokenizer_config.json): "
            "the server cannot tell where a text starts and ends",
        )
    bos = bos or eos
    eos = eos or bos
    assert bos is not None and eos is not None
    unk = model.get("unk_token") if isinstance(model, dict) else None
    if not isinstance(unk, str) or unk not in by_id.values():
        unk = _token_name(extra.get("unk_token"))
    known = unk if isinstance(unk, str) and unk in by_id.values() else eos
    return SpecialTokensSpec(bos=bos, eos=eos, unk=known)


def architecture(config: dict[str, Any], where: str) -> dict[str, Any]:
    """What GetModel reports of a transformer, from its config.json."""
    try:
        cache = CacheShape.from_config(config, where)
    except Exception as exc:  # ModelLoadError: a key the config lacks
        raise ManifestError(where, f"{exc}") from exc
    names = config.get("architectures") or [config.get("model_type", "unknown")]
    return {
        "architecture": str(names[0]),
        "vocab_size": int(config.get("vocab_size") or 0),
        "hidden_size": int(config.get("hidden_size") or config.get("n_embd") or 0),
        "num_layers": cache.layers,
        "kv_heads": cache.kv_heads,
        "head_dim": cache.head_dim,
        "max_positions": cache.max_positions,
        "cache_bytes_per_position": cache.bytes_per_position(),
    }


def pretrained_manifest(
    folder: Path,
    *,
    name: str,
    files: dict[str, FileEntry] | None = None,
    provenance: Provenance | None = None,
    description: str = "",
) -> ModelManifest:
    """The manifest of a transformer folder with a Hugging Face tokenizer (see the module doc)."""
    config = read_json_object(folder / CONFIG)
    listed = files or {
        "graph": FileEntry(path=GRAPH),
        "config": FileEntry(path=CONFIG),
        "tokenizer": FileEntry(path=TOKENIZER),
    }
    if files is None and (folder / f"{GRAPH}_data").is_file():  # weights beside the graph
        listed["graph_data"] = FileEntry(path=f"{GRAPH}_data")
    return ModelManifest(
        name=name,
        kind=ModelKind.TRANSFORMER,
        format=ModelFormat.ONNX,
        description=description,
        files=listed,
        tokenizer=TokenizerSpec(kind=TokenizerKind.HUGGINGFACE, file="tokenizer"),
        special_tokens=special_tokens(folder, config),
        architecture=architecture(config, str(folder / CONFIG)),
        provenance=provenance or Provenance(source=f"optimum ONNX export ({folder.name})"),
    )


def optimum_manifest(folder: Path) -> ModelManifest:
    """The manifest of a folder an optimum export wrote (no model.yaml), named after the
    folder."""
    try:
        return pretrained_manifest(folder, name=folder.name)
    except ValidationError as exc:
        raise ManifestError(
            str(folder / CONFIG), f"cannot serve this folder: {validation_problems(exc)}"
        ) from exc
