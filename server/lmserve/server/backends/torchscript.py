"""Recurrent models exported to TorchScript (`model.ts`), run by torch on the CPU.

    backend = TorchScriptBackend.load(folder, manifest, max_chunk_tokens=256)

The module has `step(tokens, h, c)` and `score(tokens, targets, h, c)` returning (log-probs or
gathered log-probs, h_out, c_out); `c` is an empty tensor for RNN/GRU. A model brought from
outside (`architecture.states` listed, see `lmserve.export.custom`) takes and returns its states
one argument each instead: `step(tokens, *states) -> (log_probs, *states)`. torch is imported here
only, when such a model loads, so an ONNX-only deployment runs without it. TorchScript is
deprecated in torch 2.13 (torch.export replaces it); its load warning is silenced, nothing else.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from lmserve.server.backends.recurrent import (
    RecurrentBackend,
    RecurrentSpec,
    RecurrentState,
    TokenArray,
    read_vocab,
)
from lmserve.server.errors import ModelLoadError
from lmserve.server.manifest import ModelManifest


class TorchScriptBackend(RecurrentBackend):
    """A recurrent LM served by a TorchScript module; no state of its own between calls."""

    def __init__(self, spec: RecurrentSpec, vocab: Any, module: Any, max_chunk_tokens: int):
        super().__init__(spec, vocab, max_chunk_tokens=max_chunk_tokens)
        import torch

        self._torch = torch
        self._module = module
        self._lstm = spec.cell == "lstm"
        self._no_c = torch.empty(0)
        self._flat_states = spec.brought

    @classmethod
    def load(
        cls, folder: Path, manifest: ModelManifest, *, max_chunk_tokens: int
    ) -> TorchScriptBackend:
        spec = RecurrentSpec.from_architecture(manifest.architecture, str(folder / "model.yaml"))
        vocab = read_vocab(manifest.file_path(folder, "vocab"), spec, manifest.special_tokens)
        path = manifest.file_path(folder, "model")
        try:
            import torch
        except ImportError as exc:
            raise ModelLoadError(str(path), "TorchScript models need torch installed") from exc
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings(
                    "ignore",
                    message=r"`torch\.jit\.load` is deprecated",
                    category=DeprecationWarning,
                )
                module = torch.jit.load(str(path), map_location="cpu")
        except Exception as exc:
            raise ModelLoadError(str(path), "torch cannot load it", f"{exc}") from exc
        module.eval()
        for method in ("step", "score"):
            if not hasattr(module, method):
                raise ModelLoadError(str(path), f"the module has no {method}() method")
        backend = cls(spec, vocab, module, max_chunk_tokens)
        backend._check_vocab_size(path)
        return backend

    def _check_vocab_size(self, path: Path) -> None:
        try:
            log_probs, _ = self._run_step(np.zeros((1, 1), dtype=np.int64), self.initial_state(1))
        except Exception as exc:
            raise ModelLoadError(str(path), "step() fails on one token", f"{exc}") from exc
        if log_probs.shape[-1] != self.spec.vocab_size:
            raise ModelLoadError(
                str(path),
                f"step() gives {log_probs.shape[-1]} log-probs, vocab_size is "
                f"{self.spec.vocab_size}",
            )

    def _state_args(self, state: RecurrentState) -> tuple[Any, Any]:
        from_numpy = self._torch.from_numpy
        h = from_numpy(np.ascontiguousarray(state[0]))
        c = from_numpy(np.ascontiguousarray(state[1])) if self._lstm else self._no_c
        return h, c

    def _state_out(self, h: Any, c: Any) -> RecurrentState:
        if self._lstm:
            return (h.numpy(), c.numpy())
        return (h.numpy(),)

    def _run_step(
        self, tokens: TokenArray, state: RecurrentState
    ) -> tuple[npt.NDArray[np.float32], RecurrentState]:
        if self._flat_states:
            return self._run_flat(self._module.step, (tokens,), state)
        with self._torch.inference_mode():
            lp, h, c = self._module.step(self._torch.from_numpy(tokens), *self._state_args(state))
        return lp.numpy(), self._state_out(h, c)

    def _run_score(
        self, tokens: TokenArray, targets: TokenArray, state: RecurrentState
    ) -> tuple[npt.NDArray[np.float32], RecurrentState]:
        if self._flat_states:
            return self._run_flat(self._module.score, (tokens, targets), state)
        torch = self._torch
        with torch.inference_mode():
            lp, h, c = self._module.score(
                torch.from_numpy(tokens), torch.from_numpy(targets), *self._state_args(state)
            )
        return lp.numpy(), self._state_out(h, c)

    def _run_flat(
        self, method: Any, inputs: tuple[TokenArray, ...], state: RecurrentState
    ) -> tuple[npt.NDArray[np.float32], RecurrentState]:
        """A brought model's method: every state its own argument and its own result."""
        from_numpy = self._torch.from_numpy
        args = [from_numpy(a) for a in inputs]
        args += [from_numpy(np.ascontiguousarray(s)) for s in state]
        with self._torch.inference_mode():
            lp, *new_state = method(*args)
        return lp.numpy(), tuple(s.numpy() for s in new_state)
