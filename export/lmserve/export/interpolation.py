"""Tuning interpolation weights by EM and writing the interpolated model's folder.

components = load_components(Path("models"), ["kjv-lstm", "kjv-5gram"])
lp = component_log_probs(components, lines)          # [components, tokens], natural logs
weights, rounds = em_weights(lp)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from lmserve.server.backends.base import LanguageModelBackend
from lmserve.server.backends.interpolated import InterpolatedBackend
from lmserve.server.errors import ModelLoadError
from lmserve.server.manifest import ModelManifest, read_manifest, write_manifest
from lmserve.server.registry.repository import LoadOptions, ModelState, load_entry
from lmserve.server.text.word import TextEncoder, WordTokenizer

LogProbs = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Components:
    """The loaded components, their names and manifests, and the mixture that maps vocabularies."""

    names: list[str]
    manifests: list[ModelManifest]
    mixture: InterpolatedBackend
    encoder: TextEncoder


def load_components(repository: Path, names: Sequence[str]) -> Components:
    """Loads the named models (folders whose manifest carries that name); same tokenizer."""
    folders = {}
    for folder in sorted(p for p in repository.iterdir() if p.is_dir()):
        try:
            folders[read_manifest(folder).name] = folder
        except ModelLoadError:
            continue
    backends: list[LanguageModelBackend] = []
    manifests: list[ModelManifest] = []
    for name in names:
        if name not in folders:
            raise ModelLoadError(str(repository), f"no model named {name!r}")
        entry = load_entry(folders[name], LoadOptions())
        if entry.state is not ModelState.READY or entry.backend is None:
            raise ModelLoadError(str(folders[name]), entry.load_error)
        assert entry.manifest is not None
        if manifests and entry.manifest.tokenizer != manifests[0].tokenizer:
            raise ModelLoadError(
                str(folders[name]), f"{name!r} has another tokenizer than {names[0]!r}"
            )
        backends.append(entry.backend)
        manifests.append(entry.manifest)
    share = 1.0 / len(backends)
    mixture = InterpolatedBackend([(b, share) for b in backends])
    spec = manifests[0].tokenizer
    encoder = TextEncoder(
        WordTokenizer(lowercase=spec.lowercase, pattern=spec.pattern), mixture.vocab
    )
    return Components(list(names), manifests, mixture, encoder)


def component_log_probs(
    components: Components, lines: Sequence[str], batch_lines: int = 128
) -> LogProbs:
    """log P_i(token) for every scored token (words and one `</s>` a line): [components, N]."""
    columns: list[list[LogProbs]] = [[] for _ in components.names]
    for start in range(0, len(lines), batch_lines):
        batch = components.encoder.encode_texts(lines[start : start + batch_lines])
        for k, backend in enumerate(components.mixture.components):
            scores = backend.score(components.mixture.component_batch(batch, k), per_token=True)
            assert scores.token_log_probs is not None
            columns[k].append(scores.token_log_probs)
    return np.stack([np.concatenate(c) for c in columns])


def em_weights(
    log_probs: LogProbs, max_iterations: int = 100, tol: float = 1e-7
) -> tuple[LogProbs, int]:
    """Weights maximising sum_t log sum_i w_i P_i(t), by EM from uniform; (weights, rounds)."""
    k = log_probs.shape[0]
    weights = np.full(k, 1.0 / k)
    for rounds in range(1, max_iterations + 1):
        joint = log_probs + np.log(np.maximum(weights, 1e-300))[:, None]
        posterior = np.exp(joint - np.logaddexp.reduce(joint, axis=0))
        updated = posterior.mean(axis=1)
        if np.abs(updated - weights).max() < tol:
            return updated / updated.sum(), rounds
        weights = updated
    return weights / weights.sum(), max_iterations


def mixture_perplexity(log_probs: LogProbs, weights: LogProbs) -> float:
    """exp(-mean_t log sum_i w_i P_i(t)): natural logs, every scored token counted."""
    with np.errstate(divide="ignore"):
        joint = log_probs + np.log(weights)[:, None]
    return float(np.exp(-np.logaddexp.reduce(joint, axis=0).mean()))


def write_interpolated_folder(
    folder: Path,
    name: str,
    components: Components,
    weights: LogProbs,
    metrics: dict[str, float],
    *,
    corpus: str,
    command: str = "lmserve interpolate",
) -> ModelManifest:
    first = components.manifests[0]
    values = [float(w) for w in weights]
    values[-1] = 1.0 - sum(values[:-1])  # exactly 1 in total, for the loader's check
    parts = [{"model": n, "weight": w} for n, w in zip(components.names, values, strict=True)]
    manifest = ModelManifest.model_validate(
        {
            "name": name,
            "kind": "interpolated",
            "format": "interpolation",
            "description": "linear interpolation of " + " + ".join(components.names),
            "files": {},
            "tokenizer": first.tokenizer.model_dump(),
            "special_tokens": first.special_tokens.model_dump(),
            "architecture": {"components": parts, "tuning": "EM on held-out per-token probs"},
            "provenance": {
                "training_corpus": corpus,
                "trained_by": command,
                "metrics": metrics,
            },
        }
    )
    folder.mkdir(parents=True, exist_ok=True)
    write_manifest(folder, manifest)
    return manifest
