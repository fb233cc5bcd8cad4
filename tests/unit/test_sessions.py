"""Autocomplete session cache bounds, and batched session steps equal to stepping alone."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
from neural_folders import VOCAB, tiny_model, write_onnx_folder

from lmserve.server.backends.onnx import OnnxOptions
from lmserve.server.families.catalog import make_stepper
from lmserve.server.families.family import LoadContext
from lmserve.server.families.loading import load_backend
from lmserve.server.manifest import read_manifest
from lmserve.server.settings import SessionSettings
from lmserve.server.shared.stats import EngineStats
from lmserve.server.worker.autocomplete.session_steps import SessionSteps
from lmserve.server.worker.autocomplete.sessions import Session, SessionCache, SessionLimits


def _session(name: str, floats: int = 0) -> Session:
    session = Session(name)
    session.log_probs = np.zeros(floats, dtype=np.float32)
    return session


def test_least_recently_used_sessions_go_first_past_the_count() -> None:
    stats = EngineStats("m")
    cache = SessionCache("m", SessionLimits.of(SessionSettings(complete_max_sessions=2)), stats)
    for name in ("a", "b"):
        cache.put(_session(name))
    assert cache.get("a") is not None  # a is now the most recently used
    cache.put(_session("c"))
    assert cache.get("b") is None and cache.get("a") is not None and cache.get("c") is not None
    assert stats.sessions_active == 2
    assert stats.session_events == {"hit": 3, "miss": 1, "evicted": 1}


def test_sessions_past_the_memory_bound_are_evicted() -> None:
    cache = SessionCache("m", replace(SessionLimits.of(SessionSettings()), max_bytes=10_000))
    for name in ("a", "b", "c"):
        cache.put(_session(name, floats=1000))  # 4,000 bytes each
    assert len(cache) == 2 and cache.get("a") is None


def test_idle_sessions_expire() -> None:
    cache = SessionCache("m", SessionLimits.of(SessionSettings(complete_session_idle_seconds=0.05)))
    cache.put(_session("a"))
    time.sleep(0.08)
    assert cache.get("a") is None and len(cache) == 0


def test_sessions_typing_at_once_share_steps_and_match_stepping_alone(tmp_path: Path) -> None:
    folder = tmp_path / "lstm"
    write_onnx_folder(tiny_model("lstm"), VOCAB, folder, name="lstm")
    backend = load_backend(folder, read_manifest(folder), LoadContext(OnnxOptions()))
    stepper = make_stepper(backend)
    rng = np.random.default_rng(2)
    appends = [
        rng.integers(3, len(VOCAB), size=int(rng.integers(1, 5))).tolist() for _ in range(12)
    ]

    async def main() -> tuple[list[np.ndarray], int]:
        steps = SessionSteps("lstm", stepper)
        try:
            start = await steps.rebuild([])
            calls_before = steps.calls
            done = await asyncio.gather(
                *(steps.advance(start.states[-1], tokens) for tokens in appends)
            )
            return [d.log_probs for d in done], steps.calls - calls_before
        finally:
            steps.close()

    outputs, calls = asyncio.run(main())
    assert calls <= max(len(a) for a in appends) + 1  # far fewer than one call per token
    for tokens, got in zip(appends, outputs, strict=True):
        expected, _ = stepper.prefill([tokens])
        np.testing.assert_allclose(got, expected[0], atol=1e-4)
