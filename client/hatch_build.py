"""Hatchling build hook of lmserve-client: puts the generated stubs into the wheel.

The stubs stay where `make proto` writes them (`proto/lmserve/v1/`, beside the .proto), outside
this distribution's folder; the wheel carries them as `lmserve/v1/`. The editable install
takes none (its `dev-mode-dirs` put `../proto` on sys.path instead), so a regenerated stub is
never shadowed by a stale copy. A wheel built from the sdist finds them already in `lmserve/v1`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

STUB_SUFFIXES = {".py", ".pyi", ".proto", ".typed"}


def stub_files(root: Path) -> dict[str, str]:
    """Source path -> path inside the distribution, for every stub file in ../proto/lmserve/v1."""
    stubs = root.parent / "proto" / "lmserve" / "v1"
    if not stubs.is_dir():
        return {}
    return {
        str(path): f"lmserve/v1/{path.name}"
        for path in sorted(stubs.iterdir())
        if path.is_file() and path.suffix in STUB_SUFFIXES
    }


class CustomBuildHook(BuildHookInterface):  # type: ignore[type-arg]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name == "wheel" and version == "editable":
            return
        build_data["force_include"].update(stub_files(Path(self.root)))
