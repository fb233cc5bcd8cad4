"""Imports a script of `bench/` by its path, for the tests of the generators that live there
(bench/ is not a package: its scripts import each other as top-level modules)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[1] / "bench"


def load_bench_module(relative: str) -> ModuleType:
    """`bench/<relative>` as a module named after its file (registered in sys.modules)."""
    path = BENCH / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module
